use super::*;
use crate::provider::lifecycle::{self, Dropped, Intent, LifecycleState};

fn pod(uid: &str) -> Arc<Pod> {
    let mut p = Pod::default();
    p.metadata.uid = Some(uid.into());
    Arc::new(p)
}

fn intent(uid: &str, state: LifecycleState) -> Intent {
    Intent {
        uid: uid.into(),
        state,
        generation: 0,
        message: String::new(),
    }
}

fn vm(id: &str) -> VmRecord {
    VmRecord {
        id: id.into(),
        ..Default::default()
    }
}

#[test]
fn a_stale_incarnation_cannot_write_after_a_new_one_claims_the_key() {
    let s = Table::default();
    s.track("ns/p", &pod("u1"), "vm");
    s.stage_intent("ns/p", intent("u1", LifecycleState::Creating), None)
        .unwrap();
    s.track("ns/p", &pod("u2"), "vm");
    assert_eq!(
        s.intent("ns/p"),
        None,
        "the old incarnation's intent is dropped on claim"
    );
    assert_eq!(
        s.stage_intent("ns/p", intent("u1", LifecycleState::Failed), None),
        Err(Dropped::OtherIncarnation)
    );
    s.stage_intent("ns/p", intent("u2", LifecycleState::Ready), None)
        .unwrap();
    let t = s.tracked("ns/p").unwrap();
    assert_eq!(t.pod.metadata.annotations.as_ref().unwrap()[lifecycle::STATE], "ready");
}

#[test]
fn vms_index_by_name_and_forget_clears_everything_of_that_incarnation() {
    let s = Table::default();
    s.track("ns/p", &pod("u1"), "vm");
    assert!(!s.set_vm("ns/p", "u1", vm("id1")), "not before the pod holds the name");
    s.take_name("vm", "ns/p", "u1").unwrap();
    assert!(!s.set_vm("ns/p", "u0", vm("x")));
    assert!(s.set_vm("ns/p", "u1", vm("id1")));
    assert_eq!(s.vm_by_name("vm").unwrap().id, "id1");
    assert_eq!(s.pod_of_vm("id1", "").map(|(k, _)| k).as_deref(), Some("ns/p"));
    s.stage_intent("ns/p", intent("u1", LifecycleState::Ready), None)
        .unwrap();
    s.forget("ns/p", "u1", "vm");
    assert!(s.tracked("ns/p").is_none() && s.vm_by_name("vm").is_none() && s.intent("ns/p").is_none());
    assert_eq!(s.records(), 0, "nothing of the pod is left");
}

#[test]
fn an_owed_retry_is_dropped_with_its_incarnation() {
    let s = Table::default();
    s.track("ns/p", &pod("u1"), "vm");
    let schedule = Schedule::backoff(Duration::from_secs(15), Duration::from_secs(300));
    s.owe_retry("ns/p", "u1", schedule);
    assert_eq!(s.owed_retry_of("ns/p", "u1").map(|r| r.schedule), Some(schedule));
    s.track("ns/p", &pod("u2"), "vm");
    assert!(
        s.owed_retry_of("ns/p", "u2").is_none(),
        "owed only to the incarnation that failed"
    );
    s.owe_retry("ns/p", "u2", schedule);
    s.forget("ns/p", "u2", "vm");
    assert!(s.owed_retry("ns/p").is_none(), "forgetting the pod drops its retry");
    assert_eq!(s.records(), 0, "and the record with it");
}

#[test]
fn the_delete_fence_admits_one() {
    let s = Table::default();
    assert!(s.begin_delete("k"));
    assert!(!s.begin_delete("k"));
    s.end_delete("k");
    assert!(s.begin_delete("k"));
}

