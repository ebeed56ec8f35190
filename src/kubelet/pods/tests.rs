use super::*;
use crate::kubelet::reasons::{EventReason, EventType};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

fn pod(name: &str, uid: &str) -> Arc<Pod> {
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("ns".into());
    p.metadata.uid = Some(uid.into());
    Arc::new(p)
}

fn deleting(p: &Arc<Pod>) -> Arc<Pod> {
    let mut p = (**p).clone();
    p.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    Arc::new(p)
}

fn annotated(p: &Arc<Pod>, k: &str) -> Arc<Pod> {
    let mut p = (**p).clone();
    p.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(k.into(), "true".into());
    Arc::new(p)
}

fn state() -> PodState {
    PodState::new(CoreConfig {
        retry_base: Duration::from_millis(100),
        jitter_seed: Some(7),
        retry_max: Duration::from_secs(10),
    })
}

fn runs(actions: &[Action]) -> Vec<(OpKind, String)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Run { op, pod, .. } => Some((*op, pod.uid().unwrap())),
            _ => None,
        })
        .collect()
}

fn finish(s: &mut PodState, p: &Arc<Pod>, op: OpKind, outcome: OpOutcome) -> Vec<Action> {
    s.on_event(Input::Finished {
        key: pod_key(p),
        uid: Uid::of(p),
        op,
        fingerprint: fingerprint(p),
        outcome,
    })
}

#[test]
fn create_once_then_publish_status() {
    let mut s = state();
    let p = pod("a", "u1");
    assert_eq!(
        runs(&s.on_event(Input::Applied(p.clone()))),
        vec![(OpKind::Create, "u1".into())]
    );
    // Repeats while in flight are coalesced.
    assert!(s.on_event(Input::Applied(p.clone())).is_empty());
    assert_eq!(
        runs(&finish(&mut s, &p, OpKind::Create, OpOutcome::Done)),
        vec![(OpKind::PublishStatus, "u1".into())]
    );
    assert!(runs(&finish(&mut s, &p, OpKind::PublishStatus, OpOutcome::Done)).is_empty());
    // A relist bringing the same pod does not create it again.
    s.on_event(Input::InitStarted);
    assert!(s.on_event(Input::InitApplied(p.clone())).is_empty());
    assert!(s.on_event(Input::InitDone).is_empty());
}

#[test]
fn change_after_create_is_an_update() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    let p2 = annotated(&p, "vm.cocoonstack.io/hibernate");
    assert!(s.on_event(Input::Applied(p2.clone())).is_empty(), "in flight: wait");
    let acts = finish(&mut s, &p, OpKind::Create, OpOutcome::Done);
    assert_eq!(runs(&acts), vec![(OpKind::Update, "u1".into())]);
    let acts = finish(&mut s, &p2, OpKind::Update, OpOutcome::Done);
    assert_eq!(runs(&acts), vec![(OpKind::PublishStatus, "u1".into())]);
}

#[test]
fn kubelet_style_delete_order() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    finish(&mut s, &p, OpKind::Create, OpOutcome::Done);
    // deletionTimestamp arrives while the status publication runs: wait for it.
    assert!(s.on_event(Input::Applied(deleting(&p))).is_empty());
    let acts = finish(&mut s, &p, OpKind::PublishStatus, OpOutcome::Done);
    assert_eq!(runs(&acts), vec![(OpKind::Delete, "u1".into())]);
    let acts = finish(&mut s, &p, OpKind::Delete, OpOutcome::Done);
    assert_eq!(runs(&acts), vec![(OpKind::Finalize, "u1".into())]);
    assert!(finish(&mut s, &p, OpKind::Finalize, OpOutcome::Done).is_empty());
    // A late event of the finalized incarnation (its own final status write) starts nothing:
    // the entry waits for the watch to report the object gone.
    assert!(s.on_event(Input::Applied(deleting(&p))).is_empty());
    // The DELETED event of our own grace-0 delete ends it.
    assert!(s.on_event(Input::Deleted(deleting(&p))).is_empty());
    assert!(s.tracked().is_empty());
}

#[test]
fn object_deleted_outright_calls_provider_delete_without_finalize() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    finish(&mut s, &p, OpKind::Create, OpOutcome::Done);
    finish(&mut s, &p, OpKind::PublishStatus, OpOutcome::Done);
    assert_eq!(
        runs(&s.on_event(Input::Deleted(p.clone()))),
        vec![(OpKind::Delete, "u1".into())]
    );
    assert!(runs(&finish(&mut s, &p, OpKind::Delete, OpOutcome::Done)).is_empty());
    assert!(s.tracked().is_empty());
}

