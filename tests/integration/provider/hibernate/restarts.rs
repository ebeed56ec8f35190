//! A daemon restarted mid-hibernate resumes it or reports the finished state from the tag, and a
//! VM stopped behind a dead daemon's back with a hibernate owed is never saved cold over its tag.

use super::*;

/// Checklist rows: resume_test/StartupDispatchOwedWork
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_mid_hibernate_resumes_it() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-m").await;
    // The daemon dies while the save is in progress.
    env.sim.delay("snapshot save", Some(1), 1_500).unwrap();
    annotate(&env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(20, "hibernating", || {
        lifecycle(&env, "agent-0").as_deref() == Some("hibernating")
    })
    .await;
    d.kill().await;
    // The kill takes the daemon's cocoon children with it: no save finishes behind its back.
    eventually(20, "no snapshot save left running", || {
        env.sim.pids_of("snapshot save").unwrap().is_empty()
    })
    .await;
    assert!(vm_named(&env, "vm-m").await.is_some(), "the VM outlived the daemon");

    let d = start(&env, Options::default());
    hibernated(&env, "agent-0").await;
    assert!(tag_exists(&env, "vm-m").await);
    assert!(vm_named(&env, "vm-m").await.is_none());
    eventually(10, "ResumedAfterRestart event", || {
        events(&env, "agent-0")
            .iter()
            .any(|(r, n)| r == "ResumedAfterRestart" && n == "op=hibernate")
    })
    .await;
    d.kill().await;
}

/// Lifecycle: L54.
/// Checklist rows: create_test/StartupReconcileTracksHibernatedPodWithoutVM,
/// update_test/HibernateClearsVMIDBeforeRemove
#[tokio::test(flavor = "multi_thread")]
async fn a_restart_after_the_remove_reports_hibernated_from_the_tag() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-n").await;
    // The daemon dies during `vm rm`, after the push and the runtime clear; the VM goes anyway
    // (a real cocoon child outlives a crashed daemon and finishes the remove).
    env.sim.delay("vm rm", Some(1), 3_000).unwrap();
    annotate(&env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(20, "the id is cleared before the remove", || {
        annotation(&env, "agent-0", ID).is_none()
    })
    .await;
    d.kill().await;
    env.sim.flip_vm("vm-n", cocoon_sim::Flip::Deleted).unwrap();
    assert_eq!(lifecycle(&env, "agent-0").as_deref(), Some("hibernating"));

    let d = start(&env, Options::default());
    hibernated(&env, "agent-0").await;
    assert!(tag_exists(&env, "vm-n").await);
    assert_eq!(
        calls(&env, "snapshot save").len(),
        2,
        "the seed's and the hibernate's: nothing saved again"
    );
    d.kill().await;
}

/// A pod whose VM was stopped behind a dead daemon's back, with the hibernate asked for meanwhile.
async fn stopped_with_hibernate_owed(env: &Env, vm: &str, saved_first: bool) -> (String, Option<String>) {
    let d = start(env, Options::default());
    ready_pod(env, "agent-0", vm).await;
    d.kill().await;
    let id = vm_named(env, vm).await.unwrap().id;
    let mut saved = None;
    if saved_first {
        // The guest was saved and pushed before the host lost the VM's memory.
        env.runtime.snapshot_save(vm, &id).await.unwrap();
        oci(env)
            .client
            .push_snapshot(env.runtime.as_ref(), vm, vm, "hibernate", "base")
            .await
            .unwrap();
        saved = oci(env)
            .client
            .snapshot_config(vm, "hibernate")
            .await
            .unwrap()
            .map(|c| c.snapshot_id);
    }
    env.sim.flip_vm(vm, cocoon_sim::Flip::Stopped).unwrap();
    annotate(env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    (id, saved)
}

/// Checklist rows: resume_test/StartupResumeHibernateStartsVMWhoseRecordStillReadsRunning
#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_vm_whose_save_is_the_tag_is_removed_without_saving_a_cold_guest_over_it() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let (_, saved) = stopped_with_hibernate_owed(&env, "vm-z", true).await;
    let saves = calls(&env, "snapshot save").len();
    let d = start(&env, Options::default());
    hibernated(&env, "agent-0").await;
    assert_eq!(calls(&env, "snapshot save").len(), saves, "no new save");
    assert!(calls(&env, "vm start").is_empty(), "the stopped VM was not booted");
    let now = oci(&env)
        .client
        .snapshot_config("vm-z", "hibernate")
        .await
        .unwrap()
        .map(|c| c.snapshot_id);
    assert_eq!(now, saved, "the tag still holds the guest's own save");
    assert!(vm_named(&env, "vm-z").await.is_none());
    d.kill().await;
}

