//! The pod controller's sans-I/O core: watch events and operation results in, actions out. It is
//! the one owner of retries for pods: every wait before an operation runs again is decided here,
//! from the [`Schedule`]s of [`crate::retry`].
//!
//! Rules (the kubelet contract virtual-kubelet implements):
//! * at most one operation in flight per pod key; changes arriving meanwhile are coalesced;
//! * a pod is created once per incarnation (uid); relists and restarts of the watch do not
//!   re-create it; a changed spec/labels/annotations after a create is an update;
//! * deletion: on a deletionTimestamp (or the object vanishing), the provider's delete runs
//!   first; only when it returned is the terminal status published and the object deleted with
//!   grace 0 (the `Finalize` action); an object already gone needs no finalize;
//! * a new incarnation under the same name waits until the old one is fully deleted;
//! * transient failures retry with the operation backoff (jittered); a rejection publishes
//!   Failed once; an operation awaiting an operator is re-run at the slowest retry pace, or at
//!   once when the pod changes (the operator's edit);
//! * a provider may ask to be asked again (a requeue: a hibernate that failed and was reported,
//!   an eviction the apiserver refused, a VM whose state is not known yet): after the next wait
//!   of the schedule it names, or at once; a requeue never blocks the pod's other operations and
//!   is dropped with the incarnation.

mod entry;

use k8s_openapi::api::core::v1::Pod;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

pub use super::keys::{PodKey, Uid};
use super::reasons::{EventReason, EventType};
use crate::retry::Schedule;
use entry::{Entry, Requeue};

/// The key of a pod object.
pub fn pod_key(pod: &Pod) -> PodKey {
    PodKey::of(pod)
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
    /// The provider asked to be asked again: its requeue hook.
    Requeue,
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum OpOutcome {
    Done,
    /// Done, and the provider asks to run its requeue hook after the schedule's next wait.
    Requeue {
        after: Schedule,
    },
    /// The provider refused for good (never retried).
    Rejected {
        reason: EventReason,
        message: String,
    },
    /// May work later: retried with backoff.
    Failed {
        error: String,
    },
    /// Waits for an operator: a Warning Event of `reason`, re-run after `retry_max` or when the
    /// pod changes.
    AwaitingOperator {
        reason: EventReason,
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
        uid: Uid,
        op: OpKind,
        fingerprint: u64,
        outcome: OpOutcome,
    },
    /// A retry delay handed out by [`Action::RetryAfter`] elapsed.
    RetryDue { key: PodKey, uid: Uid },
    /// The provider has a new status for the pod.
    Notify { key: PodKey },
    /// The provider asks for its requeue hook: at once (`None`) or after the schedule's next wait.
    Requeue { key: PodKey, after: Option<Schedule> },
    /// A requeue delay handed out by [`Action::RequeueAfter`] elapsed.
    RequeueDue { key: PodKey, uid: Uid, token: u64 },
}

/// A rejection remembered for status publication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub reason: EventReason,
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
    RetryAfter { key: PodKey, uid: Uid, delay: Duration },
    /// Feed [`Input::RequeueDue`] after `delay`.
    RequeueAfter {
        key: PodKey,
        uid: Uid,
        token: u64,
        delay: Duration,
    },
    /// Emit a Kubernetes Event on the pod.
    Record {
        pod: Arc<Pod>,
        type_: EventType,
        reason: EventReason,
        note: String,
    },
}

/// Whether two versions of a pod are the same to the provider: the parts [`fingerprint`] covers
/// (spec, labels, annotations), whose change makes the core run an update. Exact, and cheaper
/// than two fingerprints (no spec serialised); for a provider that keeps pods, on each watch event.
pub fn same_for_provider(a: &Pod, b: &Pod) -> bool {
    a.spec == b.spec && a.metadata.labels == b.metadata.labels && a.metadata.annotations == b.metadata.annotations
}

/// What the provider has been told about a pod's spec/labels/annotations.
pub fn fingerprint(pod: &Pod) -> u64 {
    let mut h = DefaultHasher::new();
    serde_json::to_string(&pod.spec).unwrap_or_default().hash(&mut h);
    pod.metadata.labels.hash(&mut h);
    pod.metadata.annotations.hash(&mut h);
    h.finish()
}

/// Tunables of the core.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// The backoff of a failed operation: `retry_base` doubling to `retry_max`.
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// Seeds the jitter (reproducible tests); `None` in production.
    pub jitter_seed: Option<u64>,
}

impl CoreConfig {
    fn retry_schedule(&self) -> Schedule {
        Schedule::backoff(self.retry_base, self.retry_max)
    }
}

