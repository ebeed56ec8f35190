//! A fault at every step of a hibernate or a wake (the save, the push, the remove, the registry
//! down during verification, the pull, a deleted tag): the guest stays in its VM or in the
//! registry, nothing boots fresh, and the owed retry finishes the job.

use super::*;

/// Checklist rows: update_test/HibernateKeepsVMIDOnSaveFailure,
/// retry_test/AFailedHibernateIsRetriedWhenDueUntilItSucceeds
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_save_keeps_the_vm_running_and_the_retry_hibernates() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, slow_retries());
    ready_pod(&env, "agent-0", "vm-s").await;
    fail_once(
        &env,
        "snapshot save",
        None,
        "Error: pause vm: cloud-hypervisor API timeout",
    );
    annotate(&env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    wait_failed_with(&env, "agent-0", "snapshot save vm-s").await;
    assert!(
        vm_named(&env, "vm-s").await.is_some_and(|v| v.state.is_running()),
        "the VM keeps running"
    );
    assert!(
        annotation(&env, "agent-0", ID).is_some(),
        "its runtime annotations stay"
    );
    assert!(!tag_exists(&env, "vm-s").await);
    eventually(10, "HibernateSnapshotFailed event", || {
        has_event(&env, "agent-0", "HibernateSnapshotFailed")
    })
    .await;
    hibernated(&env, "agent-0").await;
    assert!(tag_exists(&env, "vm-s").await && vm_named(&env, "vm-s").await.is_none());
    d.kill().await;
}

/// Checklist rows: update_test/HibernateKeepsVMIDOnSaveFailure
#[tokio::test(flavor = "multi_thread")]
async fn a_push_to_a_dead_registry_keeps_the_vm_and_the_retry_pushes_once_it_is_back() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, slow_retries());
    ready_pod(&env, "agent-0", "vm-p").await;
    oci(&env).kill();
    annotate(&env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(30, "HibernatePushFailed event", || {
        has_event(&env, "agent-0", "HibernatePushFailed")
    })
    .await;
    // The Event is recorded just before the lifecycle annotation is written.
    eventually(30, "lifecycle failed", || {
        lifecycle(&env, "agent-0").as_deref() == Some("failed")
    })
    .await;
    assert!(
        vm_named(&env, "vm-p").await.is_some_and(|v| v.state.is_running()),
        "the guest is still in its VM"
    );
    assert!(
        annotation(&env, "agent-0", ID).is_some(),
        "its runtime annotations stay"
    );
    oci(&env).restart();
    hibernated(&env, "agent-0").await;
    assert!(tag_exists(&env, "vm-p").await && vm_named(&env, "vm-p").await.is_none());
    d.kill().await;
}

/// Lifecycle: L57, L58.
/// Checklist rows: update_test/HibernateRestoresVMIDOnRemoveFailure
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_remove_withdraws_the_tag_reapplies_the_runtime_and_the_retry_finishes() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, slow_retries());
    ready_pod(&env, "agent-0", "vm-r").await;
    let vm = vm_named(&env, "vm-r").await.unwrap();
    fail_once(&env, "vm rm", Some(&vm.id), "Error: vm busy: stop timed out");
    annotate(&env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(20, "HibernateRemoveFailed event", || {
        has_event(&env, "agent-0", "HibernateRemoveFailed")
    })
    .await;
    wait_failed_with(&env, "agent-0", "the hibernate tag was withdrawn").await;
    assert!(
        !tag_exists(&env, "vm-r").await,
        "a wake cannot restore a copy the running VM has moved past"
    );
    assert!(
        vm_named(&env, "vm-r").await.is_some_and(|v| v.state.is_running()),
        "the guest is in its VM"
    );
    assert_eq!(
        annotation(&env, "agent-0", ID).as_deref(),
        Some(vm.id.as_str()),
        "the runtime is re-applied"
    );
    hibernated(&env, "agent-0").await;
    assert!(tag_exists(&env, "vm-r").await, "the retry re-published the tag");
    assert!(vm_named(&env, "vm-r").await.is_none());
    d.kill().await;
}

