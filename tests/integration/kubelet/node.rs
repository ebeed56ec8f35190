//! The virtual node towards the apiserver: registration, capacity, labels, taint, lease, startup reconcile.

use crate::kubelet_support;

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use kube::ResourceExt;
use kubelet_support::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use vk_cocoon::kubelet::{EventReason, KubeletError, ProviderError, VirtualNode, measure_host, node};

fn q(node: &Node, field: &str, key: &str) -> String {
    let st = node.status.as_ref().expect("status");
    let map = if field == "capacity" {
        st.capacity.as_ref()
    } else {
        st.allocatable.as_ref()
    };
    map.and_then(|m| m.get(key)).map(|q| q.0.clone()).unwrap_or_default()
}

#[tokio::test]
async fn node_is_registered_with_measured_capacity_labels_and_taint() {
    let server = FakeApiServer::start().await;
    // On a filesystem the other tests do not write to, where it exists: on a shared disk their
    // writes and deletes can raise the free space and lower it again between the two samples
    // below, and the node's figure then lies outside them.
    let root = tempfile::tempdir_in("/dev/shm")
        .or_else(|_| tempfile::tempdir())
        .unwrap();
    let mut cfg = config(&[
        ("COCOON_ROOT_DIR", &root.path().display().to_string()),
        ("VK_SNAPSHOT_CPU_CLASS", "icx"),
        ("VK_PROVIDER_ID", "cocoon://vk-test"),
        ("VK_NODE_PODS", "100"),
        ("VK_RESERVE_PERCENT", "25"),
        ("VK_KUBELET_PORT", "10255"),
        ("VK_NODE_IP", "127.0.0.7"),
    ]);
    cfg.timings = fast_timings();
    let host = measure_host(root.path()).unwrap();
    let provider = Arc::new(RecordingProvider::default());
    // The free space of a live filesystem moves (other processes write): read it right before
    // and right after the node measures it, and expect the node's figure between the two.
    let avail_before = vk_cocoon::kubelet::capacity::statfs_bytes(root.path()).unwrap().1;
    let vn = VirtualNode::measured(server.client(), cfg, provider).unwrap();
    let avail_after = vk_cocoon::kubelet::capacity::statfs_bytes(root.path()).unwrap().1;
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(vn.run(shutdown.clone()));

    eventually(10, "node with status", || {
        server
            .store()
            .get_as::<Node>(None, NODE)
            .is_some_and(|n| n.status.as_ref().is_some_and(|s| s.capacity.is_some()))
    })
    .await;
    let n = server.store().get_as::<Node>(None, NODE).unwrap();

    // Capacity measured on this host; allocatable = floor(v * 75 / 100), pods passed through.
    assert_eq!(q(&n, "capacity", "cpu"), host.cpus.to_string());
    assert_eq!(q(&n, "capacity", "memory"), host.memory_bytes.to_string());
    let (total, _) = vk_cocoon::kubelet::capacity::statfs_bytes(root.path()).unwrap();
    assert_eq!(q(&n, "capacity", "ephemeral-storage"), total.to_string());
    let alloc_storage: u64 = q(&n, "allocatable", "ephemeral-storage").parse().unwrap();
    let (low, high) = (avail_before.min(avail_after), avail_before.max(avail_after));
    assert!(
        (low / 100 * 75..=high / 100 * 75 + 100).contains(&alloc_storage),
        "allocatable {alloc_storage} is not 75 % of the free space measured between {low} and {high}"
    );
    assert_eq!(
        q(&n, "allocatable", "memory"),
        (host.memory_bytes as u128 * 75 / 100).to_string()
    );
    let cpu_millis = host.cpus as u128 * 1000 * 75 / 100;
    let want_cpu = if cpu_millis.is_multiple_of(1000) {
        (cpu_millis / 1000).to_string()
    } else {
        format!("{cpu_millis}m")
    };
    assert_eq!(q(&n, "allocatable", "cpu"), want_cpu);
    assert_eq!(q(&n, "capacity", "pods"), "100");
    assert_eq!(q(&n, "allocatable", "pods"), "100");

    let labels = n.labels();
    assert_eq!(labels.get(node::LABEL_POOL).map(String::as_str), Some("default"));
    assert_eq!(
        labels.get(node::LABEL_SNAPSHOT_CPU_CLASS).map(String::as_str),
        Some("icx")
    );
    assert_eq!(labels.get(node::LABEL_ROLE).map(String::as_str), Some(""));
    let spec = n.spec.as_ref().unwrap();
    assert_eq!(spec.provider_id.as_deref(), Some("cocoon://vk-test"));
    let taints = spec.taints.as_ref().unwrap();
    assert!(taints.iter().any(|t| t.key == "virtual-kubelet.io/provider"
        && t.value.as_deref() == Some("cocoon")
        && t.effect == "NoSchedule"));
    let st = n.status.as_ref().unwrap();
    assert_eq!(
        st.daemon_endpoints
            .as_ref()
            .unwrap()
            .kubelet_endpoint
            .as_ref()
            .unwrap()
            .port,
        10255
    );
    assert!(
        st.addresses
            .as_ref()
            .unwrap()
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == "127.0.0.7")
    );
    let ready = st
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.status, "True");

    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// Checklist rows: main_test/NodeLabels