/// Checklist rows: resume_test/StartupResumeHibernateStartsVMWhoseRecordStillReadsRunning
#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_vm_without_a_saved_guest_is_booted_and_saved_before_it_goes() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let (id, _) = stopped_with_hibernate_owed(&env, "vm-y", false).await;
    let saves = calls(&env, "snapshot save").len();
    let d = start(&env, Options::default());
    hibernated(&env, "agent-0").await;
    assert!(
        calls(&env, "vm start").iter().any(|a| a.last() == Some(&id)),
        "booted so its disk can be saved"
    );
    assert_eq!(calls(&env, "snapshot save").len(), saves + 1);
    assert!(tag_exists(&env, "vm-y").await && vm_named(&env, "vm-y").await.is_none());
    d.kill().await;
}

/// A hibernate resumed after a restart that fails (its save) is owed a retry like any other:
/// the failure is reported on the pod (an Event) and the retry hibernates the guest.
/// Checklist rows: retry_test/AFailedResumedHibernateOwesARetry
#[tokio::test(flavor = "multi_thread")]
async fn a_resumed_hibernate_that_fails_is_retried() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-rr").await;
    // The save hangs until the daemon dies (however slow the machine), so the restart resumes it.
    env.sim.delay("snapshot save", Some(1), 120_000).unwrap();
    annotate(&env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(20, "the save under way", || {
        !env.sim.pids_of("snapshot save").unwrap().is_empty()
    })
    .await;
    d.kill().await;
    eventually(20, "no snapshot save left running", || {
        env.sim.pids_of("snapshot save").unwrap().is_empty()
    })
    .await;
    // The resumed hibernate's save fails once.
    fail_once(
        &env,
        "snapshot save",
        None,
        "Error: pause vm: cloud-hypervisor API timeout",
    );
    let saves = calls(&env, "snapshot save").len();
    let d = start(&env, slow_retries());
    eventually(30, "the resumed hibernate's failure reported", || {
        events(&env, "agent-0")
            .iter()
            .any(|(r, n)| r == "HibernateSnapshotFailed" && n.contains("snapshot save vm-rr"))
    })
    .await;
    hibernated(&env, "agent-0").await;
    assert!(
        calls(&env, "snapshot save").len() >= saves + 2,
        "the failed save, then the retry's"
    );
    assert!(tag_exists(&env, "vm-rr").await && vm_named(&env, "vm-rr").await.is_none());
    d.kill().await;
}

/// Deleting a hibernated pod (no seat release) drops what it left on the node: its local
/// snapshot and its lineage's fork snapshot.
/// Checklist rows: delete_test/SnapshotRetention
#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_hibernated_pod_drops_its_local_and_fork_snapshots() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-gone").await;
    hibernate_now(&env, "agent-0").await;
    assert!(
        env.sim.snapshot_dir("vm-gone").unwrap().is_some(),
        "the warm local copy"
    );
    delete(&env, "agent-0").await;
    eventually(30, "pod gone", || get(&env, "agent-0").is_none()).await;
    let removed: Vec<String> = calls(&env, "snapshot rm")
        .into_iter()
        .filter_map(|a| a.last().cloned())
        .collect();
    assert!(
        removed.contains(&"vm-gone".to_string()) && removed.contains(&"fork-vm-gone".to_string()),
        "{removed:?}"
    );
    assert!(
        env.sim.snapshot_dir("vm-gone").unwrap().is_none(),
        "the local copy is gone"
    );
    d.kill().await;
}
