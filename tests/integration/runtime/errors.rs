//! Error classes, timeouts, cancellation and concurrency of the cocoon runtime client.

use crate::runtime_support;

use runtime_support::{eventually, harness, harness_with};
use std::time::{Duration, Instant};
use vk_cocoon::runtime::*;

const IMG: &str = "img:1";

#[tokio::test]
async fn stderr_is_classified() {
    let h = harness();
    let c = &h.client;
    h.sim.add_image(IMG, "oci").unwrap();
    c.run(&RunSpec {
        name: Some("a".into()),
        image: IMG.into(),
        ..Default::default()
    })
    .await
    .unwrap();

    h.sim
        .inject_failure(
            "vm inspect",
            1,
            "Error: dial unix /run/cocoon.sock: connection refused",
            1,
        )
        .unwrap();
    let e = c.inspect("a").await.unwrap_err();
    assert!(e.is_inconclusive() && !e.is_not_found(), "{e}");
    assert!(matches!(&e, RuntimeError::Command { code: Some(1), stderr, .. } if stderr.contains("connection refused")));
    c.inspect("a").await.expect("the fault was used up");

    h.sim
        .inject_failure("vm inspect", 1, "Error: inspect: NO SUCH VM", 1)
        .unwrap();
    assert!(
        c.inspect("a").await.unwrap_err().is_vm_not_found(),
        "matching is case-insensitive"
    );

    h.sim
        .inject_failure("vm rm", 1, "Error: something else broke", 2)
        .unwrap();
    let e = c.remove("a").await.unwrap_err();
    assert!(
        matches!(e, RuntimeError::Command { code: Some(2), .. }),
        "only not-found counts as absent: {e}"
    );

    h.sim
        .inject_failure("snapshot save", 1, "Error: snapshot name \"s\" already exists", 1)
        .unwrap();
    c.snapshot_save("s", "a")
        .await
        .expect("preflight collision: rm by name (absent), then save");
    assert!(c.snapshot_inspect("s").await.is_ok());

    h.sim
        .inject_failure("snapshot rm", 1, "Error: rm: resolve \"s\": no such snapshot", 1)
        .unwrap();
    c.snapshot_remove_if_exists("s").await.unwrap();

    h.sim
        .inject_output("vm reconcile-stale-create", 1, "{\"id\":\"x\"}\n")
        .unwrap();
    let e = c.reconcile_stale_create("a").await.unwrap_err();
    assert!(
        matches!(e, RuntimeError::Decode { .. }),
        "empty outcome is an error: {e}"
    );

    h.sim
        .inject_output("vm clone", 1, "{\"id\":\"\",\"state\":\"running\"}\n")
        .unwrap();
    let e = c
        .clone_vm(&CloneSpec {
            name: None,
            network: None,
            no_direct_io: false,
            pull: false,
            restore_mode: None,
            nics: None,
            cpu_policy: CpuPolicy::default(),
            backend: Backend::CloudHypervisor,
            source: CloneSource::Snapshot("s".into()),
        })
        .await
        .unwrap_err();
    assert!(matches!(e, RuntimeError::EmptyRecord { .. }), "{e}");

    let e = c.inspect("--force").await.unwrap_err();
    assert!(
        matches!(e, RuntimeError::InvalidRequest(_)),
        "refs that look like flags are refused: {e}"
    );
}

#[tokio::test]
async fn missing_binary_is_a_spawn_error() {
    let h = harness_with(|cfg| cfg.bin = "/nonexistent/cocoon".into());
    let e = h.client.list().await.unwrap_err();
    assert!(matches!(e, RuntimeError::Spawn { .. }), "{e}");
    assert!(
        e.to_string().contains("VK_COCOON_BIN"),
        "the message says what to check: {e}"
    );
}

#[tokio::test]
async fn timeout_kills_the_process() {
    let h = harness_with(|cfg| cfg.timeouts.query = Duration::from_millis(400));
    h.sim.delay("vm list", Some(1), 10_000).unwrap();
    let t = Instant::now();
    let e = h.client.list().await.unwrap_err();
    assert!(matches!(e, RuntimeError::Timeout { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    eventually(5, "the timed-out cocoon process is gone", || {
        h.sim.pids_of("vm list").unwrap().is_empty()
    })
    .await;
    h.client.list().await.expect("next call works");
}

#[tokio::test]
async fn dropping_a_call_kills_its_process() {
    let h = harness();
    h.sim.delay("vm inspect", Some(1), 10_000).unwrap();
    let c = h.client.clone();
    let call = tokio::spawn(async move { c.inspect("x").await });
    eventually(5, "the call is running", || {
        !h.sim.pids_of("vm inspect").unwrap().is_empty()
    })
    .await;
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    eventually(5, "the cancelled cocoon process is gone", || {
        h.sim.pids_of("vm inspect").unwrap().is_empty()
    })
    .await;

    // The same through a select/timeout around the future.
    h.sim.delay("snapshot list", Some(1), 10_000).unwrap();
    let r = tokio::time::timeout(Duration::from_millis(300), h.client.snapshot_list(None)).await;
    assert!(r.is_err());
    eventually(5, "the dropped cocoon process is gone", || {
        h.sim.pids_of("snapshot list").unwrap().is_empty()
    })
    .await;
}

#[tokio::test]
async fn concurrent_calls() {
    let h = harness();
    h.sim.add_image(IMG, "oci").unwrap();
    let runs = (0..8).map(|i| {
        let c = h.client.clone();
        async move {
            c.run(&RunSpec {
                name: Some(format!("vm-{i}")),
                image: IMG.into(),
                ..Default::default()
            })
            .await
        }
    });
    let vms: Vec<_> = futures::future::join_all(runs)
        .await
        .into_iter()
        .collect::<Result<_>>()
        .unwrap();
    let mut ids: Vec<_> = vms.iter().map(|v| v.id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 8);
    assert_eq!(h.client.list().await.unwrap().len(), 8);

    let saves = vms.iter().map(|v| {
        let c = h.client.clone();
        let id = v.id.clone();
        async move { c.snapshot_save(&format!("snap-{id}"), &id).await }
    });
    futures::future::join_all(saves)
        .await
        .into_iter()
        .collect::<Result<Vec<_>>>()
        .unwrap();
    assert_eq!(h.client.snapshot_list(None).await.unwrap().len(), 8);

    // Same snapshot name from many callers: the save dance converges to exactly one snapshot of that name.
    let same = vms.iter().take(4).map(|v| {
        let c = h.client.clone();
        let id = v.id.clone();
        async move { c.snapshot_save("shared", &id).await }
    });
    let results = futures::future::join_all(same).await;
    assert!(results.iter().any(|r| r.is_ok()), "{results:?}");
    let names: Vec<_> = h
        .client
        .snapshot_list(None)
        .await
        .unwrap()
        .into_iter()
        .filter(|s| s.name == "shared")
        .collect();
    assert_eq!(names.len(), 1);
}
