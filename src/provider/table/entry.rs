//! One pod's record: everything the provider knows about the pod under one key — the incarnation
//! it claimed and its phase, its lifecycle intent, the final status of an evicted incarnation,
//! its background guest work, the retry it is owed, the fences of a delete or a resumed
//! operation, and the lock that serialises the operations changing its VM. The record goes when
//! nothing of this is left, and its lock with it.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use super::super::lifecycle::Intent;
use crate::kubelet::{ProviderPodStatus, Uid};

/// Where the claimed incarnation's guest is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// No VM: not booted yet (a bring-up is running, or failed), or its VM went away.
    NoVm,
    /// Its VM runs: the VM table's row of this name.
    Running { vm: String },
    /// No VM because the guest is hibernated (its state is in a snapshot): the pod stays alive.
    Hibernated,
}

/// The incarnation a CreatePod (or the startup reconcile) claimed.
#[derive(Debug, Clone)]
pub struct Claim {
    pub uid: Uid,
    /// The pod, shared with the kubelet core (its own annotation writes applied: the first
    /// write copies it, and the update the write echoes through the watch shares it again).
    pub pod: Arc<Pod>,
    /// `vm.cocoonstack.io/name`.
    pub vm_name: String,
    pub phase: Phase,
}

/// A lifecycle intent and where it stands.
#[derive(Debug, Clone)]
pub struct StoredIntent {
    pub intent: Intent,
    /// On the apiserver.
    pub flushed: bool,
    /// The incarnation's object the intent is written on, kept until the intent is flushed (a
    /// failed create drops its claim before the lifecycle reconciler re-flushes).
    pub pod: Option<Arc<Pod>>,
}

/// The final status of an evicted incarnation, kept for its finalize.
#[derive(Debug, Clone)]
pub struct Terminal {
    pub uid: Uid,
    pub status: ProviderPodStatus,
    pub at: Instant,
}

/// One run of background guest work (fixup, lease wait) of a pod.
#[derive(Debug, Clone)]
pub struct GuestWork {
    pub(super) id: u64,
    pub(super) uid: Uid,
    /// Cancelled when the pod is hibernated, deleted or evicted, or newer work replaces this.
    pub stop: CancellationToken,
}

/// A failed hibernate or wake owed a retry (`DECISIONS.md` row 10). The pod controller waits it out
/// on `schedule` and calls the provider's requeue hook, which runs the retry.
#[derive(Debug, Clone, PartialEq)]
pub struct OwedRetry {
    pub uid: Uid,
    pub schedule: crate::retry::Schedule,
}

#[derive(Debug, Default)]
pub struct PodEntry {
    pub claim: Option<Claim>,
    pub intent: Option<StoredIntent>,
    pub terminal: Option<Terminal>,
    pub guest_work: Option<GuestWork>,
    pub retry: Option<OwedRetry>,
    /// A DeletePod of the pod is running (the delete fence).
    pub deleting: bool,
    /// Work owed after a restart is running (CreatePod, UpdatePod and DeletePod back off).
    pub resumed: bool,
    /// Serialises the operations that change the pod's VM (transitions, their retries, resumed
    /// hibernates, DeletePod).
    pub op_lock: Arc<tokio::sync::Mutex<()>>,
}

impl PodEntry {
    /// The claim of incarnation `uid`.
    pub fn claim_of(&self, uid: &str) -> Option<&Claim> {
        self.claim.as_ref().filter(|c| c.uid == uid)
    }

    pub fn claim_of_mut(&mut self, uid: &str) -> Option<&mut Claim> {
        self.claim.as_mut().filter(|c| c.uid == uid)
    }

    /// Nothing is left: the record can go (and its lock, once nobody holds or waits for it).
    pub fn is_empty(&self) -> bool {
        self.claim.is_none()
            && self.intent.is_none()
            && self.terminal.is_none()
            && self.guest_work.is_none()
            && self.retry.is_none()
            && !self.deleting
            && !self.resumed
            && Arc::strong_count(&self.op_lock) == 1
    }
}