#[test]
fn pod_already_deleting_at_startup_is_deleted_not_created() {
    let mut s = state();
    let p = deleting(&pod("a", "u1"));
    s.on_event(Input::InitStarted);
    assert_eq!(
        runs(&s.on_event(Input::InitApplied(p.clone()))),
        vec![(OpKind::Delete, "u1".into())]
    );
}

#[test]
fn relist_without_a_pod_means_it_is_gone() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    finish(&mut s, &p, OpKind::Create, OpOutcome::Done);
    finish(&mut s, &p, OpKind::PublishStatus, OpOutcome::Done);
    s.on_event(Input::InitStarted);
    assert_eq!(runs(&s.on_event(Input::InitDone)), vec![(OpKind::Delete, "u1".into())]);
}

#[test]
fn new_incarnation_waits_for_the_old_delete() {
    let mut s = state();
    let old = pod("a", "u1");
    s.on_event(Input::Applied(old.clone()));
    finish(&mut s, &old, OpKind::Create, OpOutcome::Done);
    finish(&mut s, &old, OpKind::PublishStatus, OpOutcome::Done);
    let new = pod("a", "u2");
    assert_eq!(
        runs(&s.on_event(Input::Applied(new.clone()))),
        vec![(OpKind::Delete, "u1".into())]
    );
    // The old object is gone already: no finalize; the new one is created next.
    assert_eq!(
        runs(&finish(&mut s, &old, OpKind::Delete, OpOutcome::Done)),
        vec![(OpKind::Create, "u2".into())]
    );
}

#[test]
fn an_operation_awaiting_an_operator_reruns_at_the_slowest_pace_or_when_the_pod_changes() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    let waiting = || OpOutcome::AwaitingOperator {
        reason: EventReason::HibernateImageConflict,
        message: "delete the tag".into(),
    };
    let acts = finish(&mut s, &p, OpKind::Create, waiting());
    assert!(acts.contains(&Action::RetryAfter {
        key: "ns/a".into(),
        uid: "u1".into(),
        delay: Duration::from_secs(10)
    }));
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::Record { reason, type_: EventType::Warning, .. } if reason.as_str() == "HibernateImageConflict"))
    );
    assert!(runs(&acts).is_empty(), "not retried before the delay");
    // An unrelated re-delivery of the same pod does not hurry it.
    assert!(runs(&s.on_event(Input::Applied(p.clone()))).is_empty());
    // The operator's edit does.
    let edited = annotated(&p, "image");
    assert_eq!(
        runs(&s.on_event(Input::Applied(edited))),
        vec![(OpKind::Create, "u1".to_string())]
    );
}

#[test]
fn a_pod_waiting_for_an_operator_still_publishes_its_status() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    finish(&mut s, &p, OpKind::Create, OpOutcome::Done);
    finish(&mut s, &p, OpKind::PublishStatus, OpOutcome::Done);
    let asked = annotated(&p, "hibernate");
    s.on_event(Input::Applied(asked.clone()));
    let waiting = OpOutcome::AwaitingOperator {
        reason: EventReason::HibernateUnsupported,
        message: "clear the annotation".into(),
    };
    let acts = finish(&mut s, &asked, OpKind::Update, waiting);
    assert_eq!(retry_delay(&acts), Some(Duration::from_secs(10)));
    assert!(runs(&acts).is_empty());
    // The provider's view changed (Not Ready, the refusal's message): it is published...
    assert_eq!(
        runs(&s.on_event(Input::Notify { key: "ns/a".into() })),
        vec![(OpKind::PublishStatus, "u1".into())],
        "the status is not frozen for the operator wait"
    );
    let acts = finish(&mut s, &asked, OpKind::PublishStatus, OpOutcome::Done);
    assert!(runs(&acts).is_empty(), "the update still waits: {acts:?}");
    // ...and the wait is untouched: the operator's edit still reruns the update at once.
    let cleared = annotated(&p, "other");
    assert_eq!(
        runs(&s.on_event(Input::Applied(cleared))),
        vec![(OpKind::Update, "u1".into())]
    );
}