#[tokio::test]
async fn existing_node_is_updated_and_an_unset_cpu_class_label_is_removed() {
    let server = FakeApiServer::start().await;
    let mut existing = Node::default();
    existing.metadata.name = Some(NODE.into());
    existing.metadata.labels = Some(BTreeMap::from([
        (node::LABEL_SNAPSHOT_CPU_CLASS.to_string(), "old-class".to_string()),
        ("team".to_string(), "infra".to_string()),
    ]));
    existing.spec = Some(NodeSpec {
        taints: Some(vec![Taint {
            key: "maintenance".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let seeded = server.store().seed(&existing).unwrap();

    let running = start_node(&server, config(&[]), Arc::new(RecordingProvider::default()));
    eventually(10, "labels merged", || {
        server
            .store()
            .get_as::<Node>(None, NODE)
            .is_some_and(|n| n.labels().contains_key(node::LABEL_POOL))
    })
    .await;
    let n = server.store().get_as::<Node>(None, NODE).unwrap();
    assert!(
        !n.labels().contains_key(node::LABEL_SNAPSHOT_CPU_CLASS),
        "unset VK_SNAPSHOT_CPU_CLASS removes the label"
    );
    assert_eq!(
        n.labels().get("team").map(String::as_str),
        Some("infra"),
        "foreign labels are kept"
    );
    let taints = n.spec.as_ref().unwrap().taints.clone().unwrap();
    assert!(taints.iter().any(|t| t.key == "maintenance"));
    assert!(taints.iter().any(|t| t.key == "virtual-kubelet.io/provider"));
    assert_eq!(n.uid(), seeded.uid(), "updated in place, not recreated");

    // Someone strips our label (a merge patch, which carries no resourceVersion: a replace of
    // the copy read above races the daemon's own status updates and can get a 409): the
    // periodic refresh puts it back.
    let nodes: kube::Api<Node> = kube::Api::all(server.client());
    let strip = serde_json::json!({"metadata": {"labels": {node::LABEL_POOL: null}}});
    let stripped = nodes
        .patch(
            NODE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&strip),
        )
        .await
        .unwrap();
    assert!(
        !stripped.labels().contains_key(node::LABEL_POOL),
        "the label was stripped"
    );
    eventually(10, "label re-asserted", || {
        server
            .store()
            .get_as::<Node>(None, NODE)
            .is_some_and(|n| n.labels().contains_key(node::LABEL_POOL))
    })
    .await;
    running.stop().await;
}

fn existing_uid(server: &FakeApiServer) -> Option<String> {
    server.store().get_as::<Node>(None, NODE).and_then(|n| n.uid())
}

#[tokio::test]
async fn lease_is_created_and_renewed() {
    let server = FakeApiServer::start().await;
    let running = start_node(&server, config(&[]), Arc::new(RecordingProvider::default()));
    eventually(10, "lease", || {
        server.store().get_as::<Lease>(Some("kube-node-lease"), NODE).is_some()
    })
    .await;
    let first = server.store().get_as::<Lease>(Some("kube-node-lease"), NODE).unwrap();
    let spec = first.spec.clone().unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(NODE));
    assert_eq!(spec.lease_duration_seconds, Some(2));
    let node_uid = existing_uid(&server).unwrap();
    assert_eq!(first.metadata.owner_references.as_ref().unwrap()[0].uid, node_uid);

    let rv = |l: &Lease| l.resource_version().unwrap().parse::<u64>().unwrap();
    eventually(10, "lease renewed twice", || {
        server
            .store()
            .get_as::<Lease>(Some("kube-node-lease"), NODE)
            .is_some_and(|l| rv(&l) > rv(&first) && l.spec.as_ref().unwrap().renew_time > spec.renew_time)
    })
    .await;

    // The lease keeps being renewed across an apiserver outage.
    let mut server = server;
    server.stop().await;
    // The outage spans three renew intervals (its length is the scenario, not a synchronisation).
    tokio::time::sleep(fast_timings().lease_renew * 3).await;
    let before = server.store().get_as::<Lease>(Some("kube-node-lease"), NODE).unwrap();
    server.start_again().await;
    eventually(10, "lease renewed after the outage", || {
        server
            .store()
            .get_as::<Lease>(Some("kube-node-lease"), NODE)
            .is_some_and(|l| rv(&l) > rv(&before))
    })
    .await;
    running.stop().await;
}

#[tokio::test]
async fn startup_reconcile_sees_this_nodes_pods_and_an_error_is_fatal() {
    let server = FakeApiServer::start().await;
    server.store().seed(&pod("mine-1", NODE)).unwrap();
    server.store().seed(&pod("mine-2", NODE)).unwrap();
    server.store().seed(&pod("elsewhere", "other-node")).unwrap();

    let provider = Arc::new(RecordingProvider::default());
    *provider.reconcile_error.lock().unwrap() = Some(ProviderError::Rejected {
        reason: EventReason::SnapshotCpuClassMismatch,
        message: "pod default/mine-1 wants spr".into(),
    });
    let running = start_node(&server, config(&[]), provider.clone());
    let result = tokio::time::timeout(Duration::from_secs(10), running.task)
        .await
        .expect("run returns")
        .unwrap();
    match result {
        Err(KubeletError::StartupReconcile { node, source }) => {
            assert_eq!(node, NODE);
            assert!(matches!(source, ProviderError::Rejected { .. }));
        }
        other => panic!("expected a fatal startup reconcile error, got {other:?}"),
    }
    let mut seen = provider.reconciled.lock().unwrap().clone().unwrap();
    seen.sort();
    assert_eq!(seen, vec!["default/mine-1", "default/mine-2"]);
    assert!(
        server.store().get_as::<Node>(None, NODE).is_none(),
        "the node never registers"
    );
    assert!(
        server.store().get_as::<Lease>(Some("kube-node-lease"), NODE).is_none(),
        "no lease either"
    );
    assert!(provider.calls().is_empty(), "no pod reaches the provider");
}

#[tokio::test]
async fn node_status_heartbeat_is_refreshed() {
    let server = FakeApiServer::start().await;
    let running = start_node(&server, config(&[]), Arc::new(RecordingProvider::default()));
    let heartbeat = || {
        server.store().get_as::<Node>(None, NODE).and_then(|n| {
            n.status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Ready")
                .and_then(|c| c.last_heartbeat_time)
        })
    };
    eventually(10, "first heartbeat", || heartbeat().is_some()).await;
    let first = heartbeat().unwrap();
    eventually(10, "a later heartbeat", || heartbeat().is_some_and(|h| h > first)).await;
    running.stop().await;
}
