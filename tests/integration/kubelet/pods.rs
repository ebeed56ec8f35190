//! The pod watch and lifecycle against the fake apiserver: create once, kubelet-style delete,
//! surviving restarts and 410 Gone, retries, rejections.

use crate::kubelet_support;

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use kubelet_support::*;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

fn get(server: &FakeApiServer, name: &str) -> Option<Pod> {
    server.store().get_as::<Pod>(Some("default"), name)
}

fn phase(p: &Pod) -> Option<String> {
    p.status.as_ref().and_then(|s| s.phase.clone())
}

#[tokio::test]
async fn a_bound_pod_reaches_the_provider_exactly_once_and_its_status_is_published() {
    let server = FakeApiServer::start().await;
    let provider = Arc::new(RecordingProvider::default());
    let running = start_node(&server, config(&[]), provider.clone());
    let mine = server.store().seed(&pod("web-0", NODE)).unwrap();
    server.store().seed(&pod("theirs", "other-node")).unwrap();
    let uid = mine.uid().unwrap();

    eventually(10, "status published", || {
        get(&server, "web-0").is_some_and(|p| phase(&p).as_deref() == Some("Running"))
    })
    .await;
    let p = get(&server, "web-0").unwrap();
    let st = p.status.unwrap();
    assert_eq!(st.pod_ip, provider.ip_of(&uid));
    let conds = st.conditions.unwrap();
    assert!(conds.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    assert!(conds.iter().any(|c| c.type_ == "Initialized" && c.status == "True"));
    let cs = st.container_statuses.unwrap();
    assert_eq!(cs.len(), 1);
    assert_eq!(cs[0].name, "agent");
    assert!(cs[0].state.as_ref().unwrap().running.is_some());

    // Unrelated writes and bookmarks do not re-create it.
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    pods.patch_status(
        "web-0",
        &Default::default(),
        &kube::api::Patch::Merge(serde_json::json!({"status": {"message": "x"}})),
    )
    .await
    .unwrap();
    server.bookmark();
    barrier(&server, &provider).await;
    assert_eq!(provider.count("create", &uid), 1);
    assert_eq!(
        provider.count_key("create", "default/theirs"),
        0,
        "pods of other nodes never reach the provider"
    );
    running.stop().await;
}

#[tokio::test]
async fn the_pod_object_is_removed_only_after_the_providers_delete_returned() {
    let server = FakeApiServer::start().await;
    let provider = Arc::new(RecordingProvider::default());
    let gate = Arc::new(Semaphore::new(0));
    *provider.delete_gate.lock().unwrap() = Some(gate.clone());
    let running = start_node(&server, config(&[]), provider.clone());
    let created = server.store().seed(&pod("db-0", NODE)).unwrap();
    let uid = created.uid().unwrap();
    eventually(10, "running", || {
        get(&server, "db-0").is_some_and(|p| phase(&p).as_deref() == Some("Running"))
    })
    .await;

    // kubectl delete: graceful, the apiserver only sets deletionTimestamp.
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    pods.delete("db-0", &DeleteParams::default()).await.unwrap();
    eventually(10, "provider delete started", || {
        provider.count("delete_started", &uid) == 1
    })
    .await;
    for _ in 0..10 {
        let p = get(&server, "db-0").expect("the object stays while the provider deletes");
        assert!(p.metadata.deletion_timestamp.is_some());
        assert_eq!(provider.count("delete_returned", &uid), 0);
        tokio::time::sleep(Duration::from_millis(30)).await;
    }

    gate.add_permits(1);
    eventually(10, "object removed", || get(&server, "db-0").is_none()).await;
    assert_eq!(provider.count("delete_returned", &uid), 1);
    assert_eq!(provider.count("delete_started", &uid), 1, "deleted exactly once");

    // Terminal status patched, then the grace-0 delete — in that order, after the provider returned.
    let reqs = server.requests();
    let status_patch = reqs
        .iter()
        .rposition(|r| r.method == "PATCH" && r.path == "/api/v1/namespaces/default/pods/db-0/status");
    let final_delete = reqs
        .iter()
        .rposition(|r| r.method == "DELETE" && r.path == "/api/v1/namespaces/default/pods/db-0" && r.status == 200);
    assert!(
        status_patch.is_some() && final_delete.is_some() && status_patch < final_delete,
        "{reqs:#?}"
    );
    running.stop().await;
}

#[tokio::test]
async fn the_watch_survives_an_apiserver_restart_and_a_410_gone() {
    let mut server = FakeApiServer::start().await;
    let provider = Arc::new(RecordingProvider::default());
    let running = start_node(&server, config(&[]), provider.clone());
    let a = server.store().seed(&pod("a", NODE)).unwrap();
    eventually(10, "a created", || provider.count("create", &a.uid().unwrap()) == 1).await;

    // Restart: the watch resumes from its resourceVersion and sees what happened meanwhile.
    server.stop().await;
    let b = server.store().seed(&pod("b", NODE)).unwrap();
    server.start_again().await;
    eventually(20, "b created after restart", || {
        provider.count("create", &b.uid().unwrap()) == 1
    })
    .await;
    let lists_before = server
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/api/v1/pods" && !r.is_watch())
        .count();

    // Restart with the history compacted: resuming gets 410 Gone, the watcher relists.
    server.stop().await;
    let c = server.store().seed(&pod("c", NODE)).unwrap();
    server.store().compact_history();
    server.start_again().await;
    eventually(20, "c created after 410 and relist", || {
        provider.count("create", &c.uid().unwrap()) == 1
    })
    .await;
    let lists_after = server
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == "/api/v1/pods" && !r.is_watch())
        .count();
    assert!(
        lists_after > lists_before,
        "a relist happened ({lists_before} → {lists_after})"
    );

    barrier(&server, &provider).await;
    for p in [&a, &b, &c] {
        assert_eq!(
            provider.count("create", &p.uid().unwrap()),
            1,
            "{} created exactly once",
            p.name_any()
        );
    }
    running.stop().await;
}

