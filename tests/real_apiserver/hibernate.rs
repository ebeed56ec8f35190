//! Hibernate and wake on the real server, over a real registry (Debian's docker-registry on
//! loopback), `vk-cocoon run` under the `deploy/rbac.yaml` identity: `kubectl annotate` hibernates
//! the guest into `<vm>:hibernate` and wakes it from there; after the pod is deleted, a new pod
//! for the same VM restores the hibernated guest instead of booting it fresh. (Real server: the
//! operator's annotation edits, the daemon's uid-conditioned annotation and status patches and
//! the Events all go through the real API.)

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use vk_cocoon::registry::ManifestLookup;
use vk_cocoon::runtime::CocoonRuntime;

use crate::daemon::*;
use crate::kube_support;
use crate::provider_support::seed_snapshot_on;

pub const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";

/// Waits until the pod's lifecycle says `state`.
pub async fn wait_lifecycle(client: &kube::Client, ns: &str, name: &str, state: &str) -> Pod {
    wait_pod(client, ns, name, 90, &format!("lifecycle {state}"), |p| {
        p.is_some_and(|p| lifecycle(p) == Some(state))
    })
    .await
    .expect("the pod exists")
}

/// Waits for an Event `reason` about the pod whose note contains `note`.
pub async fn wait_event(client: &kube::Client, ns: &str, pod: &str, reason: &str, note: &str) {
    eventually(30, &format!("Event {reason} ({note}) about {pod}"), || async {
        events_about(client, ns, pod)
            .await
            .iter()
            .any(|(_, r, n)| r == reason && n.contains(note))
    })
    .await;
}

pub async fn tag_exists(machine: &Machine, vm: &str) -> bool {
    matches!(
        machine.registry_client().manifest(vm, "hibernate").await.unwrap(),
        ManifestLookup::Found(_)
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn hibernate_wake_and_a_restore_round_trip_the_guest_through_the_real_registry() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace("hibernate").await;
    let machine = Machine::new("vk-hibernate").with_registry();
    seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
    let _daemon = machine.start_daemon(cluster);
    create_pod(
        &admin,
        &managed_pod(&ns, &machine.node, "agent-0", "vm-h", &[(IMAGE, "base")]),
    )
    .await;
    wait_up(&admin, &ns, "agent-0").await;
    let first = machine.vms_named("vm-h").await.remove(0);

    cluster
        .kubectl_checked(&["annotate", "pod", "agent-0", "-n", &ns, &format!("{HIBERNATE}=true")])
        .unwrap();
    let hibernated = wait_lifecycle(&admin, &ns, "agent-0", "hibernated").await;
    assert!(machine.vms_named("vm-h").await.is_empty(), "the VM is removed");
    assert!(tag_exists(&machine, "vm-h").await, "the guest is in vm-h:hibernate");
    assert_eq!(
        annotation(&hibernated, VM_ID),
        None,
        "the runtime annotations are cleared"
    );
    assert_eq!(
        hibernated.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running"),
        "the pod stays"
    );
    wait_event(&admin, &ns, "agent-0", "Hibernated", "snapshot pushed to registry").await;

    // Wake from the registry: the warm local copy is gone, as on another node.
    machine.runtime.snapshot_remove_if_exists("vm-h").await.unwrap();
    cluster
        .kubectl_checked(&["annotate", "pod", "agent-0", "-n", &ns, &format!("{HIBERNATE}-")])
        .unwrap();
    let woken = wait_up(&admin, &ns, "agent-0").await;
    let vms = machine.vms_named("vm-h").await;
    assert_eq!(vms.len(), 1, "{vms:?}");
    assert_ne!(vms[0].id, first.id, "a new incarnation of the guest");
    assert_eq!(annotation(&woken, VM_ID), Some(vms[0].id.as_str()));
    wait_event(&admin, &ns, "agent-0", "Woken", "cloned from registry vm-h:hibernate").await;

    // Hibernate again, delete the pod, and bring a new pod up for the same VM: the hibernated
    // guest is restored (pulled from the tag), never booted fresh.
    cluster
        .kubectl_checked(&["annotate", "pod", "agent-0", "-n", &ns, &format!("{HIBERNATE}=true")])
        .unwrap();
    wait_lifecycle(&admin, &ns, "agent-0", "hibernated").await;
    cluster
        .kubectl_checked(&["delete", "pod", "agent-0", "-n", &ns, "--timeout=120s"])
        .unwrap();
    assert!(
        Api::<Pod>::namespaced(admin.clone(), &ns)
            .get_opt("agent-0")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        tag_exists(&machine, "vm-h").await,
        "the daemon never deletes the :hibernate tag"
    );
    machine.runtime.snapshot_remove_if_exists("vm-h").await.unwrap();
    create_pod(
        &admin,
        &managed_pod(&ns, &machine.node, "agent-1", "vm-h", &[(IMAGE, "base")]),
    )
    .await;
    wait_up(&admin, &ns, "agent-1").await;
    let clone = machine.calls("vm clone").pop().unwrap();
    assert!(
        clone.ends_with(" vm-h-hibernate-import"),
        "restored from the pulled tag: {clone}"
    );
    wait_event(&admin, &ns, "agent-1", "HibernateSnapshotExists", "").await;
    assert_eq!(machine.vms_named("vm-h").await.len(), 1);
}
