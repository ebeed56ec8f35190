//! One pod in the core: what has been done for its incarnation, what runs, what is owed.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::{OpKind, Rejection, Uid, fingerprint};
use crate::retry::Delays;

fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// A requeue the provider asked for.
#[derive(Debug)]
pub(super) struct Requeue {
    /// Its wait is over (or it was asked for at once): run the hook when nothing else runs.
    pub due: bool,
    /// The waits of the schedule the provider named (continued while it names the same one).
    pub delays: Option<Delays>,
    /// Identifies the armed wait: an older timer firing late does not cut a newer wait short.
    pub token: u64,
}

impl Requeue {
    pub fn now() -> Self {
        Self {
            due: false,
            delays: None,
            token: 0,
        }
    }
}

#[derive(Debug)]
pub(super) struct Entry {
    pub pod: Arc<Pod>,
    pub uid: Uid,
    pub created: bool,
    pub applied: Option<u64>,
    pub deleting: bool,
    pub object_gone: bool,
    pub provider_deleted: bool,
    pub finalized: bool,
    pub status_dirty: bool,
    pub rejected: Option<Rejection>,
    pub in_flight: Option<OpKind>,
    /// The status write in flight was started while another operation waited for its retry:
    /// its end must leave that operation's wait, backoff and operator flag alone.
    pub publishing_beside_wait: bool,
    /// The operation waiting for its retry (its backoff, or an operator).
    pub retry_pending: Option<OpKind>,
    /// The pending retry waits for an operator: a change of the pod runs it at once.
    pub awaiting_operator: bool,
    /// Failures in a row, and the waits of the operation backoff they follow.
    pub failures: u32,
    pub backoff: Option<Delays>,
    pub requeue: Option<Requeue>,
    /// The next incarnation under the same name, waiting for this one to be deleted.
    pub next: Option<Arc<Pod>>,
}

impl Entry {
    pub fn new(pod: Arc<Pod>) -> Self {
        Self {
            uid: Uid::of(&pod),
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
            publishing_beside_wait: false,
            retry_pending: None,
            awaiting_operator: false,
            failures: 0,
            backoff: None,
            requeue: None,
            next: None,
        }
    }

    /// The pod is being deleted (a deletionTimestamp, or the object is gone). The delete
    /// supersedes the operation that was waiting to be retried, so that wait (a backoff, or an
    /// operator wait at the slowest pace) is dropped: the delete runs now, with a backoff of its
    /// own. Without this a pod whose create kept failing stayed up to `retry_max` after
    /// `kubectl delete`.
    pub fn begin_deleting(&mut self) {
        if self.deleting {
            return;
        }
        self.deleting = true;
        self.retry_pending = None;
        self.awaiting_operator = false;
        self.failures = 0;
        self.backoff = None;
    }

    /// Operation `op` (of the pod as fingerprinted `fp`) did its work.
    pub fn succeeded(&mut self, op: OpKind, fp: u64) {
        self.failures = 0;
        self.backoff = None;
        match op {
            OpKind::Create | OpKind::Update => {
                self.created = true;
                self.applied = Some(fp);
                self.status_dirty = true;
            }
            OpKind::Delete => self.provider_deleted = true,
            OpKind::Finalize => self.finalized = true,
            OpKind::PublishStatus => self.status_dirty = false,
            OpKind::Requeue => self.status_dirty = true,
        }
    }

    /// The next operation, or `Err(())` when the entry is finished and can be dropped.
    pub fn next_op(&self) -> Result<Option<OpKind>, ()> {
        if self.in_flight.is_some() {
            return Ok(None);
        }
        if let Some(waiting) = self.retry_pending {
            // The status follows the provider's view while another operation waits for its
            // retry: a pod waiting for an operator (minutes apart) would otherwise keep showing
            // what it showed before the operation failed. A status write that failed itself
            // waits for its own retry.
            let publish = waiting != OpKind::PublishStatus && self.status_dirty && !self.deleting;
            return Ok(publish.then_some(OpKind::PublishStatus));
        }
        if self.deleting {
            if !self.provider_deleted {
                return Ok(Some(OpKind::Delete));
            }
            if !self.object_gone && !self.finalized {
                return Ok(Some(OpKind::Finalize));
            }
            // Finalized: kept until the watch reports the object gone, so a late event of this
            // incarnation (the update of its own final status write) cannot start a second
            // delete of it as if it were new.
            if !self.object_gone {
                return Ok(None);
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
            if self.requeue.as_ref().is_some_and(|r| r.due) {
                return Ok(Some(OpKind::Requeue));
            }
        }
        Ok(self.status_dirty.then_some(OpKind::PublishStatus))
    }
}
