//! Status publication with a `metadata.uid` precondition.

use crate::kubelet_support;

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use kubelet_support::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::Semaphore;
use vk_cocoon::kubelet::ProviderPodStatus;
use vk_cocoon::kubelet::status::{WriteOutcome, build_pod_status, patch_annotations, publish_status};

#[tokio::test]
async fn writes_for_a_stale_uid_are_rejected_and_leave_the_new_incarnation_alone() {
    let server = FakeApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let old = pods.create(&PostParams::default(), &pod("p", NODE)).await.unwrap();
    pods.delete(
        "p",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let new = pods.create(&PostParams::default(), &pod("p", NODE)).await.unwrap();

    let failed = build_pod_status(
        &old,
        &ProviderPodStatus::failed("VMGone", "vm no longer exists"),
        &Time(Timestamp::now()),
    );
    match publish_status(&pods, &old, &failed).await.unwrap() {
        // 422 Invalid (metadata.uid is immutable), as a real apiserver answers the uid-as-precondition
        // idiom (pinned on both servers by the fake apiserver's semantics tests).
        WriteOutcome::Superseded { code, .. } => assert_eq!(code, 422),
        other => panic!("expected superseded, got {other:?}"),
    }
    let changes = BTreeMap::from([("vm.cocoonstack.io/id".to_string(), Some("vm-1".to_string()))]);
    assert!(matches!(
        patch_annotations(&pods, &old, &changes).await.unwrap(),
        WriteOutcome::Superseded { code: 422, .. }
    ));

    let stored = pods.get("p").await.unwrap();
    assert_eq!(stored.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
    assert!(stored.annotations().get("vm.cocoonstack.io/id").is_none());
    assert_eq!(stored.resource_version(), new.resource_version(), "nothing was written");

    // The same writes for the live incarnation land.
    assert!(matches!(
        patch_annotations(&pods, &new, &changes).await.unwrap(),
        WriteOutcome::Applied(_)
    ));
    let running = build_pod_status(
        &new,
        &ProviderPodStatus::pending("ContainerCreating", None),
        &Time(Timestamp::now()),
    );
    assert!(matches!(
        publish_status(&pods, &new, &running).await.unwrap(),
        WriteOutcome::Applied(_)
    ));
    // Removing an annotation (None) deletes the key.
    let removal = BTreeMap::from([("vm.cocoonstack.io/id".to_string(), None)]);
    match patch_annotations(&pods, &new, &removal).await.unwrap() {
        WriteOutcome::Applied(p) => assert!(p.annotations().get("vm.cocoonstack.io/id").is_none()),
        other => panic!("{other:?}"),
    }
    // A pod that is gone entirely is superseded too (404).
    pods.delete(
        "p",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(matches!(
        publish_status(&pods, &new, &running).await.unwrap(),
        WriteOutcome::Superseded { code: 404, .. }
    ));
}

#[tokio::test]
async fn the_controller_drops_a_status_for_a_replaced_pod_and_serves_the_new_one() {
    let server = FakeApiServer::start().await;
    let provider = Arc::new(RecordingProvider::default());
    let gate = Arc::new(Semaphore::new(0));
    *provider.status_gate.lock().unwrap() = Some(gate.clone());
    let running = start_node(&server, config(&[]), provider.clone());
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");

    let old = server.store().seed(&pod("p", NODE)).unwrap();
    let old_uid = old.uid().unwrap();
    eventually(10, "created; status publication waiting at the gate", || {
        provider.count("create", &old_uid) == 1 && provider.count("status_gated", &old_uid) >= 1
    })
    .await;

    // While the status publication for the old incarnation is in flight, the pod is replaced.
    pods.delete(
        "p",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let new = pods.create(&PostParams::default(), &pod("p", NODE)).await.unwrap();
    let new_uid = new.uid().unwrap();
    // Whether the controller has seen the replacement yet or not, the old write carries the old
    // uid and must be refused: open the gate now.
    gate.add_permits(1000);

    eventually(10, "new incarnation running", || {
        server.store().get_as::<Pod>(Some("default"), "p").is_some_and(|p| {
            p.uid().as_deref() == Some(new_uid.as_str())
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
    })
    .await;
    let stored = server.store().get_as::<Pod>(Some("default"), "p").unwrap();
    assert_eq!(
        stored.status.unwrap().pod_ip,
        provider.ip_of(&new_uid),
        "the new incarnation carries its own IP"
    );
    let rejected = server
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/pods/p/status") && r.status == 422)
        .count();
    assert_eq!(rejected, 1, "the stale write was rejected once and not retried");
    assert_eq!(
        provider.count("delete_returned", &old_uid),
        1,
        "the old incarnation was deleted in the provider"
    );
    assert_eq!(provider.count("create", &new_uid), 1);
    running.stop().await;
}
