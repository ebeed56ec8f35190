//! The pod controller's sans-I/O core: watch events and operation results in, actions out.
//!
//! Rules (the kubelet contract virtual-kubelet implements):
//! * at most one operation in flight per pod key; changes arriving meanwhile are coalesced;
//! * a pod is created once per incarnation (uid); relists and restarts of the watch do not
//!   re-create it; a changed spec/labels/annotations after a create is an update;
//! * deletion: on a deletionTimestamp (or the object vanishing), the provider's delete runs
//!   first; only when it returned is the terminal status published and the object deleted with
//!   grace 0 (the `Finalize` action); an object already gone needs no finalize;
//! * a new incarnation under the same name waits until the old one is fully deleted;
//! * transient failures retry with exponential backoff; a rejection publishes Failed once; an
//!   operation awaiting an operator is re-run at the slowest retry pace, or at once when the
//!   pod changes (the operator's edit).

use crate::backoff;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

/// `namespace/name`.
pub type PodKey = String;

/// The key of a pod object.
pub fn pod_key(pod: &Pod) -> PodKey {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// An operation on one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Provider create.
    Create,
    /// Provider update.
    Update,
    /// Provider delete.
    Delete,
    /// Publish the terminal status, then delete the object with grace 0 and a uid precondition.
    Finalize,
    /// Ask the provider for the status and publish it.
    PublishStatus,
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpOutcome {
    Done,
    /// The provider refused for good (never retried).
    Rejected {
        reason: String,
        message: String,
    },
    /// May work later: retried with backoff.
    Failed {
        error: String,
    },
    /// Waits for an operator: a Warning Event of `reason`, re-run after `retry_max` or when the
    /// pod changes.
    AwaitingOperator {
        reason: String,
        message: String,
    },
    /// The apiserver says this incarnation is gone (404/409/422 on a uid-conditioned write).
    Superseded,
}

/// Inputs of the core.
#[derive(Debug, Clone)]
pub enum Input {
    /// A (re)list starts.
    InitStarted,
    /// A pod from a (re)list.
    InitApplied(Arc<Pod>),
    /// The (re)list is complete: tracked pods it did not contain are gone.
    InitDone,
    /// A pod was added or modified.
    Applied(Arc<Pod>),
    /// A pod object was deleted from the apiserver.
    Deleted(Arc<Pod>),
    /// An operation handed out by an [`Action::Run`] finished.
    Finished {
        key: PodKey,
        uid: String,
        op: OpKind,
        fingerprint: u64,
        outcome: OpOutcome,
    },
    /// A retry delay handed out by [`Action::RetryAfter`] elapsed.
    RetryDue { key: PodKey, uid: String },
    /// The provider has a new status for the pod.
    Notify { key: PodKey },
}

/// A rejection remembered for status publication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: String,
    pub message: String,
}

/// Outputs of the core.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Run `op` for this pod snapshot; report back with [`Input::Finished`] carrying `fingerprint`.
    Run {
        op: OpKind,
        pod: Arc<Pod>,
        fingerprint: u64,
        rejection: Option<Rejection>,
    },
    /// Feed [`Input::RetryDue`] after `delay`.
    RetryAfter { key: PodKey, uid: String, delay: Duration },
    /// Emit a Kubernetes Event on the pod.
    Record {
        pod: Arc<Pod>,
        warning: bool,
        reason: String,
        note: String,
    },
}

/// What the provider has been told about a pod's spec/labels/annotations.
pub fn fingerprint(pod: &Pod) -> u64 {
    let mut h = DefaultHasher::new();
    serde_json::to_string(&pod.spec).unwrap_or_default().hash(&mut h);
    pod.metadata.labels.hash(&mut h);
    pod.metadata.annotations.hash(&mut h);
    h.finish()
}

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

