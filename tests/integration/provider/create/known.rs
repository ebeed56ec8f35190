//! A warm create trusts what the daemon knows of the node (its VM table, the snapshots and
//! images its own calls saw) instead of asking cocoon. What changes behind its back between the
//! startup reconcile and the create is still handled safely: a VM of the pod's name is adopted,
//! never booted twice; a hibernated guest's snapshot is restored, never booted over; a clone
//! source that went away fails the create clearly, and the create asks again once it is back.

use super::*;

/// Warms the node: a first pod of `base` is up, so the daemon has reconciled and knows `base`
/// and its base image.
async fn warm(env: &Env) {
    create(
        env,
        &managed("agent-0", "vm-warm-0", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(env, "agent-0").await;
}

/// The VM table does not know the VM, so the create's clone is refused by name; the create
/// then asks cocoon and adopts it.
/// Lifecycle: L8.
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_made_behind_the_daemons_back_after_startup_is_adopted_not_booted_twice() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    warm(&env).await;
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
    warm(&env).await;
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
    warm(&env).await;
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
