//! The VM event stream against the simulator, including reconnects after the simulator is killed.

use crate::runtime_support;

use cocoon_sim::Flip;
use futures::StreamExt;
use runtime_support::harness;
use std::time::Duration;
use vk_cocoon::runtime::*;

async fn next(stream: &mut futures::stream::BoxStream<'static, WatchItem>) -> WatchItem {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("no watch item within 10 s")
        .expect("stream never ends")
}

async fn next_event(stream: &mut futures::stream::BoxStream<'static, WatchItem>) -> VmEvent {
    loop {
        if let WatchItem::Event(e) = next(stream).await {
            return e;
        }
    }
}

#[tokio::test]
async fn events_follow_changes_and_survive_a_killed_simulator() {
    let h = harness();
    h.sim.set_settings(|s| s.event_poll_ms = 30).unwrap();
    h.sim.add_image("img", "oci").unwrap();
    let c = &h.client;
    let a = c
        .run(&RunSpec {
            name: Some("a".into()),
            image: "img".into(),
            ..Default::default()
        })
        .await
        .unwrap();

    let mut stream = c.watch_events();
    let ev = next_event(&mut stream).await;
    assert_eq!(
        (ev.kind, ev.vm.id.as_str(), ev.vm.state.clone()),
        (EventKind::Added, a.id.as_str(), VmState::Running)
    );

    let b = c
        .run(&RunSpec {
            name: Some("b".into()),
            image: "img".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let ev = next_event(&mut stream).await;
    assert_eq!((ev.kind, ev.vm.name()), (EventKind::Added, "b"));

    h.sim.flip_vm("b", Flip::Stale).unwrap();
    let ev = next_event(&mut stream).await;
    assert_eq!(
        (ev.kind, ev.vm.id.as_str(), ev.vm.state.clone()),
        (EventKind::Modified, b.id.as_str(), VmState::StoppedStale)
    );

    c.remove(&a.id).await.unwrap();
    let ev = next_event(&mut stream).await;
    assert_eq!((ev.kind, ev.vm.id.as_str()), (EventKind::Deleted, a.id.as_str()));

    // Kill the simulator's event process: the stream reports it and reconnects.
    runtime_support::eventually(5, "event process registered", || {
        !h.sim.pids_of("vm status").unwrap().is_empty()
    })
    .await;
    assert_eq!(h.sim.kill_all("vm status").unwrap(), 1);
    match next(&mut stream).await {
        WatchItem::Disconnected { clean, retry_in, .. } => {
            assert!(!clean);
            // The initial backoff, jittered down by at most half (the daemon's retry schedule).
            assert!(
                (Duration::from_millis(25)..=Duration::from_millis(50)).contains(&retry_in),
                "{retry_in:?}"
            );
        }
        other => panic!("expected a disconnect, got {other:?}"),
    }
    let ev = next_event(&mut stream).await;
    assert_eq!(
        (ev.kind, ev.vm.id.as_str()),
        (EventKind::Added, b.id.as_str()),
        "a new connection lists every VM again"
    );

    // Dropping the stream stops the process.
    drop(stream);
    runtime_support::eventually(5, "event process gone after drop", || {
        h.sim.pids_of("vm status").unwrap().is_empty()
    })
    .await;
}

#[tokio::test]
async fn failing_starts_back_off_then_recover() {
    let h = harness();
    h.sim.set_settings(|s| s.event_poll_ms = 30).unwrap();
    h.sim.add_image("img", "oci").unwrap();
    h.client
        .run(&RunSpec {
            name: Some("a".into()),
            image: "img".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    h.sim
        .inject_failure("vm status", 3, "Error: meta store locked", 1)
        .unwrap();
    let mut stream = h.client.watch_events();
    let mut delays = Vec::new();
    let ev = loop {
        match next(&mut stream).await {
            WatchItem::Disconnected {
                clean,
                retry_in,
                reason,
            } => {
                assert!(!clean);
                assert!(reason.contains("meta store locked"), "{reason}");
                delays.push(retry_in.as_millis());
            }
            WatchItem::Event(e) => break e,
        }
    };
    // 1x, 2x, 4x the initial backoff, each jittered down by at most half.
    assert_eq!(delays.len(), 3, "{delays:?}");
    for (got, nominal) in delays.iter().zip([50, 100, 200]) {
        assert!(
            *got >= nominal / 2 && *got <= nominal,
            "{got} ms is not within [{}, {nominal}] ms: {delays:?}",
            nominal / 2
        );
    }
    assert_eq!(ev.vm.name(), "a");
}

#[tokio::test]
async fn clean_end_reconnects_after_the_fixed_delay() {
    let h = harness();
    h.sim.inject_output("vm status", 1, "").unwrap(); // exits 0 with no output: a clean end
    h.sim.add_image("img", "oci").unwrap();
    h.client
        .run(&RunSpec {
            name: Some("a".into()),
            image: "img".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut stream = h.client.watch_events();
    match next(&mut stream).await {
        WatchItem::Disconnected { clean, retry_in, .. } => assert!(clean && retry_in == Duration::from_millis(50)),
        other => panic!("{other:?}"),
    }
    assert_eq!(next_event(&mut stream).await.kind, EventKind::Added);
}
