//! The local snapshot reclaimer against cocoon-sim and the real registry: every rule, in use
//! never removed, a registry error keeps the snapshot, registry-less nodes do the local rules,
//! and the pass that runs on its own once the startup reconcile is done.

use std::time::Duration;

use crate::provider_support::*;
use vk_cocoon::provider::Timings;

const IMAGE: &str = "cocoonset.cocoonstack.io/image";

async fn snapshot_names(env: &Env) -> Vec<String> {
    let mut names: Vec<String> = env
        .runtime
        .snapshot_list(None)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    names.sort();
    names
}

async fn push_hibernate(env: &Env, local: &str, repo: &str) {
    env.oci
        .as_ref()
        .unwrap()
        .client
        .push_snapshot(env.runtime.as_ref(), local, repo, "hibernate", "base")
        .await
        .unwrap();
}

fn reclaimed(d: &Daemon, reason: &str) -> u64 {
    d.provider
        .metrics()
        .snapshot_reclaimed
        .with_label_values(&[reason])
        .get()
}

/// Checklist rows: gc_test/TheReclaimerDropsOnlyWhatNoPodOnTheNodeCanWakeFrom
#[tokio::test(flavor = "multi_thread")]
async fn the_reclaimer_drops_only_what_no_pod_on_the_node_can_wake_or_clone_from() {
    let env = env_with_oci().await;
    let img = "ghcr.io/x/base:1";
    seed_snapshot(&env, "base", img).await;
    for name in [
        "vk-golden",
        "vk-used",
        "vk-used-hibernate-import",
        "vk-gone-hibernate-import",
        "vk-notag",
        "fork-vk-notag",
        "vk-stale",
        "vk-current",
        "vk-unverifiable",
    ] {
        seed_snapshot(&env, name, img).await;
    }
    push_hibernate(&env, "vk-current", "vk-current").await;
    push_hibernate(&env, "vk-stale", "vk-stale").await;
    push_hibernate(&env, "vk-unverifiable", "vk-unverifiable").await;
    // A newer local save of vk-stale than its tag: the tag's id no longer matches.
    seed_snapshot(&env, "vk-stale", img).await;

    let d = start(&env, Options::default());
    // Pods in use: one whose VM is vk-used, one cloned from vk-golden. vk-used's import is a
    // leftover: its pod has its VM, so no wake clones from it any more (a crash after the clone
    // of a wake leaves one behind).
    create(&env, &managed("p-used", "vk-used", &[(IMAGE, "base")])).await;
    create(&env, &managed("p-golden", "vm-golden", &[(IMAGE, "vk-golden")])).await;
    eventually(30, "pods up", || {
        lifecycle(&env, "p-used").as_deref() == Some("ready") && lifecycle(&env, "p-golden").as_deref() == Some("ready")
    })
    .await;

    assert_eq!(d.provider.reclaim_snapshots().await, 4);
    assert_eq!(
        snapshot_names(&env).await,
        ["base", "vk-current", "vk-golden", "vk-unverifiable", "vk-used",],
        "not ours, in use by a pod (its VM, its image), and current are kept"
    );
    assert_eq!(
        reclaimed(&d, "stale_import"),
        2,
        "both imports: no pod is waking from either"
    );
    assert_eq!(
        reclaimed(&d, "no_hibernate_tag"),
        1,
        "vk-notag, and fork-vk-notag with it"
    );
    assert_eq!(reclaimed(&d, "stale_id"), 1);

    // The registry down: nothing can be verified, so nothing verifiable is removed.
    seed_snapshot(&env, "vk-notag", img).await;
    env.oci.as_ref().unwrap().kill();
    assert_eq!(d.provider.reclaim_snapshots().await, 0);
    assert!(snapshot_names(&env).await.contains(&"vk-notag".to_string()));
    env.oci.as_ref().unwrap().restart();

    // A pod deleted: its VM's snapshot is no longer in use, and without a tag it goes.
    delete(&env, "p-used").await;
    eventually(30, "p-used gone", || get(&env, "p-used").is_none()).await;
    seed_snapshot(&env, "vk-used", img).await;
    // The registry answers again once its process is back: the pass that verifies removes both.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut removed = 0;
    while removed < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the reclaimer removed {removed} of 2"
        );
        removed += d.provider.reclaim_snapshots().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let left = snapshot_names(&env).await;
    assert!(!left.contains(&"vk-used".to_string()), "{left:?}");
    assert!(!left.contains(&"vk-notag".to_string()), "{left:?}");
    assert!(left.contains(&"vk-golden".to_string()), "still in use: {left:?}");
    drop(d);
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_registry_less_node_the_reclaimer_runs_by_itself_and_does_the_local_rules_only() {
    let env = env(false).await;
    let img = "ghcr.io/x/base:1";
    for name in ["vk-a-hibernate-import", "vk-b"] {
        seed_snapshot(&env, name, img).await;
    }
    let d = start(
        &env,
        Options {
            timings: Timings {
                reclaim_interval: Some(Duration::from_millis(200)),
                ..fast_timings()
            },
            ..Default::default()
        },
    );
    eventually(30, "the leftover import reclaimed after the startup reconcile", || {
        env.sim.snapshot_dir("vk-a-hibernate-import").unwrap().is_none()
    })
    .await;
    assert_eq!(snapshot_names(&env).await, ["vk-b"], "nothing to verify against: kept");
    assert_eq!(reclaimed(&d, "stale_import"), 1);
}
