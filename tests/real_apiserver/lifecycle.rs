//! CreatePod and DeletePod on the real server, `vk-cocoon run` under the `deploy/rbac.yaml`
//! identity: every bring-up path once, a pod with bad input, deletes with the snapshot policy
//! that finish with the object gone. (Real server: the annotation and status writes go through
//! real RBAC, validation and the pod status strategy; graceful deletion is the real
//! apiserver's, driven by `kubectl delete` as an operator would.)

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use vk_cocoon::registry::ManifestLookup;
use vk_cocoon::runtime::CocoonRuntime;

use crate::daemon::*;
use crate::kube_support;
use crate::provider_support::{clone_direct_on, seed_snapshot_on};

const CLONE_FROM_DIR: &str = "vm.cocoonstack.io/clone-from-dir";
const FORK_FROM: &str = "vm.cocoonstack.io/fork-from";

fn pod_ip(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.pod_ip.as_deref()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_bring_up_path_brings_its_pod_up() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace("bring-up").await;
    let machine = Machine::new("vk-bring-up").with_registry();
    seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
    // Below the node's export root (VK_CLONE_FROM_DIR_ROOTS, default <COCOON_ROOT_DIR>/exports).
    std::fs::create_dir_all(machine.dir.path().join("exports")).unwrap();
    let exported = machine.dir.path().join("exports/golden");
    machine.runtime.snapshot_export_to_dir("base", &exported).await.unwrap();
    let daemon = machine.start_daemon(cluster);
    machine.wait_registered(cluster).await;
    // A VM already running here under the name a pod will ask for (made after the startup
    // reconcile, which would have removed it as an orphan).
    let existing = clone_direct_on(&machine.runtime, "base", "vm-adopt", None).await;
    let clones_before = machine.calls("vm clone").len();

    let dir = exported.canonicalize().unwrap().display().to_string();
    let node = machine.node.as_str();
    let unmanaged = {
        let mut pod = managed_pod(&ns, node, "unmanaged-0", "vm-ext", &[]);
        let a = pod.metadata.annotations.as_mut().unwrap();
        a.remove("cocoonset.cocoonstack.io/managed");
        a.insert(VM_ID.into(), "ext-1".into());
        a.insert("vm.cocoonstack.io/ip".into(), "127.88.200.1".into());
        pod
    };
    for pod in [
        managed_pod(&ns, node, "clone-0", "vm-clone", &[(IMAGE, "base")]),
        managed_pod(
            &ns,
            node,
            "run-0",
            "vm-run",
            &[
                (IMAGE, "ghcr.io/x/ubuntu:24.04"),
                ("cocoonset.cocoonstack.io/mode", "run"),
            ],
        ),
        managed_pod(&ns, node, "dir-0", "vm-dir", &[(CLONE_FROM_DIR, &dir)]),
        managed_pod(&ns, node, "adopt-0", "vm-adopt", &[(IMAGE, "base")]),
        unmanaged,
    ] {
        create_pod(&admin, &pod).await;
    }
    let mut up = Vec::new();
    for name in ["clone-0", "run-0", "dir-0", "adopt-0", "unmanaged-0"] {
        up.push(wait_up(&admin, &ns, name).await);
    }
    // A fork of a running VM (its source must be up first).
    create_pod(
        &admin,
        &managed_pod(&ns, node, "fork-0", "vm-fork", &[(FORK_FROM, "vm-clone")]),
    )
    .await;
    up.push(wait_up(&admin, &ns, "fork-0").await);

    for (pod, vm) in up.iter().zip(["vm-clone", "vm-run", "vm-dir", "vm-adopt"]) {
        let vms = machine.vms_named(vm).await;
        assert_eq!(vms.len(), 1, "one VM {vm}: {vms:?}");
        assert_eq!(annotation(pod, VM_ID), Some(vms[0].id.as_str()), "{vm}");
        assert!(
            pod_ip(pod).is_some_and(|ip| ip.starts_with(&format!("{}.", machine.sim.subnet()))),
            "{vm}: {:?}",
            pod.status
        );
    }
    let clones = machine.calls("vm clone")[clones_before..].to_vec();
    assert!(
        clones
            .iter()
            .any(|c| c.contains("--name vm-clone") && c.ends_with(" base")),
        "clone from the local snapshot: {clones:?}"
    );
    assert!(
        clones
            .iter()
            .any(|c| c.contains("--name vm-dir") && c.contains(&format!("--from-dir {dir}"))),
        "clone from the exported directory: {clones:?}"
    );
    assert!(
        clones
            .iter()
            .any(|c| c.contains("--name vm-fork") && c.ends_with(" fork-vm-clone")),
        "fork through the source's fork snapshot: {clones:?}"
    );
    // The VM was made behind the daemon's back, so its table does not know it: the create's
    // clone is refused by cocoon (a second VM of a name never exists), and the create then asks
    // and adopts the VM that is there.
    assert!(
        clones.iter().filter(|c| c.contains("--name vm-adopt ")).count() <= 1,
        "at most the one refused clone: {clones:?}"
    );
    assert_eq!(
        annotation(&up[3], VM_ID),
        Some(existing.id.as_str()),
        "the existing VM is adopted"
    );
    let runs = machine.calls("vm run");
    assert!(
        runs.iter()
            .any(|r| r.contains("--name vm-run") && r.contains("ghcr.io/x/ubuntu:24.04")),
        "{runs:?}"
    );
    assert_eq!(machine.vms_named("vm-fork").await.len(), 1);
    // The unmanaged pod is adopted with the operator's runtime: cocoon is not asked.
    assert_eq!(pod_ip(&up[4]), Some("127.88.200.1"));
    assert!(machine.vms_named("vm-ext").await.is_empty());
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_with_bad_input_gets_a_warning_event_and_a_failed_lifecycle_and_no_vm() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace("bad-input").await;
    let machine = Machine::new("vk-bad-input");
    let _daemon = machine.start_daemon(cluster);
    machine.wait_registered(cluster).await;

    let mut noname = managed_pod(&ns, &machine.node, "noname", "unused", &[]);
    noname
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove("vm.cocoonstack.io/name");
    create_pod(&admin, &noname).await;
    create_pod(
        &admin,
        &managed_pod(
            &ns,
            &machine.node,
            "reldir",
            "vm-reldir",
            &[(CLONE_FROM_DIR, "exports/x")],
        ),
    )
    .await;

    for (name, reason, says) in [
        ("noname", "MissingVMName", "missing vm.cocoonstack.io/name"),
        ("reldir", "InvalidVMSpec", "absolute"),
    ] {
        let pod = wait_pod(&admin, &ns, name, 60, "lifecycle failed and phase Failed", |p| {
            p.is_some_and(|p| {
                lifecycle(p) == Some("failed") && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
            })
        })
        .await
        .unwrap();
        let message = annotation(&pod, LIFECYCLE_MESSAGE).unwrap_or_default();
        assert!(message.contains(says), "{name}: {message}");
        let ns = ns.clone();
        let admin = admin.clone();
        eventually(30, &format!("a Warning {reason} Event about {name}"), move || {
            let (admin, ns) = (admin.clone(), ns.clone());
            async move {
                events_about(&admin, &ns, name)
                    .await
                    .iter()
                    .any(|(kind, r, _)| kind == "Warning" && r == reason)
            }
        })
        .await;
    }
    assert!(machine.vms().await.is_empty(), "nothing booted");
    assert!(machine.calls("vm clone").is_empty() && machine.calls("vm run").is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_graceful_delete_snapshots_per_policy_and_finishes_with_the_object_gone() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace("delete").await;
    let machine = Machine::new("vk-delete").with_registry();
    seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
    let _daemon = machine.start_daemon(cluster);
    let node = machine.node.as_str();
    create_pod(
        &admin,
        &managed_pod(&ns, node, "saved-0", "vm-saved", &[(IMAGE, "base")]),
    )
    .await;
    create_pod(
        &admin,
        &managed_pod(
            &ns,
            node,
            "never-0",
            "vm-never",
            &[(IMAGE, "base"), ("cocoonset.cocoonstack.io/snapshot-policy", "never")],
        ),
    )
    .await;
    wait_up(&admin, &ns, "saved-0").await;
    wait_up(&admin, &ns, "never-0").await;

    // As an operator deletes: the default grace period, and kubectl waits until the object is gone.
    cluster
        .kubectl_checked(&["delete", "pod", "saved-0", "never-0", "-n", &ns, "--timeout=120s"])
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    for name in ["saved-0", "never-0"] {
        assert!(pods.get_opt(name).await.unwrap().is_none(), "{name} is gone");
    }
    assert!(machine.vms().await.is_empty(), "both VMs removed");
    let registry = machine.registry_client();
    match registry.manifest("vm-saved", "latest").await.unwrap() {
        ManifestLookup::Found(artifact) => assert_eq!(
            artifact.annotations["cocoonstack.snapshot.baseimage"], "base",
            "the default policy saved and pushed the guest before removing it"
        ),
        ManifestLookup::Absent => panic!("vm-saved:latest was not pushed"),
    }
    assert!(
        matches!(
            registry.manifest("vm-never", "latest").await.unwrap(),
            ManifestLookup::Absent
        ),
        "snapshot-policy never: nothing pushed"
    );
    let saves = machine.calls("snapshot save");
    assert!(!saves.iter().any(|s| s.contains("vm-never")), "{saves:?}");
    assert!(
        machine
            .runtime
            .snapshot_inspect("vm-saved")
            .await
            .unwrap_err()
            .is_not_found(),
        "the local snapshot goes with the pod"
    );
}
