//! Pins the fake apiserver's semantics through a real `kube::Client` and kube-runtime's watcher.

use fake_apiserver::{FakeApiServer, Options};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use kube::runtime::events::{Event as KEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::time::Duration;

fn pod(name: &str, node: Option<&str>) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.spec = Some(PodSpec {
        node_name: node.map(str::to_string),
        containers: vec![Default::default()],
        ..Default::default()
    });
    p
}

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn create_sets_uid_timestamp_and_increasing_resource_versions() {
    let server = FakeApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let a = pods.create(&PostParams::default(), &pod("a", None)).await.unwrap();
    let b = pods.create(&PostParams::default(), &pod("b", None)).await.unwrap();
    assert!(a.metadata.uid.as_deref().is_some_and(|u| !u.is_empty()));
    assert_ne!(a.metadata.uid, b.metadata.uid);
    assert!(a.metadata.creation_timestamp.is_some());
    let rv = |p: &Pod| p.resource_version().unwrap().parse::<u64>().unwrap();
    assert!(rv(&b) > rv(&a));
    assert_eq!(a.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Pending"));

    let dup = api_err(pods.create(&PostParams::default(), &pod("a", None)).await.unwrap_err());
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
}

#[tokio::test]
async fn missing_object_is_404_with_a_status_body() {
    let server = FakeApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let err = api_err(pods.get("nope").await.unwrap_err());
    assert_eq!(err.code, 404);
    assert_eq!(err.reason, "NotFound");
    assert_eq!(err.message, "pods \"nope\" not found");
    assert_eq!(pods.get_opt("nope").await.unwrap(), None);
}

#[tokio::test]
async fn stale_resource_version_on_replace_is_a_conflict() {
    let server = FakeApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let created = pods.create(&PostParams::default(), &pod("a", None)).await.unwrap();
    let mut first = created.clone();
    first.labels_mut().insert("x".into(), "1".into());
    let updated = pods.replace("a", &PostParams::default(), &first).await.unwrap();
    assert_ne!(updated.resource_version(), created.resource_version());

    let mut stale = created.clone();
    stale.labels_mut().insert("x".into(), "2".into());
    let err = api_err(pods.replace("a", &PostParams::default(), &stale).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        pods.get("a").await.unwrap().labels().get("x").map(String::as_str),
        Some("1")
    );
}

#[tokio::test]
async fn patches_merge_strategic_json_and_the_status_subresource() {
    let server = FakeApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let created = pods
        .create(&PostParams::default(), &pod("a", Some("n1")))
        .await
        .unwrap();
    let uid = created.uid().unwrap();
    let pp = PatchParams::default();

    pods.patch(
        "a",
        &pp,
        &Patch::Merge(json!({"metadata": {"annotations": {"k": "v"}}})),
    )
    .await
    .unwrap();
    pods.patch(
        "a",
        &pp,
        &Patch::Strategic(json!({"metadata": {"annotations": {"k2": "v2"}}})),
    )
    .await
    .unwrap();
    let p: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/metadata/labels", "value": {"l": "1"}}])).unwrap();
    let after = pods.patch("a", &pp, &Patch::<()>::Json(p)).await.unwrap();
    assert_eq!(after.annotations().get("k").map(String::as_str), Some("v"));
    assert_eq!(after.annotations().get("k2").map(String::as_str), Some("v2"));
    assert_eq!(after.labels().get("l").map(String::as_str), Some("1"));

    // A status change through the main resource is ignored; through /status it lands.
    let ignored = pods
        .patch("a", &pp, &Patch::Merge(json!({"status": {"phase": "Running"}})))
        .await
        .unwrap();
    assert_eq!(ignored.status.unwrap().phase.as_deref(), Some("Pending"));
    let patched = pods
        .patch_status(
            "a",
            &pp,
            &Patch::Merge(json!({"metadata": {"uid": uid}, "status": {"phase": "Running", "podIP": "10.0.0.2"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(patched.status.as_ref().unwrap().pod_ip.as_deref(), Some("10.0.0.2"));
    // ...and a /status write cannot touch metadata.
    let meta_ignored = pods
        .patch_status(
            "a",
            &pp,
            &Patch::Merge(json!({"metadata": {"annotations": {"k": "changed"}}})),
        )
        .await
        .unwrap();
    assert_eq!(meta_ignored.annotations().get("k").map(String::as_str), Some("v"));
}

#[tokio::test]
async fn a_patch_naming_another_uid_is_rejected_and_changes_nothing() {
    let server = FakeApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let old = pods
        .create(&PostParams::default(), &pod("a", Some("n1")))
        .await
        .unwrap();
    pods.delete(
        "a",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let new = pods
        .create(&PostParams::default(), &pod("a", Some("n1")))
        .await
        .unwrap();
    assert_ne!(old.uid(), new.uid());

    let err = api_err(
        pods.patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"uid": old.uid()}, "status": {"phase": "Failed"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    assert!(
        err.message.contains("Precondition failed: UID in precondition"),
        "{}",
        err.message
    );
    let err = api_err(
        pods.patch(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"uid": old.uid(), "annotations": {"x": "y"}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 409);
    let stored = pods.get("a").await.unwrap();
    assert_eq!(stored.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(stored.resource_version(), new.resource_version());
}

#[tokio::test]
async fn graceful_pod_delete_sets_deletion_timestamp_and_grace_zero_removes() {
    let server = FakeApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let bound = pods
        .create(&PostParams::default(), &pod("bound", Some("n1")))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("unbound", None))
        .await
        .unwrap();

    pods.delete("bound", &DeleteParams::default()).await.unwrap();
    let marked = pods.get("bound").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));

    // An unbound pod has nobody to wait for: removed at once.
    pods.delete("unbound", &DeleteParams::default()).await.unwrap();
    assert!(pods.get_opt("unbound").await.unwrap().is_none());

    // A uid precondition naming another incarnation is a conflict.
    let wrong = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some("someone-else".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let err = api_err(pods.delete("bound", &wrong).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));

    let right = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: bound.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    pods.delete("bound", &right).await.unwrap();
    assert!(pods.get_opt("bound").await.unwrap().is_none());
    let err = api_err(pods.delete("bound", &right).await.unwrap_err());
    assert_eq!(err.code, 404);
}

#[tokio::test]
async fn list_and_watch_filter_on_node_name() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let pods: Api<Pod> = Api::all(client.clone());
    let ns_pods: Api<Pod> = Api::namespaced(client, "default");
    ns_pods
        .create(&PostParams::default(), &pod("mine", Some("n1")))
        .await
        .unwrap();
    ns_pods
        .create(&PostParams::default(), &pod("theirs", Some("n2")))
        .await
        .unwrap();

    let list = pods
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(
        list.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        vec!["mine"]
    );
    let rv = list.metadata.resource_version.clone().unwrap();

    let mut stream = pods
        .watch(&WatchParams::default().fields("spec.nodeName=n1"), &rv)
        .await
        .unwrap()
        .boxed();
    ns_pods
        .create(&PostParams::default(), &pod("other", Some("n2")))
        .await
        .unwrap();
    ns_pods
        .create(&PostParams::default(), &pod("second", Some("n1")))
        .await
        .unwrap();
    match next_event(&mut stream).await {
        Some(WatchEvent::Added(p)) => assert_eq!(p.name_any(), "second"),
        other => panic!("expected ADDED second, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_gets_410_expired() {
    let server = FakeApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let first = pods.create(&PostParams::default(), &pod("a", None)).await.unwrap();
    pods.create(&PostParams::default(), &pod("b", None)).await.unwrap();
    server.store().compact_history();
    let mut stream = pods
        .watch(&WatchParams::default(), &first.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    match next_event(&mut stream).await {
        Some(WatchEvent::Error(status)) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
            assert!(
                status.message.starts_with("too old resource version"),
                "{}",
                status.message
            );
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
}

#[tokio::test]
async fn bounded_history_expires_old_resource_versions() {
    let server = FakeApiServer::start_with(Options {
        history_capacity: 2,
        ..Default::default()
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let first = pods.create(&PostParams::default(), &pod("a", None)).await.unwrap();
    for name in ["b", "c", "d"] {
        pods.create(&PostParams::default(), &pod(name, None)).await.unwrap();
    }
    let mut stream = pods
        .watch(&WatchParams::default(), &first.resource_version().unwrap())
        .await
        .unwrap()
        .boxed();
    assert!(matches!(next_event(&mut stream).await, Some(WatchEvent::Error(s)) if s.code == 410));
    // From a version still covered, the history is replayed.
    let rv_b: u64 = first.resource_version().unwrap().parse::<u64>().unwrap() + 2;
    let mut stream = pods
        .watch(&WatchParams::default(), &rv_b.to_string())
        .await
        .unwrap()
        .boxed();
    assert!(matches!(next_event(&mut stream).await, Some(WatchEvent::Added(p)) if p.name_any() == "d"));
}

#[tokio::test]
async fn watch_sends_bookmarks_when_asked() {
    let server = FakeApiServer::start_with(Options {
        bookmark_interval: None,
        ..Default::default()
    })
    .await;
    let pods: Api<Pod> = Api::all(server.client());
    let rv = server.store().resource_version().to_string();
    let mut stream = pods.watch(&WatchParams::default(), &rv).await.unwrap().boxed();
    Api::<Pod>::namespaced(server.client(), "default")
        .create(&PostParams::default(), &pod("a", None))
        .await
        .unwrap();
    assert!(matches!(stream.try_next().await.unwrap(), Some(WatchEvent::Added(_))));
    server.bookmark();
    match tokio::time::timeout(Duration::from_secs(5), stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        Some(WatchEvent::Bookmark(bm)) => assert_eq!(
            bm.metadata.resource_version,
            server.store().resource_version().to_string()
        ),
        other => panic!("expected a BOOKMARK, got {other:?}"),
    }
}

/// The next raw watch event that is not a BOOKMARK: an apiserver may send bookmarks at any time
/// to a watch that allows them, so tests of other events must step over them.
async fn next_event(
    stream: &mut futures::stream::BoxStream<'static, kube::Result<WatchEvent<Pod>>>,
) -> Option<WatchEvent<Pod>> {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(5), stream.try_next())
            .await
            .expect("a watch event in time");
        match event.expect("the watch stream stays healthy") {
            Some(WatchEvent::Bookmark(_)) => continue,
            other => return other,
        }
    }
}

type EventStream = futures::stream::BoxStream<'static, Result<watcher::Event<Pod>, watcher::Error>>;

async fn next_apply(events: &mut EventStream) -> String {
    loop {
        match tokio::time::timeout(Duration::from_secs(20), events.next())
            .await
            .expect("watcher event in time")
        {
            Some(Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p))) => return p.name_any(),
            Some(_) => continue,
            None => panic!("watcher ended"),
        }
    }
}

#[tokio::test]
async fn kube_runtime_watcher_relists_after_410_and_survives_a_restart() {
    let mut server = FakeApiServer::start().await;
    let client = server.client();
    let ns_pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    ns_pods
        .create(&PostParams::default(), &pod("a", Some("n1")))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::all(client);
    let mut events: EventStream = watcher(pods, watcher::Config::default().fields("spec.nodeName=n1")).boxed();

    assert_eq!(next_apply(&mut events).await, "a");

    // Changes while the server is down, and a compaction that loses them from the history: the
    // watcher's resumption gets 410 and it must relist to see "b".
    server.stop().await;
    server.store().seed(&pod("b", Some("n1"))).unwrap();
    server.store().compact_history();
    server.start_again().await;
    loop {
        if next_apply(&mut events).await == "b" {
            break;
        }
    }
    let reqs = server.requests();
    assert!(
        reqs.iter().any(|r| r.is_watch() && r.status == 200),
        "watches were served"
    );
    let lists = reqs
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/api/v1/pods" && !r.is_watch())
        .count();
    assert!(lists >= 2, "a relist after 410 (lists: {lists})");
}

#[tokio::test]
async fn nodes_leases_and_recorder_events() {
    let server = FakeApiServer::start().await;
    let client = server.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let mut node = Node::default();
    node.metadata.name = Some("n1".into());
    let created = nodes.create(&PostParams::default(), &node).await.unwrap();
    assert!(created.metadata.namespace.is_none());
    let with_status = nodes
        .patch_status(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {"cpu": "4"}}})),
        )
        .await
        .unwrap();
    assert_eq!(with_status.status.unwrap().capacity.unwrap()["cpu"].0, "4");

    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let mut lease = Lease::default();
    lease.metadata.name = Some("n1".into());
    let l = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut l2 = l.clone();
    l2.spec = Some(Default::default());
    leases.replace("n1", &PostParams::default(), &l2).await.unwrap();
    assert_eq!(
        api_err(leases.replace("n1", &PostParams::default(), &l2).await.unwrap_err()).code,
        409
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let p = pods
        .create(&PostParams::default(), &pod("a", Some("n1")))
        .await
        .unwrap();
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "vk-cocoon".into(),
            instance: Some("n1".into()),
        },
    );
    let ev = KEvent {
        type_: EventType::Warning,
        reason: "Boom".into(),
        note: Some("x".into()),
        action: "Create".into(),
        secondary: None,
    };
    recorder.publish(&ev, &p.object_ref(&())).await.unwrap();
    recorder.publish(&ev, &p.object_ref(&())).await.unwrap();
    let events = server.store().list_as::<k8s_openapi::api::events::v1::Event>();
    assert_eq!(events.len(), 1, "the second publish patches the series");
    assert_eq!(events[0].reason.as_deref(), Some("Boom"));
    assert_eq!(events[0].series.as_ref().map(|s| s.count), Some(2));
}
