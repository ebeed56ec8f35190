//! A warm create trusts what the daemon knows of the node (its VM table, the snapshots and
//! images its own calls saw) instead of asking cocoon. What changes behind its back between the
//! startup reconcile and the create is still handled safely: a VM of the pod's name is adopted,
//! never booted twice; a hibernated guest's snapshot is restored, never booted over; a clone
//! source that went away fails the create clearly, and the create asks again once it is back.

use super::*;

/// Warms the node: a first pod of `base` is up and the startup's background `snapshot list`
/// landed, so the daemon has reconciled and knows the node's snapshots and `base`'s base image.
async fn warm(env: &Env, d: &Daemon) {
    create(
        env,
        &managed("agent-0", "vm-warm-0", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(env, "agent-0").await;
    eventually(60, "the startup snapshot list landed", || {
        d.provider.snapshot_list_landed()
    })
    .await;
}

/// The VM table does not know the VM, so the create's clone is refused by name; the create
/// then asks cocoon and adopts it.
/// Lifecycle: L8.
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_made_behind_the_daemons_back_after_startup_is_adopted_not_booted_twice() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    warm(&env, &d).await;
    // Behind the daemon's back, after its startup reconcile: a VM of the next pod's name.
    let theirs = clone_direct_on(&env.runtime, "base", "vm-x", None).await;
    create(
        &env,
        &managed("agent-x", "vm-x", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-x").await;
    assert_eq!(
        annotation(&env, "agent-x", ID_KEY).as_deref(),
        Some(theirs.id.as_str()),
        "the pod runs on the VM that was there"
    );
    let named: Vec<_> = vms(&env).await.into_iter().filter(|v| v.name() == "vm-x").collect();
    assert_eq!(named.len(), 1, "one VM of the name: {named:?}");
    assert_eq!(named[0].id, theirs.id, "the VM that was there, still running");
    d.kill().await;
}

/// The kept snapshot list does not know the snapshot; the hibernate evidence is asked anyway.
#[tokio::test(flavor = "multi_thread")]
async fn a_hibernate_snapshot_brought_behind_the_daemons_back_is_restored_not_booted_over() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    warm(&env, &d).await;
    // Behind the daemon's back, after its startup `snapshot list`: a hibernated guest's state
    // under its VM name (registry-less, the local snapshot is the evidence).
    seed_snapshot(&env, "vm-h", "ghcr.io/x/base:1").await;
    let saved = env.runtime.snapshot_inspect("vm-h").await.unwrap();
    create(
        &env,
        &managed("agent-h", "vm-h", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-h").await;
    let clone = calls(&env, "vm clone")
        .into_iter()
        .find(|a| a.iter().any(|x| x == "vm-h"))
        .expect("the pod's clone");
    assert_eq!(
        clone.last().map(String::as_str),
        Some("vm-h"),
        "restored from the hibernate snapshot, not booted from base: {clone:?}"
    );
    assert!(has_event(&env, "agent-h", "HibernateSnapshotExists"));
    assert_eq!(
        env.runtime.snapshot_inspect("vm-h").await.unwrap().id,
        saved.id,
        "the hibernated state is kept"
    );
    d.kill().await;
}

/// The failed clone forgets the snapshot it trusted, so the retry asks for it.
#[tokio::test(flavor = "multi_thread")]
async fn a_clone_source_removed_behind_the_daemons_back_fails_clearly_then_is_asked_for_again() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    warm(&env, &d).await;
    // Behind the daemon's back: the snapshot it knows goes.
    env.runtime.snapshot_remove_if_exists("base").await.unwrap();
    create(
        &env,
        &managed("agent-1", "vm-one", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    // The clone from the known snapshot fails; the retry asks and finds it gone.
    wait_failed_with(&env, "agent-1", "snapshot base is not on this node").await;
    assert!(vm_named(&env, "vm-one").await.is_none(), "nothing booted");
    // Brought back: the next retry finds it and the pod comes up from it.
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    wait_ready(&env, "agent-1").await;
    assert!(vm_named(&env, "vm-one").await.is_some());
    d.kill().await;
}

/// The startup's `snapshot list` runs in the background after the reconcile, so a create can
/// come before it lands: nothing is known of the node's snapshots then, and the create asks
/// cocoon for its image's snapshot (and for the fork snapshot to drop) instead of taking it
/// for absent, and clones from the snapshot that is there.
#[tokio::test(flavor = "multi_thread")]
async fn a_create_before_the_startup_snapshot_list_lands_asks_for_the_snapshot_and_clones_it() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    // The startup's list is held past the create (a slow cocoon on a busy node; within the
    // tests' 20 s query timeout, so it is a slow answer, not a failed one).
    env.sim.delay("snapshot list", Some(1), 15_000).unwrap();
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-early", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    assert!(
        !d.provider.snapshot_list_landed(),
        "the create came before the startup's snapshot list landed"
    );
    assert_eq!(
        calls(&env, "snapshot list").len(),
        1,
        "the startup's list was started (and is still held)"
    );
    let asked: Vec<String> = calls(&env, "snapshot inspect")
        .into_iter()
        .filter_map(|a| a.get(2).cloned())
        .collect();
    assert!(
        asked.contains(&"base".to_string()),
        "the clone source was asked for: {asked:?}"
    );
    let clone = calls(&env, "vm clone")
        .into_iter()
        .find(|a| a.iter().any(|x| x == "vm-early"))
        .expect("the pod's clone");
    assert_eq!(
        clone.last().map(String::as_str),
        Some("base"),
        "cloned from base: {clone:?}"
    );
    assert!(
        calls(&env, "snapshot rm")
            .iter()
            .any(|a| a.last().map(String::as_str) == Some("fork-vm-early")),
        "a fork snapshot not known absent is dropped, not assumed gone"
    );
    d.kill().await;
}

/// With the reclaimer on, its first pass is the startup's list of the local snapshots: the node
/// starting reads them once, not once for the startup and once more for the reclaimer at the
/// same moment, and what the pass listed is what the creates know.
#[tokio::test(flavor = "multi_thread")]
async fn with_the_reclaimer_on_the_startup_lists_the_local_snapshots_once() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    // A leftover import: the first pass removes it, which shows the pass ran to its end.
    seed_snapshot(&env, "vk-gone-hibernate-import", "ghcr.io/x/base:1").await;
    let d = start(
        &env,
        Options {
            timings: vk_cocoon::provider::Timings {
                // One pass in the test's time: the first, once the startup reconcile is done.
                reclaim_interval: Some(std::time::Duration::from_secs(3600)),
                ..fast_timings()
            },
            ..Default::default()
        },
    );
    eventually(30, "the reclaimer's first pass removed the leftover import", || {
        env.sim.snapshot_dir("vk-gone-hibernate-import").unwrap().is_none()
    })
    .await;
    assert!(
        d.provider.snapshot_list_landed(),
        "the reclaimer's list is the node's snapshot list"
    );
    assert_eq!(
        calls(&env, "snapshot list").len(),
        1,
        "one `snapshot list` at startup with the reclaimer on"
    );
    // What the list brought serves the first create: its clone source is not asked for.
    create(
        &env,
        &managed("agent-0", "vm-warm-0", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    let asked: Vec<String> = calls(&env, "snapshot inspect")
        .into_iter()
        .filter_map(|a| a.get(2).cloned())
        .collect();
    assert!(
        !asked.contains(&"base".to_string()),
        "base was known from the list: {asked:?}"
    );
    d.kill().await;
}