#[tokio::test]
async fn the_operation_lock_is_one_per_pod_and_goes_with_its_record() {
    let s = Table::default();
    s.track("ns/p", &pod("u1"), "vm");
    let held = s.lock_op("ns/p").await;
    assert!(s.try_lock_op("ns/p").is_none(), "one operation at a time");
    assert!(s.try_lock_op("ns/q").is_some(), "another pod's lock is its own");
    drop(held);
    assert!(s.try_lock_op("ns/p").is_some());
    s.forget("ns/p", "u1", "vm");
    assert_eq!(s.records(), 0, "a forgotten pod leaves no lock behind");
    // A lock taken for a pod the table does not know (a delete of an untracked pod) goes too.
    drop(s.lock_op("ns/gone").await);
    assert_eq!(s.records(), 0);
    // While held, the record stays even when everything else of it is forgotten.
    s.track("ns/p", &pod("u1"), "vm");
    let held = s.lock_op("ns/p").await;
    s.forget("ns/p", "u1", "vm");
    assert_eq!(s.records(), 1);
    drop(held);
    assert_eq!(s.records(), 0);
}

#[test]
fn records_of_fences_guest_work_and_failed_creates_are_pruned() {
    let s = Table::default();
    assert!(s.claim_resume("ns/a"));
    assert!(!s.claim_resume("ns/a"));
    s.release_resume("ns/a");
    s.begin_delete("ns/b");
    s.end_delete("ns/b");
    let work = s.begin_guest_work("ns/c", "u1");
    s.end_guest_work("ns/c", &work);
    assert_eq!(s.records(), 0);
    // A failed create keeps its intent (re-flushed later), then the next incarnation replaces it.
    s.track("ns/d", &pod("u1"), "vm");
    s.stage_intent("ns/d", intent("u1", LifecycleState::Failed), Some(&pod("u1")))
        .unwrap();
    s.untrack("ns/d", "u1");
    assert_eq!(s.unflushed().len(), 1);
    s.drop_intent("ns/d", "u1");
    assert_eq!(s.records(), 0);
}

#[test]
fn an_evicted_incarnation_keeps_its_final_status_until_a_new_one_claims_the_key() {
    let s = Table::default();
    s.track("ns/p", &pod("u1"), "vm");
    s.take_name("vm", "ns/p", "u1").unwrap();
    s.set_vm("ns/p", "u1", vm("id1"));
    s.evicted("ns/p", "u1", ProviderPodStatus::failed("VMGone", "gone"));
    assert!(s.tracked("ns/p").is_none() && s.vm_count() == 0);
    assert_eq!(
        s.terminal_status("ns/p", "u1").unwrap().reason.as_deref(),
        Some("VMGone")
    );
    assert!(s.terminal_status("ns/p", "u2").is_none());
    s.track("ns/p", &pod("u2"), "vm");
    assert!(s.terminal_status("ns/p", "u1").is_none());
}

#[test]
fn the_watchers_memory_lives_on_the_vms_row() {
    let s = Table::default();
    s.track("ns/p", &pod("u1"), "vm");
    s.take_name("vm", "ns/p", "u1").unwrap();
    s.set_vm("ns/p", "u1", vm("id1"));
    assert!(s.begin_vm_event("id1") && !s.begin_vm_event("id1"));
    s.end_vm_event("id1");
    assert!(s.begin_recheck("id1") && !s.begin_recheck("id1"));
    s.end_recheck("id1");
    let at = Instant::now();
    s.record_restart("id1", at);
    assert_eq!(s.last_restart("id1"), Some(at));
    assert!(s.refresh_vm("ns/p", "u1", vm("id1")));
    assert_eq!(s.last_restart("id1"), Some(at), "a refresh keeps it");
    assert!(!s.refresh_vm("ns/p", "u1", vm("id2")), "another VM is not a refresh");
    s.detach_vm("ns/p", "u1", true);
    assert!(s.tracked("ns/p").unwrap().hibernated);
    assert_eq!(s.last_restart("id1"), None, "gone with its VM");
    assert!(
        !s.begin_vm_event("id1"),
        "no events are handled for a VM the table lost"
    );
}

