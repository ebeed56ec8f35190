//! A pod reaches only what is its own (fake apiserver + cocoon-sim + default policies): a pod of
//! another tenant that names a victim's VM — by name, by a copied id, id prefix or guest
//! address, as a fork source, as the image to clone — is refused with `VMOwnedByAnotherPod`,
//! boots nothing, and deleting it touches nothing of the victim; the holders survive a restart.
//! (The same attacks through kubectl on the real apiserver: `tests/real_apiserver/tenancy.rs`.)

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::provider_support::*;

const IMAGE: &str = "cocoonset.cocoonstack.io/image";
const OTHER: &str = "other";
const OWNED: &str = "VMOwnedByAnotherPod";

/// The victim: `default/web-0` with VM `vm-web`, up.
async fn victim(env: &Env) -> vk_cocoon::runtime::VmRecord {
    create(env, &managed("web-0", "vm-web", &[(IMAGE, "base")])).await;
    eventually(60, "web-0 ready", || {
        lifecycle(env, "web-0").as_deref() == Some("ready") && ready(env, "web-0")
    })
    .await;
    vm_named(env, "vm-web").await.expect("the victim's VM")
}

/// The daemon, started once the victim's `base` snapshot is seeded. Seeding boots a throwaway
/// VM behind the daemon's back, and a daemon whose startup reconcile lists that VM destroys
/// it as an orphan (the default policy), before its snapshot is saved.
async fn start_seeded(env: &Env) -> Daemon {
    seed_snapshot(env, "base", "ghcr.io/x/base:1").await;
    start(env, Options::default())
}

/// The victim hibernates its guest, as the operator asks it to.
async fn hibernate_victim(env: &Env) {
    annotate(env, "web-0", &[("vm.cocoonstack.io/hibernate", Some("true"))]).await;
    eventually(60, "web-0 hibernated", || {
        lifecycle(env, "web-0").as_deref() == Some("hibernated")
    })
    .await;
}

/// Pod `name` of namespace `other` with `annotations`.
fn tenant_pod(name: &str, annotations: &[(&str, &str)]) -> Pod {
    let mut pod = agent_pod(name, annotations);
    pod.metadata.namespace = Some(OTHER.into());
    pod
}

/// The tenant's pod `name` taking the victim's VM name and asking to restore its hibernated guest.
fn restore_of_the_victims_vm(name: &str) -> Pod {
    tenant_pod(
        name,
        &[
            ("vm.cocoonstack.io/name", "vm-web"),
            ("cocoonset.cocoonstack.io/managed", "true"),
            ("vm.cocoonstack.io/restore-from-hibernate", "true"),
            (IMAGE, "base"),
        ],
    )
}

fn tenant(env: &Env, name: &str) -> Option<Pod> {
    env.server.store().get_as::<Pod>(Some(OTHER), name)
}

/// Waits until the tenant's pod `name` was refused as reaching another pod's VM; its
/// lifecycle message.
async fn refused(env: &Env, name: &str) -> String {
    eventually(60, &format!("{name} refused with {OWNED}"), || {
        has_event(env, name, OWNED)
            && tenant(env, name).is_some_and(|p| {
                p.annotations()
                    .get("vm.cocoonstack.io/lifecycle-state")
                    .map(String::as_str)
                    == Some("failed")
            })
    })
    .await;
    tenant(env, name)
        .unwrap()
        .annotations()
        .get("vm.cocoonstack.io/lifecycle-state-message")
        .cloned()
        .unwrap_or_default()
}