#[tokio::test]
async fn a_pod_deleted_while_the_daemon_watch_was_down_is_deleted_after_the_relist() {
    let mut server = FakeApiServer::start().await;
    let provider = Arc::new(RecordingProvider::default());
    let running = start_node(&server, config(&[]), provider.clone());
    let a = server.store().seed(&pod("a", NODE)).unwrap();
    let uid = a.uid().unwrap();
    eventually(10, "a created", || provider.count("create", &uid) == 1).await;

    server.stop().await;
    let pods = fake_apiserver::resource::PODS;
    server
        .store()
        .delete(
            pods,
            Some("default"),
            "a",
            &fake_apiserver::store::DeleteOptions {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .unwrap();
    server.store().compact_history();
    server.start_again().await;
    eventually(20, "provider delete after relist", || {
        provider.count("delete_returned", &uid) == 1
    })
    .await;
    running.stop().await;
}

#[tokio::test]
async fn transient_create_failures_are_retried_with_backoff() {
    let server = FakeApiServer::start().await;
    let provider = Arc::new(RecordingProvider::default());
    provider
        .transient_create_failures
        .store(2, std::sync::atomic::Ordering::SeqCst);
    let running = start_node(&server, config(&[]), provider.clone());
    let p = server.store().seed(&pod("flaky", NODE)).unwrap();
    eventually(10, "running after retries", || {
        get(&server, "flaky").is_some_and(|p| phase(&p).as_deref() == Some("Running"))
    })
    .await;
    assert_eq!(provider.count("create", &p.uid().unwrap()), 3);
    eventually(5, "a warning event", || {
        server
            .store()
            .list_as::<k8s_openapi::api::events::v1::Event>()
            .iter()
            .any(|e| e.reason.as_deref() == Some("ProviderCreateFailed") && e.type_.as_deref() == Some("Warning"))
    })
    .await;
    running.stop().await;
}

/// Pods waiting out a retry cost no task each: the controller keeps every wait in one queue, so a
/// node with hundreds of pods in backoff (a cocoon outage) runs as many tasks as with one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_in_backoff_hold_no_task_each() {
    const PODS: usize = 200;
    let server = FakeApiServer::start().await;
    let provider = Arc::new(RecordingProvider::default());
    let mut cfg = config(&[]);
    // Every create fails, and the first retry is a minute away: all the pods sit in backoff.
    cfg.timings.retry_base = Duration::from_secs(60);
    cfg.timings.retry_max = Duration::from_secs(120);
    let running = start_node(&server, cfg, provider.clone());
    barrier(&server, &provider).await;
    let alive = || tokio::runtime::Handle::current().metrics().num_alive_tasks();
    let before = alive();
    provider
        .transient_create_failures
        .store(u32::MAX, std::sync::atomic::Ordering::SeqCst);
    // In batches, as an outage finds them, so that the Events and status writes of the failures
    // do not burst past the apiserver client's pool of connections (each is a task of its own).
    for batch in 0..PODS / 10 {
        let seeded: Vec<String> = (0..10)
            .map(|i| {
                let name = format!("down-{batch}-{i}");
                server.store().seed(&pod(&name, NODE)).unwrap().uid().unwrap()
            })
            .collect();
        eventually(30, "the batch's creates failed once", || {
            seeded.iter().all(|uid| provider.count("create", uid) == 1)
        })
        .await;
    }
    // The failures' Events and statuses are published by short tasks of their own: wait for
    // them to end, then the count must be back near where it was.
    eventually(30, "the tasks back to the count before the outage", || {
        alive() <= before + PODS / 10
    })
    .await;
    running.stop().await;
}

#[tokio::test]
async fn a_rejected_pod_is_published_failed_and_not_retried() {
    let server = FakeApiServer::start().await;
    let provider = Arc::new(RecordingProvider::default());
    *provider.reject_name.lock().unwrap() = Some("wrong-class".into());
    let running = start_node(&server, config(&[]), provider.clone());
    let p = server.store().seed(&pod("wrong-class", NODE)).unwrap();
    eventually(10, "failed", || {
        get(&server, "wrong-class").is_some_and(|p| phase(&p).as_deref() == Some("Failed"))
    })
    .await;
    let st = get(&server, "wrong-class").unwrap().status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("SnapshotCPUClassMismatch"));
    barrier(&server, &provider).await;
    // A retry would come from the backoff timer: watch for twice its longest delay (an
    // observation window, not a synchronisation).
    tokio::time::sleep(fast_timings().retry_max * 2).await;
    assert_eq!(provider.count("create", &p.uid().unwrap()), 1);
    running.stop().await;
}

#[tokio::test]
async fn failed_apiserver_writes_are_retried() {
    let server = FakeApiServer::start().await;
    let provider = Arc::new(RecordingProvider::default());
    let running = start_node(&server, config(&[]), provider.clone());
    server.inject_fault(Some(axum::http::Method::PATCH), "/pods/retry-me/status", 500, 2);
    server.store().seed(&pod("retry-me", NODE)).unwrap();
    eventually(10, "status published after two 500s", || {
        get(&server, "retry-me").is_some_and(|p| phase(&p).as_deref() == Some("Running"))
    })
    .await;
    let failures = server
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/retry-me/status") && r.status == 500)
        .count();
    assert_eq!(failures, 2);
    running.stop().await;
}