#[test]
fn a_tracked_pod_is_the_cores_object_until_the_provider_writes_and_again_after_the_echo() {
    let s = Table::default();
    let watched = pod("u1");
    s.track("ns/p", &watched, "vm");
    assert!(
        Arc::ptr_eq(&s.tracked("ns/p").unwrap().pod, &watched),
        "claimed without a copy"
    );

    // A lifecycle write: the provider's view gains the annotations, the core's object does not.
    let staged = s
        .stage_intent("ns/p", intent("u1", LifecycleState::Creating), Some(&watched))
        .unwrap();
    let own = s.tracked("ns/p").unwrap().pod;
    assert!(!Arc::ptr_eq(&own, &watched));
    assert_eq!(own.metadata.annotations.as_ref().unwrap()[lifecycle::STATE], "creating");
    assert!(
        watched.metadata.annotations.is_none(),
        "the core's object is left as it was"
    );
    assert_eq!(
        s.unflushed().len(),
        1,
        "an unflushed intent keeps its object for the re-flush"
    );

    // Flushed, then echoed by the watch: one object again, and the intent keeps none.
    s.mark_flushed("ns/p", &staged);
    assert!(s.unflushed().is_empty());
    let echoed = {
        let mut p = (*own).clone();
        p.metadata.resource_version = Some("2".into());
        Arc::new(p)
    };
    s.refresh("ns/p", &echoed);
    drop(own);
    assert!(Arc::ptr_eq(&s.tracked("ns/p").unwrap().pod, &echoed));
    assert_eq!(
        Arc::strong_count(&echoed),
        2,
        "held by the caller and the claim, by nothing else"
    );
}

#[test]
fn the_echo_of_a_write_is_shared_and_a_change_the_provider_has_not_seen_is_not() {
    let s = Table::default();
    let watched = pod("u1");
    s.track("ns/p", &watched, "vm");
    s.stage_intent("ns/p", intent("u1", LifecycleState::Creating), Some(&watched))
        .unwrap();
    let own = s.tracked("ns/p").unwrap().pod;
    let version = |from: &Pod, rv: &str, edit: &dyn Fn(&mut Pod)| {
        let mut p = from.clone();
        p.metadata.resource_version = Some(rv.into());
        edit(&mut p);
        Arc::new(p)
    };

    // A status echo that lands before the annotation write's: the provider's copy keeps its write.
    let status_echo = version(&watched, "2", &|p| p.status = Some(Default::default()));
    assert!(!s.share_echo("ns/p", &status_echo));
    assert!(Arc::ptr_eq(&s.tracked("ns/p").unwrap().pod, &own));

    // The write's echo (plus a newer status): the same view, so the watch's object is kept.
    let echo = version(&own, "3", &|p| p.status = Some(Default::default()));
    assert!(s.share_echo("ns/p", &echo));
    assert!(Arc::ptr_eq(&s.tracked("ns/p").unwrap().pod, &echo));

    // A label edit by a user is update_pod's to take in, not the echo's.
    let relabelled = version(&echo, "4", &|p| {
        p.metadata.labels = Some([("tier".to_string(), "gold".to_string())].into());
    });
    assert!(!s.share_echo("ns/p", &relabelled));
    assert!(Arc::ptr_eq(&s.tracked("ns/p").unwrap().pod, &echo));

    // Another incarnation's object is never taken for this one's.
    assert!(!s.share_echo("ns/p", &version(&echo, "5", &|p| p.metadata.uid = Some("u2".into()))));
}