#[test]
fn a_status_written_during_a_backoff_leaves_the_backoff_growing_and_a_failed_one_does_not_spin() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    finish(&mut s, &p, OpKind::Create, OpOutcome::Done);
    finish(&mut s, &p, OpKind::PublishStatus, OpOutcome::Done);
    let p2 = annotated(&p, "x");
    s.on_event(Input::Applied(p2.clone()));
    let failed = || OpOutcome::Failed { error: "down".into() };
    let first = retry_delay(&finish(&mut s, &p2, OpKind::Update, failed())).expect("a retry");
    // A status write beside the wait, ending well, then one ending badly.
    s.on_event(Input::Notify { key: "ns/a".into() });
    assert!(finish(&mut s, &p2, OpKind::PublishStatus, OpOutcome::Done).is_empty());
    assert_eq!(
        runs(&s.on_event(Input::Notify { key: "ns/a".into() })),
        vec![(OpKind::PublishStatus, "u1".into())]
    );
    let acts = finish(&mut s, &p2, OpKind::PublishStatus, failed());
    assert!(
        acts.is_empty(),
        "neither rerun at once nor given a retry of its own: {acts:?}"
    );
    let acts = s.on_event(Input::RetryDue {
        key: "ns/a".into(),
        uid: "u1".into(),
    });
    assert_eq!(runs(&acts), vec![(OpKind::Update, "u1".into())]);
    let second = retry_delay(&finish(&mut s, &p2, OpKind::Update, failed())).expect("a retry");
    assert!(second > first, "the backoff kept growing: {first:?} then {second:?}");
}

#[test]
fn a_failed_status_write_waits_for_its_own_retry() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    finish(&mut s, &p, OpKind::Create, OpOutcome::Done);
    let acts = finish(
        &mut s,
        &p,
        OpKind::PublishStatus,
        OpOutcome::Failed { error: "500".into() },
    );
    assert!(retry_delay(&acts).is_some());
    assert!(runs(&acts).is_empty(), "not rewritten before its retry: {acts:?}");
    assert!(runs(&s.on_event(Input::Notify { key: "ns/a".into() })).is_empty());
    let acts = s.on_event(Input::RetryDue {
        key: "ns/a".into(),
        uid: "u1".into(),
    });
    assert_eq!(runs(&acts), vec![(OpKind::PublishStatus, "u1".into())]);
}

#[test]
fn transient_failures_retry_with_backoff() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    let acts = finish(
        &mut s,
        &p,
        OpKind::Create,
        OpOutcome::Failed {
            error: "runtime down".into(),
        },
    );
    let first = retry_delay(&acts).expect("a retry");
    assert!(
        (Duration::from_millis(50)..=Duration::from_millis(100)).contains(&first),
        "the first retry waits the base, jittered down by at most half: {first:?}"
    );
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::Record { reason, .. } if reason.as_str() == "ProviderCreateFailed"))
    );
    assert!(
        s.on_event(Input::Applied(p.clone())).is_empty(),
        "no run before the retry is due"
    );
    assert_eq!(
        runs(&s.on_event(Input::RetryDue {
            key: "ns/a".into(),
            uid: "u1".into()
        })),
        vec![(OpKind::Create, "u1".into())]
    );
    let acts = finish(
        &mut s,
        &p,
        OpKind::Create,
        OpOutcome::Failed {
            error: "still down".into(),
        },
    );
    let second = retry_delay(&acts).expect("a retry");
    assert!(
        (Duration::from_millis(100)..=Duration::from_millis(200)).contains(&second),
        "the backoff doubles: {second:?}"
    );
    // A success resets it.
    s.on_event(Input::RetryDue {
        key: "ns/a".into(),
        uid: "u1".into(),
    });
    finish(&mut s, &p, OpKind::Create, OpOutcome::Done);
    finish(&mut s, &p, OpKind::PublishStatus, OpOutcome::Done);
    let p2 = annotated(&p, "x");
    s.on_event(Input::Applied(p2.clone()));
    let acts = finish(&mut s, &p2, OpKind::Update, OpOutcome::Failed { error: "x".into() });
    assert!(retry_delay(&acts).unwrap() <= Duration::from_millis(100));
}