/// The state of the pod controller.
#[derive(Debug)]
pub struct PodState {
    config: CoreConfig,
    entries: BTreeMap<PodKey, Entry>,
    relist_seen: Option<BTreeSet<PodKey>>,
    next_token: u64,
}

impl PodState {
    pub fn new(config: CoreConfig) -> Self {
        Self {
            config,
            entries: BTreeMap::new(),
            relist_seen: None,
            next_token: 0,
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
                            e.begin_deleting();
                            e.object_gone = true;
                            e.next = None;
                        }
                        self.drive(key.as_str(), &mut actions);
                    }
                }
            }
            Input::Deleted(pod) => {
                let key = pod_key(&pod);
                let uid = Uid::of(&pod);
                if let Some(e) = self.entries.get_mut(&key) {
                    if e.uid == uid {
                        e.pod = pod;
                        e.begin_deleting();
                        e.object_gone = true;
                    } else if e.next.as_ref().is_some_and(|n| Uid::of(n) == uid) {
                        e.next = None;
                    }
                }
                self.drive(key.as_str(), &mut actions);
            }
            Input::Finished {
                key,
                uid,
                op,
                fingerprint,
                outcome,
            } => {
                self.finished(key.as_str(), uid.as_str(), op, fingerprint, outcome, &mut actions);
                self.drive(key.as_str(), &mut actions);
            }
            Input::RetryDue { key, uid } => {
                if let Some(e) = self.entries.get_mut(&key)
                    && e.uid == uid
                {
                    e.retry_pending = None;
                }
                self.drive(key.as_str(), &mut actions);
            }
            Input::Notify { key } => {
                if let Some(e) = self.entries.get_mut(&key)
                    && !e.deleting
                {
                    e.status_dirty = true;
                }
                self.drive(key.as_str(), &mut actions);
            }
            Input::Requeue { key, after } => {
                if self.entries.get(&key).is_some_and(|e| !e.deleting) {
                    match after {
                        None => {
                            let e = self.entries.get_mut(&key).expect("checked");
                            e.requeue.get_or_insert_with(Requeue::now).due = true;
                        }
                        Some(schedule) => self.arm_requeue(key.as_str(), schedule, &mut actions),
                    }
                }
                self.drive(key.as_str(), &mut actions);
            }
            Input::RequeueDue { key, uid, token } => {
                if let Some(e) = self.entries.get_mut(&key)
                    && e.uid == uid
                    && let Some(r) = e.requeue.as_mut().filter(|r| r.token == token)
                {
                    r.due = true;
                }
                self.drive(key.as_str(), &mut actions);
            }
        }
        actions
    }

    fn applied(&mut self, pod: Arc<Pod>, actions: &mut Vec<Action>) {
        let key = pod_key(&pod);
        let uid = Uid::of(&pod);
        match self.entries.get_mut(&key) {
            None => {
                self.entries.insert(key.clone(), Entry::new(pod));
            }
            Some(e) if e.uid == uid => {
                if pod.metadata.deletion_timestamp.is_some() {
                    e.begin_deleting();
                }
                if e.awaiting_operator && fingerprint(&pod) != fingerprint(&e.pod) {
                    // The operator edited the pod: try now rather than at the slow pace.
                    e.awaiting_operator = false;
                    e.retry_pending = None;
                }
                e.pod = pod;
            }
            Some(e) => {
                // Another incarnation owns the name now: the old object is gone.
                e.begin_deleting();
                e.object_gone = true;
                e.next = Some(pod);
            }
        }
        self.drive(key.as_str(), actions);
    }

    fn finished(&mut self, key: &str, uid: &str, op: OpKind, fp: u64, outcome: OpOutcome, actions: &mut Vec<Action>) {
        let Some(e) = self.entries.get_mut(key) else { return };
        if e.uid != uid || e.in_flight != Some(op) {
            return;
        }
        e.in_flight = None;
        if op == OpKind::PublishStatus && std::mem::take(&mut e.publishing_beside_wait) {
            // Written (or not) beside another operation's wait, which stays as it is. A failed
            // write is not retried here, where it would spin for as long as the wait lasts: the
            // next notify asks again (the provider's status reconciler does while they differ).
            e.status_dirty = false;
            return;
        }
        e.awaiting_operator = false;
        match outcome {
            OpOutcome::Done => {
                e.succeeded(op, fp);
                if op == OpKind::Requeue {
                    e.requeue = None;
                }
            }
            OpOutcome::Requeue { after } => {
                e.succeeded(op, fp);
                if let Some(r) = e.requeue.as_mut() {
                    r.due = false;
                }
                self.arm_requeue(key, after, actions);
            }
            OpOutcome::Superseded => {
                e.failures = 0;
                e.backoff = None;
                match op {
                    OpKind::Finalize => e.finalized = true,
                    OpKind::PublishStatus => e.status_dirty = false,
                    // Provider operations are never superseded; treat as done.
                    OpKind::Delete => e.provider_deleted = true,
                    OpKind::Create | OpKind::Update => {
                        e.created = true;
                        e.applied = Some(fp);
                    }
                    OpKind::Requeue => e.requeue = None,
                }
            }
            OpOutcome::Rejected { reason, message } if matches!(op, OpKind::Create | OpKind::Update) => {
                e.failures = 0;
                e.backoff = None;
                if op == OpKind::Update {
                    e.applied = Some(fp);
                }
                actions.push(Action::Record {
                    pod: e.pod.clone(),
                    type_: EventType::Warning,
                    reason,
                    note: message.clone(),
                });
                e.rejected = Some(Rejection { reason, message });
                e.status_dirty = true;
            }
            OpOutcome::Rejected { reason, message } => {
                // A delete/finalize/status/requeue cannot be refused for good: keep trying.
                self.retry(key, op, format!("{reason}: {message}"), actions);
            }
            OpOutcome::Failed { error } => self.retry(key, op, error, actions),
            OpOutcome::AwaitingOperator { reason, message } => self.await_operator(key, op, reason, message, actions),
        }
    }

    /// Schedules the requeue hook after the next wait of `schedule` (continuing its backoff when
    /// the same schedule is already running).
    fn arm_requeue(&mut self, key: &str, schedule: Schedule, actions: &mut Vec<Action>) {
        self.next_token += 1;
        let token = self.next_token;
        let seed = self.config.jitter_seed;
        let Some(e) = self.entries.get_mut(key) else { return };
        let r = e.requeue.get_or_insert_with(Requeue::now);
        if r.delays.as_ref().is_none_or(|d| *d.schedule() != schedule) {
            r.delays = Some(schedule.delays_seeded(seed));
        }
        r.token = token;
        match r.delays.as_mut().and_then(Iterator::next) {
            Some(delay) => actions.push(Action::RequeueAfter {
                key: PodKey::from(key),
                uid: e.uid.clone(),
                token,
                delay,
            }),
            // The schedule's budget is spent: the provider gave its own limit; stop asking.
            None => e.requeue = None,
        }
    }

    /// Records what the operator must do (on the first wait and every doubling of the count,
    /// like a retry) and re-runs the operation after `retry_max`.
    fn await_operator(
        &mut self,
        key: &str,
        op: OpKind,
        reason: EventReason,
        message: String,
        actions: &mut Vec<Action>,
    ) {
        let Some(e) = self.entries.get_mut(key) else { return };
        e.failures += 1;
        e.retry_pending = Some(op);
        e.awaiting_operator = true;
        let delay = self.config.retry_max;
        if e.failures == 1 || e.failures.is_power_of_two() {
            actions.push(Action::Record {
                pod: e.pod.clone(),
                type_: EventType::Warning,
                reason,
                note: format!(
                    "{message} (waiting for an operator; re-checked every {delay:?} and on any change of the pod)"
                ),
            });
        }
        actions.push(Action::RetryAfter {
            key: PodKey::from(key),
            uid: e.uid.clone(),
            delay,
        });
    }

    fn retry(&mut self, key: &str, op: OpKind, error: String, actions: &mut Vec<Action>) {
        let schedule = self.config.retry_schedule();
        let seed = self.config.jitter_seed;
        let Some(e) = self.entries.get_mut(key) else { return };
        e.failures += 1;
        e.retry_pending = Some(op);
        let delay = e
            .backoff
            .get_or_insert_with(|| schedule.delays_seeded(seed))
            .next()
            .unwrap_or(self.config.retry_max);
        if e.failures == 1 || e.failures.is_power_of_two() {
            let reason = match op {
                OpKind::Create => EventReason::ProviderCreateFailed,
                OpKind::Update => EventReason::ProviderUpdateFailed,
                OpKind::Delete => EventReason::ProviderDeleteFailed,
                OpKind::Finalize => EventReason::PodDeleteFailed,
                OpKind::PublishStatus => EventReason::PodStatusUpdateFailed,
                OpKind::Requeue => EventReason::ProviderRequeueFailed,
            };
            actions.push(Action::Record {
                pod: e.pod.clone(),
                type_: EventType::Warning,
                reason,
                note: format!("{error} (attempt {}, retrying in {delay:?})", e.failures),
            });
        }
        actions.push(Action::RetryAfter {
            key: PodKey::from(key),
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
                    e.publishing_beside_wait = e.retry_pending.is_some();
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
                            self.entries.insert(PodKey::from(key), Entry::new(pod));
                        }
                        None => return,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