#[test]
fn a_vm_name_is_held_by_one_pod_and_no_other_pod_reaches_its_row() {
    let s = Table::default();
    s.track("a/web", &pod("u1"), "vm-a");
    s.take_name("vm-a", "a/web", "u1").unwrap();
    assert!(s.set_vm("a/web", "u1", vm("id-a")));

    // Another pod naming the same VM: refused while the holder exists.
    s.track("b/evil", &pod("u9"), "vm-a");
    assert_eq!(
        s.name_claim("vm-a", "b/evil"),
        NameClaim::Other {
            holder: Holder::new("a/web", "u1"),
            live: true
        }
    );
    assert_eq!(s.take_name("vm-a", "b/evil", "u9"), Err(Holder::new("a/web", "u1")));
    assert!(!s.set_vm("b/evil", "u9", vm("id-a")));
    // Its forget (a delete of the pod) leaves the holder's row, and its release does nothing.
    s.forget("b/evil", "u9", "vm-a");
    s.release_name("b/evil", "vm-a");
    assert_eq!(s.vm_by_name("vm-a").unwrap().id, "id-a");
    assert!(s.holds("a/web", "vm-a"));
    // A ref another pod resolves to it: by id, by name, by a prefix of 3 or more.
    for reference in ["id-a", "vm-a", "id-"] {
        assert_eq!(
            s.foreign_vm_of_ref(reference, "b/evil").as_deref(),
            Some("vm-a"),
            "{reference}"
        );
    }
    assert_eq!(s.foreign_vm_of_ref("id", "b/evil"), None, "too short a prefix");
    assert_eq!(s.foreign_vm_of_ref("id-a", "a/web"), None, "its own");

    // A recreated pod of the same namespace and name is the same holder.
    s.forget("a/web", "u1", "vm-a");
    assert_eq!(s.name_claim("vm-a", "a/web"), NameClaim::Own);
    // Once the holder's pod is gone, another pod may be told about it (the policy decides).
    assert_eq!(
        s.name_claim("vm-a", "b/evil"),
        NameClaim::Other {
            holder: Holder::new("a/web", "u1"),
            live: false
        }
    );
    s.release_name("a/web", "vm-a");
    assert_eq!(s.name_claim("vm-a", "b/evil"), NameClaim::Free);
}

#[test]
fn a_refresh_with_the_version_the_copy_was_made_from_keeps_the_providers_own_writes() {
    let s = Table::default();
    let listed = {
        let mut p = (*pod("u1")).clone();
        p.metadata.resource_version = Some("7".into());
        Arc::new(p)
    };
    s.track("ns/p", &listed, "vm");
    let done = BTreeMap::from([(
        "vm.cocoonstack.io/post-clone-state".to_string(),
        Some("done".to_string()),
    )]);
    s.set_annotations("ns/p", "u1", &done);
    let marker = |s: &Table| {
        s.tracked("ns/p")
            .unwrap()
            .pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("vm.cocoonstack.io/post-clone-state").cloned())
    };

    // The version the startup listed, handed to CreatePod after the resumed fixup finished.
    s.refresh("ns/p", &listed);
    assert_eq!(marker(&s).as_deref(), Some("done"), "the fixup's own marker is kept");

    // A newer version from the watch replaces the copy.
    let newer = {
        let mut p = (*listed).clone();
        p.metadata.resource_version = Some("8".into());
        Arc::new(p)
    };
    s.refresh("ns/p", &newer);
    assert!(Arc::ptr_eq(&s.tracked("ns/p").unwrap().pod, &newer));
}

/// A CreatePod may carry a copy older than the one the table holds (the pod controller queued
/// the version the startup listed; the watch meanwhile delivered the echo of the provider's own
/// `ready`). Refreshing from it must not forget the provider's lifecycle write: work the write
/// records as done would look owed and run again (a restart's console pass ran twice).
#[test]
fn a_refresh_from_an_older_copy_keeps_the_providers_own_lifecycle_write() {
    let s = Table::default();
    let listed = {
        let mut p = (*pod("u1")).clone();
        p.metadata.resource_version = Some("1".into());
        Arc::new(p)
    };
    s.track("ns/p", &listed, "vm");
    s.stage_intent("ns/p", intent("u1", LifecycleState::Creating), Some(&listed))
        .unwrap();
    s.stage_intent("ns/p", intent("u1", LifecycleState::Ready), Some(&listed))
        .unwrap();
    let echoed = {
        let mut p = (*s.tracked("ns/p").unwrap().pod).clone();
        p.metadata.resource_version = Some("2".into());
        Arc::new(p)
    };
    assert!(s.share_echo("ns/p", &echoed));

    s.refresh("ns/p", &listed);
    let own = s.tracked("ns/p").unwrap().pod;
    assert_eq!(own.metadata.annotations.as_ref().unwrap()[lifecycle::STATE], "ready");

    // A copy that already shows the write is taken as it is (no copy of the object).
    let newer = {
        let mut p = (*echoed).clone();
        p.metadata.resource_version = Some("3".into());
        Arc::new(p)
    };
    s.refresh("ns/p", &newer);
    assert!(Arc::ptr_eq(&s.tracked("ns/p").unwrap().pod, &newer));
}
