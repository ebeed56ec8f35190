//! The three-tier wake across two nodes on the real server: two `vk-cocoon run` processes (two
//! simulators, two node names, each on its own loopback address as its InternalIP), one real
//! registry. A guest hibernated on node A, its seat moved to node B (`kubectl delete` with
//! `keep-snapshot-on-delete`, a new pod on B with `restore-from-hibernate`), wakes on B from A's
//! files over the authenticated peer port — nothing pulled from the registry — and B's staging
//! directory is empty afterwards.

use crate::daemon::*;
use crate::hibernate::{HIBERNATE, wait_lifecycle};
use crate::kube_support;
use crate::provider_support::fleet_ca::FleetCa;
use crate::provider_support::seed_snapshot_on;

const TOKEN: &str = "the-clusters-peer-token-0123456789";

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_hibernated_on_node_a_wakes_on_node_b_from_as_files() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace("peer").await;
    let fleet = FleetCa::new("the fleet's peer CA");
    let a = Machine::new("vk-peer-a").with_registry();
    // Picked once the registry holds its own port: a port picked (and let go) before it could
    // be handed to the registry next, and node A's peer listener would find it taken.
    let port = free_port();
    let a = a.with_peer(&fleet, "127.0.0.1", port, TOKEN, None);
    let b = Machine::new("vk-peer-b").with_peer(&fleet, "127.0.0.2", port, TOKEN, a.registry.as_ref());
    seed_snapshot_on(&a.runtime, "base", "ghcr.io/x/base:1").await;
    seed_snapshot_on(&b.runtime, "base", "ghcr.io/x/base:1").await;
    let daemon_a = a.start_daemon(cluster);
    let daemon_b = b.start_daemon(cluster);
    a.wait_registered(cluster).await;
    b.wait_registered(cluster).await;

    create_pod(
        &admin,
        &managed_pod(&ns, &a.node, "agent-0", "vm-peer", &[(IMAGE, "base")]),
    )
    .await;
    wait_up(&admin, &ns, "agent-0").await;
    cluster
        .kubectl_checked(&["annotate", "pod", "agent-0", "-n", &ns, &format!("{HIBERNATE}=true")])
        .unwrap();
    wait_lifecycle(&admin, &ns, "agent-0", "hibernated").await;
    // The operator moves the seat: a release keeps A's local copy.
    cluster
        .kubectl_checked(&[
            "annotate",
            "pod",
            "agent-0",
            "-n",
            &ns,
            "vm.cocoonstack.io/keep-snapshot-on-delete=true",
        ])
        .unwrap();
    cluster
        .kubectl_checked(&["delete", "pod", "agent-0", "-n", &ns, "--timeout=120s"])
        .unwrap();
    assert!(
        a.sim.snapshot_dir("vm-peer").unwrap().is_some(),
        "A keeps the guest's files"
    );

    create_pod(
        &admin,
        &managed_pod(
            &ns,
            &b.node,
            "agent-0",
            "vm-peer",
            &[(IMAGE, "base"), ("vm.cocoonstack.io/restore-from-hibernate", "true")],
        ),
    )
    .await;
    wait_up(&admin, &ns, "agent-0").await;
    let clone = b.calls("vm clone").pop().unwrap();
    let peer_lines = |d: &DaemonProcess| {
        d.log()
            .lines()
            .filter(|l| l.contains("wake_peer") || l.contains("peer tier") || l.contains("peer::"))
            .map(str::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        clone.contains(" --from-dir "),
        "cloned from A's staged files: {clone}\nB: {}\nA: {}",
        peer_lines(&daemon_b),
        peer_lines(&daemon_a)
    );
    assert!(
        b.calls("snapshot import").is_empty(),
        "nothing pulled from the registry"
    );
    assert_eq!(b.vms_named("vm-peer").await.len(), 1);
    let metrics = daemon_b.scrape_metrics().unwrap();
    assert!(
        metrics.contains("cocoon_vk_snapshot_peer_restore_total{result=\"ok\"} 1"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("wake_peer") || l.contains("peer tier") || l.contains("peer::"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let staging = b.dir.path().join("vk-staging");
    assert_eq!(
        std::fs::read_dir(&staging).unwrap().count(),
        0,
        "the staged directory is gone"
    );
    drop(daemon_b);
    drop(daemon_a);
}