/// Checklist rows: wakeverify_test/ResolveWakeSourceRegistryErrorFailsClosed
#[tokio::test(flavor = "multi_thread")]
async fn a_wake_fails_closed_while_the_registry_cannot_verify_the_local_copy() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, slow_retries());
    ready_pod(&env, "agent-0", "vm-v").await;
    hibernate_now(&env, "agent-0").await;
    oci(&env).kill();
    annotate(&env, "agent-0", &[(HIBERNATE, None)]).await;
    eventually(30, "wake failed", || {
        lifecycle(&env, "agent-0").as_deref() == Some("failed")
    })
    .await;
    assert!(
        vm_named(&env, "vm-v").await.is_none(),
        "no guest boots from an unverified copy, nor fresh"
    );
    assert!(
        env.sim.snapshot_dir("vm-v").unwrap().is_some(),
        "the local copy is kept"
    );
    oci(&env).restart();
    assert!(state_somewhere(&env, "vm-v").await);
    eventually(30, "woken once the registry answers", || is_up(&env, "agent-0")).await;
    assert_eq!(
        calls(&env, "vm clone").last().unwrap().last().map(String::as_str),
        Some("vm-v"),
        "from the now verified local copy"
    );
    d.kill().await;
}

/// Checklist rows: retry_test/AFailedWakeOwesARetry
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_pull_keeps_the_tag_boots_nothing_and_the_retry_wakes() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, slow_retries());
    ready_pod(&env, "agent-0", "vm-u").await;
    hibernate_now(&env, "agent-0").await;
    env.runtime.snapshot_remove_if_exists("vm-u").await.unwrap();
    env.sim
        .add_fault(Fault {
            verb: "snapshot import".into(),
            match_arg: None,
            times: Some(1),
            action: FaultAction::Die { after_bytes: 4096 },
        })
        .unwrap();
    annotate(&env, "agent-0", &[(HIBERNATE, None)]).await;
    eventually(30, "WakePullFailed event", || {
        has_event(&env, "agent-0", "WakePullFailed")
    })
    .await;
    assert!(vm_named(&env, "vm-u").await.is_none(), "nothing booted");
    assert!(tag_exists(&env, "vm-u").await, "the guest is still in the registry");
    eventually(30, "woken by the retry", || is_up(&env, "agent-0")).await;
    assert!(vm_named(&env, "vm-u").await.is_some());
    d.kill().await;
}

/// Checklist rows: wakeverify_test/ResolveWakeSourceNoTagDiscardsLocal
#[tokio::test(flavor = "multi_thread")]
async fn a_wake_whose_hibernate_tag_was_deleted_never_boots_a_fresh_guest() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, slow_retries());
    ready_pod(&env, "agent-0", "vm-t").await;
    hibernate_now(&env, "agent-0").await;
    oci(&env).client.delete_manifest("vm-t", "hibernate").await.unwrap();
    annotate(&env, "agent-0", &[(HIBERNATE, None)]).await;
    wait_failed_with(&env, "agent-0", "no hibernate snapshot exists").await;
    eventually(10, "HibernateSnapshotMissing event", || {
        has_event(&env, "agent-0", "HibernateSnapshotMissing")
    })
    .await;
    let failed_wakes = || d.provider.metrics().wake.with_label_values(&["failed"]).get();
    eventually(20, "the owed retry of the wake ran and failed too", || {
        failed_wakes() >= 2
    })
    .await;
    assert!(
        vm_named(&env, "vm-t").await.is_none(),
        "no fresh guest, not even after a retry"
    );
    assert!(
        calls(&env, "vm clone").len() == 1 && calls(&env, "vm run").len() == 1,
        "only the create's clone and the seed's run"
    );
    // Checklist row NoTagDiscardsLocal, kept on purpose (src/provider/DECISIONS.md, 11): the
    // local copy of the guest stays while its pod waits; the pod's delete drops it.
    assert!(
        env.runtime.snapshot_inspect("vm-t").await.is_ok(),
        "the local copy is kept while the wake waits for an operator"
    );
    delete(&env, "agent-0").await;
    eventually(60, "the pod is gone", || get(&env, "agent-0").is_none()).await;
    assert!(
        env.runtime.snapshot_inspect("vm-t").await.unwrap_err().is_not_found(),
        "the pod's delete dropped its local copy"
    );
    d.kill().await;
}