#[derive(Debug, Clone)]
struct Entry {
    pod: Arc<Pod>,
    uid: String,
    created: bool,
    applied: Option<u64>,
    deleting: bool,
    object_gone: bool,
    provider_deleted: bool,
    finalized: bool,
    status_dirty: bool,
    rejected: Option<Rejection>,
    in_flight: Option<OpKind>,
    retry_pending: bool,
    /// The pending retry waits for an operator: a change of the pod runs it at once.
    awaiting_operator: bool,
    failures: u32,
    /// The next incarnation under the same name, waiting for this one to be deleted.
    next: Option<Arc<Pod>>,
}

impl Entry {
    fn new(pod: Arc<Pod>) -> Self {
        Self {
            uid: pod.uid().unwrap_or_default(),
            deleting: pod.metadata.deletion_timestamp.is_some(),
            pod,
            created: false,
            applied: None,
            object_gone: false,
            provider_deleted: false,
            finalized: false,
            status_dirty: false,
            rejected: None,
            in_flight: None,
            retry_pending: false,
            awaiting_operator: false,
            failures: 0,
            next: None,
        }
    }

    /// The next operation, or `Err(())` when the entry is finished and can be dropped.
    fn next_op(&self) -> Result<Option<OpKind>, ()> {
        if self.in_flight.is_some() || self.retry_pending {
            return Ok(None);
        }
        if self.deleting {
            if !self.provider_deleted {
                return Ok(Some(OpKind::Delete));
            }
            if !self.object_gone && !self.finalized {
                return Ok(Some(OpKind::Finalize));
            }
            return Err(());
        }
        if self.rejected.is_none() && !is_terminal(&self.pod) {
            if !self.created {
                return Ok(Some(OpKind::Create));
            }
            if self.applied != Some(fingerprint(&self.pod)) {
                return Ok(Some(OpKind::Update));
            }
        }
        Ok(self.status_dirty.then_some(OpKind::PublishStatus))
    }
}

/// Tunables of the core.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub retry_base: Duration,
    pub retry_max: Duration,
}

/// The state of the pod controller.
#[derive(Debug)]
pub struct PodState {
    config: CoreConfig,
    entries: BTreeMap<PodKey, Entry>,
    relist_seen: Option<BTreeSet<PodKey>>,
}

impl PodState {
    pub fn new(config: CoreConfig) -> Self {
        Self {
            config,
            entries: BTreeMap::new(),
            relist_seen: None,
        }
    }

    /// Keys currently tracked (for inspection and tests).
    pub fn tracked(&self) -> Vec<PodKey> {
        self.entries.keys().cloned().collect()
    }

    /// Whether an operation is running for the key.
    pub fn in_flight(&self, key: &str) -> Option<OpKind> {
        self.entries.get(key).and_then(|e| e.in_flight)
    }

    /// Feeds one input; returns the actions to execute.
    pub fn on_event(&mut self, input: Input) -> Vec<Action> {
        let mut actions = Vec::new();
        match input {
            Input::InitStarted => self.relist_seen = Some(BTreeSet::new()),
            Input::InitApplied(pod) => {
                if let Some(seen) = &mut self.relist_seen {
                    seen.insert(pod_key(&pod));
                }
                self.applied(pod, &mut actions);
            }
            Input::Applied(pod) => self.applied(pod, &mut actions),
            Input::InitDone => {
                if let Some(seen) = self.relist_seen.take() {
                    let gone: Vec<PodKey> = self.entries.keys().filter(|k| !seen.contains(*k)).cloned().collect();
                    for key in gone {
                        if let Some(e) = self.entries.get_mut(&key) {
                            e.deleting = true;
                            e.object_gone = true;
                            e.next = None;
                        }
                        self.drive(&key, &mut actions);
                    }
                }
            }
            Input::Deleted(pod) => {
                let key = pod_key(&pod);
                let uid = pod.uid().unwrap_or_default();
                if let Some(e) = self.entries.get_mut(&key) {
                    if e.uid == uid {
                        e.pod = pod;
                        e.deleting = true;
                        e.object_gone = true;
                    } else if e
                        .next
                        .as_ref()
                        .is_some_and(|n| n.uid().as_deref() == Some(uid.as_str()))
                    {
                        e.next = None;
                    }
                }
                self.drive(&key, &mut actions);
            }
            Input::Finished {
                key,
                uid,
                op,
                fingerprint,
                outcome,
            } => {
                self.finished(&key, &uid, op, fingerprint, outcome, &mut actions);
                self.drive(&key, &mut actions);
            }
            Input::RetryDue { key, uid } => {
                if let Some(e) = self.entries.get_mut(&key)
                    && e.uid == uid
                {
                    e.retry_pending = false;
                }
                self.drive(&key, &mut actions);
            }
            Input::Notify { key } => {
                if let Some(e) = self.entries.get_mut(&key)
                    && !e.deleting
                {
                    e.status_dirty = true;
                }
                self.drive(&key, &mut actions);
            }
        }
        actions
    }