#[test]
fn a_delete_does_not_wait_for_the_backoff_or_the_operator_wait_of_the_operation_it_supersedes() {
    for outcome in [
        OpOutcome::Failed {
            error: "runtime down".into(),
        },
        OpOutcome::AwaitingOperator {
            reason: EventReason::HibernateUnsupported,
            message: "clear the annotation".into(),
        },
    ] {
        let mut s = state();
        let p = pod("a", "u1");
        s.on_event(Input::Applied(p.clone()));
        let acts = finish(&mut s, &p, OpKind::Create, outcome.clone());
        assert!(retry_delay(&acts).is_some(), "{outcome:?}: the create waits");
        assert_eq!(
            runs(&s.on_event(Input::Applied(deleting(&p)))),
            vec![(OpKind::Delete, "u1".to_string())],
            "{outcome:?}: kubectl delete acts at once"
        );
        // The delete's own failure starts its own backoff at the base.
        let acts = finish(&mut s, &p, OpKind::Delete, OpOutcome::Failed { error: "busy".into() });
        assert!(retry_delay(&acts).unwrap() <= Duration::from_millis(100), "{outcome:?}");
        // And a re-delivery of the deleting pod does not cut that backoff short.
        assert!(
            runs(&s.on_event(Input::Applied(deleting(&p)))).is_empty(),
            "{outcome:?}"
        );
    }
}

fn retry_delay(actions: &[Action]) -> Option<Duration> {
    actions.iter().find_map(|a| match a {
        Action::RetryAfter { delay, .. } => Some(*delay),
        _ => None,
    })
}

fn requeue_after(actions: &[Action]) -> Option<(u64, Duration)> {
    actions.iter().find_map(|a| match a {
        Action::RequeueAfter { token, delay, .. } => Some((*token, *delay)),
        _ => None,
    })
}

fn due(s: &mut PodState, token: u64) -> Vec<Action> {
    s.on_event(Input::RequeueDue {
        key: "ns/a".into(),
        uid: "u1".into(),
        token,
    })
}

#[test]
fn a_requeue_runs_the_hook_after_its_schedule_and_backs_off_while_asked_again() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    let schedule = Schedule::backoff(Duration::from_secs(15), Duration::from_secs(300)).exact();
    let acts = finish(&mut s, &p, OpKind::Create, OpOutcome::Requeue { after: schedule });
    assert_eq!(
        runs(&acts),
        vec![(OpKind::PublishStatus, "u1".into())],
        "the create is done as far as the pod goes: its status is published"
    );
    let (t1, d1) = requeue_after(&acts).expect("a requeue is armed");
    assert_eq!(d1, Duration::from_secs(15));
    finish(&mut s, &p, OpKind::PublishStatus, OpOutcome::Done);
    // The pod's own changes run as usual meanwhile (a requeue blocks nothing).
    let p2 = annotated(&p, "lifecycle");
    assert_eq!(
        runs(&s.on_event(Input::Applied(p2.clone()))),
        vec![(OpKind::Update, "u1".into())]
    );
    assert!(due(&mut s, t1).is_empty(), "due while the update runs: it waits for it");
    let acts = finish(&mut s, &p2, OpKind::Update, OpOutcome::Done);
    assert_eq!(runs(&acts), vec![(OpKind::Requeue, "u1".into())]);
    let acts = finish(&mut s, &p2, OpKind::Requeue, OpOutcome::Requeue { after: schedule });
    let (t2, d2) = requeue_after(&acts).unwrap();
    assert_eq!(d2, Duration::from_secs(30), "asked again: the schedule doubles");
    finish(&mut s, &p2, OpKind::PublishStatus, OpOutcome::Done);
    assert!(
        runs(&due(&mut s, t1)).is_empty(),
        "an older timer does not cut the new wait short"
    );
    assert_eq!(runs(&due(&mut s, t2)), vec![(OpKind::Requeue, "u1".into())]);
    finish(&mut s, &p2, OpKind::Requeue, OpOutcome::Done);
    let acts = finish(&mut s, &p2, OpKind::PublishStatus, OpOutcome::Done);
    assert!(acts.is_empty());
    // Done: the next requeue starts the schedule over.
    let acts = s.on_event(Input::Requeue {
        key: "ns/a".into(),
        after: Some(schedule),
    });
    assert_eq!(requeue_after(&acts).unwrap().1, Duration::from_secs(15));
    // A requeue asked for at once runs at once; a failing hook retries on the operation backoff.
    let acts = s.on_event(Input::Requeue {
        key: "ns/a".into(),
        after: None,
    });
    assert_eq!(runs(&acts), vec![(OpKind::Requeue, "u1".into())]);
    let acts = finish(&mut s, &p2, OpKind::Requeue, OpOutcome::Failed { error: "busy".into() });
    assert!(retry_delay(&acts).is_some());
    assert!(
        acts.iter()
            .any(|a| matches!(a, Action::Record { reason, .. } if reason.as_str() == "ProviderRequeueFailed"))
    );
    assert_eq!(
        runs(&s.on_event(Input::RetryDue {
            key: "ns/a".into(),
            uid: "u1".into()
        })),
        vec![(OpKind::Requeue, "u1".into())],
        "still owed after the failure"
    );
}