/// A retry owed to a failed hibernate that comes due while an update of the same pod is
/// hibernating it does not run beside the update: the pod controller runs one hook of a pod at
/// a time, so the due retry waits for the update; and the provider's retry hook, asked while
/// the update holds the pod's operation lock, yields at once (asks to be asked again) without
/// touching the VM. The update's hibernate settles what was owed: nothing runs after it either.
/// Checklist rows: retry_test/ARetryYieldsToAnUpdateInFlight
#[tokio::test(flavor = "multi_thread")]
async fn a_retry_due_while_an_update_hibernates_the_pod_yields_to_it() {
    use vk_cocoon::kubelet::{Next, Provider as _};
    const RETRY: Duration = Duration::from_secs(5);
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(
        &env,
        Options {
            timings: Timings {
                op_retry_min: RETRY,
                op_retry_max: RETRY * 2,
                ..fast_timings()
            },
            ..Default::default()
        },
    );
    ready_pod(&env, "agent-0", "vm-y").await;
    // The saves of the pod's VM (not the seed's).
    let saves = || {
        calls(&env, "snapshot save")
            .iter()
            .filter(|a| a.iter().any(|x| x == "vm-y"))
            .count()
    };
    let (key, uid) = ("default/agent-0", get(&env, "agent-0").unwrap().metadata.uid.unwrap());
    fail_once(
        &env,
        "snapshot save",
        None,
        "Error: pause vm: cloud-hypervisor API timeout",
    );
    annotate(&env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    wait_failed_with(&env, "agent-0", "snapshot save vm-y").await;
    let failed_at = std::time::Instant::now();
    // The failure is published by the hook; the retry is owed once the hook has returned it.
    eventually(10, "a retry is owed", || {
        d.provider.state().owed_retry_of(key, &uid).is_some()
    })
    .await;

    // The hibernate is asked for again (withdrawn, then asked): an update that hibernates, its
    // save slow enough for the retry to come due while it runs.
    annotate(&env, "agent-0", &[(HIBERNATE, Some("false"))]).await;
    eventually(10, "the daemon saw the hibernate withdrawn", || {
        d.provider.state().tracked(key).is_some_and(|t| {
            t.pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(HIBERNATE))
                .map(String::as_str)
                == Some("false")
        })
    })
    .await;
    env.sim.delay("snapshot save", Some(1), 10_000).unwrap();
    annotate(&env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(10, "the update's save started", || saves() == 2).await;
    assert!(
        failed_at.elapsed() < RETRY - Duration::from_millis(500),
        "the update began before the retry came due"
    );
    assert!(d.provider.state().owed_retry_of(key, &uid).is_some(), "still owed");

    // The retry hook asked now, beside the update: it yields.
    let pod = std::sync::Arc::new(get(&env, "agent-0").unwrap());
    let asked = tokio::time::timeout(Duration::from_secs(3), d.provider.requeue_pod(&pod))
        .await
        .expect("the retry hook yields at once");
    assert!(
        matches!(asked, Ok(Next::Requeue(_))),
        "asked to be asked again: {asked:?}"
    );
    assert_eq!(saves(), 2, "nothing ran beside the update");

    hibernated(&env, "agent-0").await;
    assert!(failed_at.elapsed() > RETRY, "the retry came due while the update ran");
    assert_eq!(
        saves(),
        2,
        "the failed save and the update's: the due retry ran no hibernate"
    );
    // The pod reads hibernated a moment before the update's hook settles the retry.
    eventually(10, "the update's hibernate settled the retry", || {
        d.provider.state().owed_retry_of(key, &uid).is_none()
    })
    .await;
    assert!(matches!(d.provider.requeue_pod(&pod).await, Ok(Next::Done)));
    assert!(tag_exists(&env, "vm-y").await && vm_named(&env, "vm-y").await.is_none());
    d.kill().await;
}