    fn applied(&mut self, pod: Arc<Pod>, actions: &mut Vec<Action>) {
        let key = pod_key(&pod);
        let uid = pod.uid().unwrap_or_default();
        match self.entries.get_mut(&key) {
            None => {
                self.entries.insert(key.clone(), Entry::new(pod));
            }
            Some(e) if e.uid == uid => {
                if pod.metadata.deletion_timestamp.is_some() {
                    e.deleting = true;
                }
                if e.awaiting_operator && fingerprint(&pod) != fingerprint(&e.pod) {
                    // The operator edited the pod: try now rather than at the slow pace.
                    e.awaiting_operator = false;
                    e.retry_pending = false;
                }
                e.pod = pod;
            }
            Some(e) => {
                // Another incarnation owns the name now: the old object is gone.
                e.deleting = true;
                e.object_gone = true;
                e.next = Some(pod);
            }
        }
        self.drive(&key, actions);
    }

    fn finished(&mut self, key: &str, uid: &str, op: OpKind, fp: u64, outcome: OpOutcome, actions: &mut Vec<Action>) {
        let Some(e) = self.entries.get_mut(key) else { return };
        if e.uid != uid || e.in_flight != Some(op) {
            return;
        }
        e.in_flight = None;
        e.awaiting_operator = false;
        match outcome {
            OpOutcome::Done => {
                e.failures = 0;
                match op {
                    OpKind::Create | OpKind::Update => {
                        e.created = true;
                        e.applied = Some(fp);
                        e.status_dirty = true;
                    }
                    OpKind::Delete => e.provider_deleted = true,
                    OpKind::Finalize => e.finalized = true,
                    OpKind::PublishStatus => e.status_dirty = false,
                }
            }
            OpOutcome::Superseded => {
                e.failures = 0;
                match op {
                    OpKind::Finalize => e.finalized = true,
                    OpKind::PublishStatus => e.status_dirty = false,
                    // Provider operations are never superseded; treat as done.
                    OpKind::Delete => e.provider_deleted = true,
                    OpKind::Create | OpKind::Update => {
                        e.created = true;
                        e.applied = Some(fp);
                    }
                }
            }
            OpOutcome::Rejected { reason, message } if matches!(op, OpKind::Create | OpKind::Update) => {
                e.failures = 0;
                if op == OpKind::Update {
                    e.applied = Some(fp);
                }
                actions.push(Action::Record {
                    pod: e.pod.clone(),
                    warning: true,
                    reason: reason.clone(),
                    note: message.clone(),
                });
                e.rejected = Some(Rejection { reason, message });
                e.status_dirty = true;
            }
            OpOutcome::Rejected { reason, message } => {
                // A delete/finalize/status cannot be refused for good: keep trying.
                self.retry(key, op, format!("{reason}: {message}"), actions);
            }
            OpOutcome::Failed { error } => self.retry(key, op, error, actions),
            OpOutcome::AwaitingOperator { reason, message } => self.await_operator(key, reason, message, actions),
        }
    }