#[test]
fn a_requeue_is_dropped_with_its_incarnation_and_ends_with_its_budget() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    let schedule = Schedule::every(Duration::from_secs(1)).within(Duration::from_millis(500));
    let acts = finish(&mut s, &p, OpKind::Create, OpOutcome::Requeue { after: schedule });
    assert!(
        requeue_after(&acts).is_none(),
        "no wait fits the budget: nothing is armed"
    );
    finish(&mut s, &p, OpKind::PublishStatus, OpOutcome::Done);
    let schedule = Schedule::every(Duration::from_secs(1));
    let acts = s.on_event(Input::Requeue {
        key: "ns/a".into(),
        after: Some(schedule),
    });
    let (token, _) = requeue_after(&acts).unwrap();
    assert_eq!(
        runs(&s.on_event(Input::Applied(deleting(&p)))),
        vec![(OpKind::Delete, "u1".into())]
    );
    finish(&mut s, &p, OpKind::Delete, OpOutcome::Done);
    finish(&mut s, &p, OpKind::Finalize, OpOutcome::Done);
    s.on_event(Input::Deleted(deleting(&p)));
    assert!(s.tracked().is_empty());
    assert!(due(&mut s, token).is_empty(), "the deleted pod's requeue is gone");
    assert!(
        s.on_event(Input::Requeue {
            key: "ns/a".into(),
            after: None
        })
        .is_empty()
    );
}

#[test]
fn rejection_publishes_failed_once_and_is_not_retried() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    let acts = finish(
        &mut s,
        &p,
        OpKind::Create,
        OpOutcome::Rejected {
            reason: EventReason::SnapshotCpuClassMismatch,
            message: "m".into(),
        },
    );
    let rejection = acts.iter().find_map(|a| match a {
        Action::Run {
            op: OpKind::PublishStatus,
            rejection,
            ..
        } => rejection.clone(),
        _ => None,
    });
    assert_eq!(rejection.map(|r| r.reason.as_str()), Some("SnapshotCPUClassMismatch"));
    finish(&mut s, &p, OpKind::PublishStatus, OpOutcome::Done);
    assert!(
        s.on_event(Input::Applied(annotated(&p, "x"))).is_empty(),
        "a rejected pod is not retried"
    );
    // Deleting it still goes through the provider's delete.
    assert_eq!(
        runs(&s.on_event(Input::Applied(deleting(&p)))),
        vec![(OpKind::Delete, "u1".into())]
    );
}

#[test]
fn superseded_status_is_dropped() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    finish(&mut s, &p, OpKind::Create, OpOutcome::Done);
    assert!(finish(&mut s, &p, OpKind::PublishStatus, OpOutcome::Superseded).is_empty());
    assert_eq!(s.in_flight("ns/a"), None);
}

#[test]
fn notify_republishes_status() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    finish(&mut s, &p, OpKind::Create, OpOutcome::Done);
    finish(&mut s, &p, OpKind::PublishStatus, OpOutcome::Done);
    assert_eq!(
        runs(&s.on_event(Input::Notify { key: "ns/a".into() })),
        vec![(OpKind::PublishStatus, "u1".into())]
    );
    assert!(
        s.on_event(Input::Notify {
            key: "ns/unknown".into()
        })
        .is_empty()
    );
}

#[test]
fn stale_finish_reports_are_ignored() {
    let mut s = state();
    let p = pod("a", "u1");
    s.on_event(Input::Applied(p.clone()));
    let other = pod("a", "zzz");
    assert!(finish(&mut s, &other, OpKind::Create, OpOutcome::Done).is_empty());
    assert_eq!(s.in_flight("ns/a"), Some(OpKind::Create));
}

#[test]
fn terminal_pods_are_not_created() {
    let mut s = state();
    let mut p = (*pod("a", "u1")).clone();
    p.status = Some(k8s_openapi::api::core::v1::PodStatus {
        phase: Some("Succeeded".into()),
        ..Default::default()
    });
    assert!(s.on_event(Input::Applied(Arc::new(p))).is_empty());
}
