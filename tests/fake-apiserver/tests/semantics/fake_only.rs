//! What only the fake can be made to do on demand — stop and serve again, compact its watch
//! history (a real apiserver answers an old resourceVersion from its watch cache, and only says
//! 410 once events were evicted or etcd compacted, minutes later), send a bookmark now (a real
//! one sends them about once a minute), keep a two-change history — and what clients do then.

use crate::both::next_event;
use crate::pod as valid_pod;
use fake_apiserver::{FakeApiServer, Options};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube::runtime::watcher;
use std::time::Duration;

fn pod(name: &str, node: Option<&str>) -> Pod {
    valid_pod("default", name, node)
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