    /// Records what the operator must do (on the first wait and every doubling of the count,
    /// like a retry) and re-runs the operation after `retry_max`.
    fn await_operator(&mut self, key: &str, reason: String, message: String, actions: &mut Vec<Action>) {
        let Some(e) = self.entries.get_mut(key) else { return };
        e.failures += 1;
        e.retry_pending = true;
        e.awaiting_operator = true;
        let delay = self.config.retry_max;
        if e.failures == 1 || e.failures.is_power_of_two() {
            actions.push(Action::Record {
                pod: e.pod.clone(),
                warning: true,
                reason,
                note: format!(
                    "{message} (waiting for an operator; re-checked every {delay:?} and on any change of the pod)"
                ),
            });
        }
        actions.push(Action::RetryAfter {
            key: key.to_string(),
            uid: e.uid.clone(),
            delay,
        });
    }

    fn retry(&mut self, key: &str, op: OpKind, error: String, actions: &mut Vec<Action>) {
        let Some(e) = self.entries.get_mut(key) else { return };
        e.failures += 1;
        e.retry_pending = true;
        let delay = backoff::delay(e.failures, self.config.retry_base, self.config.retry_max);
        if e.failures == 1 || e.failures.is_power_of_two() {
            let reason = match op {
                OpKind::Create => "ProviderCreateFailed",
                OpKind::Update => "ProviderUpdateFailed",
                OpKind::Delete => "ProviderDeleteFailed",
                OpKind::Finalize => "PodDeleteFailed",
                OpKind::PublishStatus => "PodStatusUpdateFailed",
            };
            actions.push(Action::Record {
                pod: e.pod.clone(),
                warning: true,
                reason: reason.into(),
                note: format!("{error} (attempt {}, retrying in {delay:?})", e.failures),
            });
        }
        actions.push(Action::RetryAfter {
            key: key.to_string(),
            uid: e.uid.clone(),
            delay,
        });
    }

    fn drive(&mut self, key: &str, actions: &mut Vec<Action>) {
        loop {
            let Some(e) = self.entries.get_mut(key) else { return };
            match e.next_op() {
                Ok(Some(op)) => {
                    e.in_flight = Some(op);
                    actions.push(Action::Run {
                        op,
                        pod: e.pod.clone(),
                        fingerprint: fingerprint(&e.pod),
                        rejection: e.rejected.clone(),
                    });
                    return;
                }
                Ok(None) => return,
                Err(()) => {
                    let next = e.next.take();
                    self.entries.remove(key);
                    match next {
                        Some(pod) => {
                            self.entries.insert(key.to_string(), Entry::new(pod));
                        }
                        None => return,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

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
            uid: p.uid().unwrap(),
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
        // The DELETED event of our own grace-0 delete finds nothing left.
        assert!(s.tracked().is_empty());
        assert!(s.on_event(Input::Deleted(deleting(&p))).is_empty());
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
            reason: "HibernateImageConflict".into(),
            message: "delete the tag".into(),
        };
        let acts = finish(&mut s, &p, OpKind::Create, waiting());
        assert!(acts.contains(&Action::RetryAfter {
            key: "ns/a".into(),
            uid: "u1".into(),
            delay: Duration::from_secs(10)
        }));
        assert!(
            acts.iter().any(
                |a| matches!(a, Action::Record { reason, warning: true, .. } if reason == "HibernateImageConflict")
            )
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
        assert!(acts.contains(&Action::RetryAfter {
            key: "ns/a".into(),
            uid: "u1".into(),
            delay: Duration::from_millis(100)
        }));
        assert!(
            acts.iter()
                .any(|a| matches!(a, Action::Record { reason, .. } if reason == "ProviderCreateFailed"))
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
        assert!(acts.contains(&Action::RetryAfter {
            key: "ns/a".into(),
            uid: "u1".into(),
            delay: Duration::from_millis(200)
        }));
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
                reason: "SnapshotCPUClassMismatch".into(),
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
        assert_eq!(
            rejection.map(|r| r.reason),
            Some("SnapshotCPUClassMismatch".to_string())
        );
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
}