/// The victim's VM is the one it booted, nothing was saved of it or removed.
async fn untouched(env: &Env, id: &str) {
    let named: Vec<String> = vms(env)
        .await
        .into_iter()
        .filter(|v| v.name() == "vm-web")
        .map(|v| v.id)
        .collect();
    assert_eq!(named, [id], "the victim's VM");
    for verb in ["vm rm", "snapshot save", "vm net"] {
        let touched: Vec<_> = calls(env, verb)
            .into_iter()
            .filter(|argv| argv.iter().any(|a| a == id || a.contains("vm-web")))
            .collect();
        assert!(touched.is_empty(), "cocoon {verb} touched the victim: {touched:?}");
    }
    assert!(ready(env, "web-0"), "the victim stays Ready");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pod_naming_another_pods_vm_is_refused_and_deleting_it_leaves_that_vm() {
    let env = env(false).await;
    let d = start_seeded(&env).await;
    let vm = victim(&env).await;
    // Another tenant, and a pod of the victim's own namespace: the VM is the victim pod's.
    create(
        &env,
        &tenant_pod(
            "evil-0",
            &[
                ("vm.cocoonstack.io/name", "vm-web"),
                ("cocoonset.cocoonstack.io/managed", "true"),
                (IMAGE, "base"),
            ],
        ),
    )
    .await;
    create(&env, &managed("same-ns-0", "vm-web", &[(IMAGE, "base")])).await;
    let message = refused(&env, "evil-0").await;
    assert!(message.contains("vm vm-web belongs to pod default/web-0"), "{message}");
    eventually(60, "same-ns-0 refused", || {
        has_event(&env, "same-ns-0", OWNED) && lifecycle(&env, "same-ns-0").as_deref() == Some("failed")
    })
    .await;
    assert_eq!(calls(&env, "vm clone").len(), 1, "nothing else booted");

    let pods: kube::Api<Pod> = kube::Api::namespaced(env.server.client(), OTHER);
    pods.delete("evil-0", &Default::default()).await.unwrap();
    delete(&env, "same-ns-0").await;
    eventually(60, "both deletes finished", || {
        tenant(&env, "evil-0").is_none() && get(&env, "same-ns-0").is_none()
    })
    .await;
    untouched(&env, &vm.id).await;
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fork_crosses_no_namespace_but_sub_agents_fork_their_main_agent() {
    let env = env(false).await;
    let d = start_seeded(&env).await;
    let vm = victim(&env).await;
    create(
        &env,
        &tenant_pod(
            "fork-0",
            &[
                ("vm.cocoonstack.io/name", "vm-stolen"),
                ("cocoonset.cocoonstack.io/managed", "true"),
                ("vm.cocoonstack.io/fork-from", "vm-web"),
            ],
        ),
    )
    .await;
    let message = refused(&env, "fork-0").await;
    assert!(message.contains("default/web-0"), "{message}");
    assert!(vm_named(&env, "vm-stolen").await.is_none());
    untouched(&env, &vm.id).await;

    // The operator's flow: a sub-agent of the same namespace forks its main agent.
    create(
        &env,
        &managed("web-1", "vm-web-1", &[("vm.cocoonstack.io/fork-from", "vm-web")]),
    )
    .await;
    eventually(60, "web-1 ready", || {
        lifecycle(&env, "web-1").as_deref() == Some("ready") && ready(&env, "web-1")
    })
    .await;
    assert!(vm_named(&env, "vm-web-1").await.is_some());
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unmanaged_pod_cannot_pre_assign_another_pods_vm_by_id_prefix_name_or_address() {
    let env = env(false).await;
    let d = start_seeded(&env).await;
    let vm = victim(&env).await;
    let ip = vm.primary_ip().unwrap().to_string();
    let cases = [
        ("by-id", vm.id.clone(), "10.9.9.9".to_string()),
        ("by-prefix", vm.id[..5].to_string(), "10.9.9.9".to_string()),
        ("by-name", "vm-web".to_string(), "10.9.9.9".to_string()),
        ("by-address", "qemu-elsewhere".to_string(), ip.clone()),
    ];
    for (name, id, address) in &cases {
        create(
            &env,
            &tenant_pod(
                name,
                &[
                    ("vm.cocoonstack.io/name", &format!("vm-{name}")),
                    ("vm.cocoonstack.io/id", id),
                    ("vm.cocoonstack.io/ip", address),
                ],
            ),
        )
        .await;
    }
    for (name, ..) in &cases {
        let message = refused(&env, name).await;
        assert!(message.contains("vm vm-web of pod default/web-0"), "{name}: {message}");
    }
    untouched(&env, &vm.id).await;
    // A VM of another node (nothing here has its id or address) is adopted as before.
    create(
        &env,
        &tenant_pod(
            "toolbox-0",
            &[
                ("vm.cocoonstack.io/name", "vm-toolbox"),
                ("vm.cocoonstack.io/id", "qemu-toolbox"),
                ("vm.cocoonstack.io/ip", "127.0.0.99"),
            ],
        ),
    )
    .await;
    eventually(60, "the toolbox adopted", || {
        tenant(&env, "toolbox-0").is_some_and(|p| {
            p.status
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
    })
    .await;
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn who_holds_a_vm_survives_a_restart_and_a_copied_id_claims_nothing() {
    let env = env(false).await;
    let d = start_seeded(&env).await;
    let vm = victim(&env).await;
    d.kill().await;
    // While the node is down a tenant copies the victim's runtime annotations onto pods of its
    // own: the id (with the victim's VM name, or its own), as a restart adopts by id first.
    for (name, vm_name) in [("copy-0", "vm-web"), ("copy-1", "vm-copy")] {
        create(
            &env,
            &tenant_pod(
                name,
                &[
                    ("vm.cocoonstack.io/name", vm_name),
                    ("cocoonset.cocoonstack.io/managed", "true"),
                    ("vm.cocoonstack.io/id", &vm.id),
                    (IMAGE, "base"),
                ],
            ),
        )
        .await;
    }
    let d = start(&env, Options::default());
    eventually(60, "the victim adopted again after the restart", || {
        d.provider.metrics().lifecycle_count("create", "ok", "adopted") >= 1 && ready(&env, "web-0")
    })
    .await;
    let message = refused(&env, "copy-0").await;
    assert!(message.contains("default/web-0"), "{message}");
    // copy-1 claims a name of its own: it gets a VM of its own (the copied id means nothing).
    eventually(60, "copy-1 booted a VM of its own", || {
        tenant(&env, "copy-1").is_some_and(|p| {
            p.annotations()
                .get("vm.cocoonstack.io/lifecycle-state")
                .map(String::as_str)
                == Some("ready")
        })
    })
    .await;
    let copy = vm_named(&env, "vm-copy").await.expect("copy-1's own VM");
    assert_ne!(copy.id, vm.id);
    untouched(&env, &vm.id).await;
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn another_namespaces_hibernated_guest_is_neither_cloned_nor_restored() {
    // Registry-less: the hibernated guest is the local snapshot named after its VM.
    let env = env(false).await;
    let d = start_seeded(&env).await;
    victim(&env).await;
    hibernate_victim(&env).await;
    assert!(
        env.runtime.snapshot_inspect("vm-web").await.is_ok(),
        "the guest's state"
    );
    let clones = calls(&env, "vm clone").len();
    // Its state as the image of a clone, and (with the victim's VM name) as a restore.
    create(
        &env,
        &tenant_pod(
            "clone-0",
            &[
                ("vm.cocoonstack.io/name", "vm-thief"),
                ("cocoonset.cocoonstack.io/managed", "true"),
                (IMAGE, "vm-web"),
            ],
        ),
    )
    .await;
    create(&env, &restore_of_the_victims_vm("wake-0")).await;
    refused(&env, "clone-0").await;
    refused(&env, "wake-0").await;
    assert_eq!(calls(&env, "vm clone").len(), clones, "nothing was cloned from it");
    assert!(
        env.runtime.snapshot_inspect("vm-web").await.is_ok(),
        "the guest's state is kept"
    );
    d.kill().await;
}

/// With a registry, a hibernated guest outlives its pod as `<vm>:hibernate`, and another node
/// holds no record of who the VM name belonged to. The push records the pod it came from, so a
/// pod of another namespace that takes the VM name (and asks to restore it) is refused instead
/// of waking the victim's guest, memory and all.
#[tokio::test(flavor = "multi_thread")]
async fn another_namespaces_pushed_guest_is_not_restored_on_a_node_that_never_held_it() {
    let env = env_with_oci().await;
    let d = start_seeded(&env).await;
    victim(&env).await;
    hibernate_victim(&env).await;
    let oci = env.oci.as_ref().unwrap();
    let artifact = match oci.client.manifest("vm-web", "hibernate").await.unwrap() {
        vk_cocoon::registry::ManifestLookup::Found(a) => a,
        vk_cocoon::registry::ManifestLookup::Absent => panic!("the guest is pushed"),
    };
    assert_eq!(
        artifact
            .annotations
            .get("cocoonstack.snapshot.owner")
            .map(String::as_str),
        Some("default/web-0"),
        "the push names the pod whose guest it holds"
    );
    delete(&env, "web-0").await;
    eventually(60, "web-0 gone", || get(&env, "web-0").is_none()).await;
    d.kill().await;

    // Another node: a fresh state directory (no holder records) and no local copy.
    env.runtime.snapshot_remove_if_exists("vm-web").await.unwrap();
    std::fs::remove_dir_all(env.sim_dir.path().join("vk-state")).unwrap();
    let d = start(&env, Options::default());
    create(&env, &restore_of_the_victims_vm("wake-0")).await;
    let message = refused(&env, "wake-0").await;
    assert!(message.contains("default/web-0"), "{message}");
    assert!(vm_named(&env, "vm-web").await.is_none(), "nothing was restored");
    assert!(
        calls(&env, "snapshot import").is_empty(),
        "nothing of the victim was pulled"
    );
    d.kill().await;
}
