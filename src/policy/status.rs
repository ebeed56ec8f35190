//! What the node's policies are, for the cluster to see: the component serving each slot and
//! the outcome of every load or reload. The kubelet publishes it on the Node (annotations, a
//! `PolicyReady` condition, Events); here it is only state and a change feed.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::SystemTime;

use tokio::sync::{mpsc, watch};

use super::slots::Slot;

/// The component serving one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActivePolicy {
    /// `sha256:<hex>` of the component bytes.
    pub digest: String,
    /// `builtin`, `file:PATH` or the digest-pinned `oci://` reference.
    pub source: String,
    /// The contract version it was built against.
    pub contract: String,
}

/// One load or reload of a slot's configured component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadOutcome {
    pub slot: Slot,
    /// What was loaded (the configured source, pinned when it was fetched).
    pub source: String,
    pub at: SystemTime,
    pub result: ReloadResult,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadResult {
    /// Installed: it serves from the next decision on.
    Accepted { digest: String, contract: String },
    /// Refused; `kept` is the digest that keeps serving.
    Refused {
        reason: &'static str,
        message: String,
        kept: String,
    },
}

/// Every slot's serving component and the slots whose latest reload was refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyStatus {
    pub active: BTreeMap<Slot, ActivePolicy>,
    /// The latest refused reload per slot; a later accepted one clears it.
    pub refused: BTreeMap<Slot, ReloadOutcome>,
}

/// How many reload outcomes wait for the Node's Event publisher before new ones are dropped.
const OUTCOME_BACKLOG: usize = 64;

/// The shared status and its change feed.
#[derive(Debug)]
pub struct StatusBoard {
    status: watch::Sender<PolicyStatus>,
    outcomes: mpsc::Sender<ReloadOutcome>,
    outcome_rx: Mutex<Option<mpsc::Receiver<ReloadOutcome>>>,
}

impl Default for StatusBoard {
    fn default() -> Self {
        let (outcomes, rx) = mpsc::channel(OUTCOME_BACKLOG);
        StatusBoard {
            status: watch::Sender::new(PolicyStatus::default()),
            outcomes,
            outcome_rx: Mutex::new(Some(rx)),
        }
    }
}

impl StatusBoard {
    pub fn current(&self) -> PolicyStatus {
        self.status.borrow().clone()
    }

    /// A receiver that wakes on every change.
    pub fn subscribe(&self) -> watch::Receiver<PolicyStatus> {
        self.status.subscribe()
    }

    /// The feed of reload outcomes (once: it has one consumer, the Node's Event publisher).
    /// Outcomes before this call wait in it (startup loads happen before the Node exists).
    pub fn take_outcomes(&self) -> Option<mpsc::Receiver<ReloadOutcome>> {
        self.outcome_rx.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    pub(crate) fn set_active(&self, slot: Slot, active: ActivePolicy) {
        self.status
            .send_if_modified(|s| s.active.insert(slot, active.clone()).as_ref() != Some(&active));
    }

    /// Records a load or reload of `slot`.
    pub fn record(&self, outcome: ReloadOutcome) {
        let slot = outcome.slot;
        self.status.send_modify(|s| match &outcome.result {
            ReloadResult::Accepted { .. } => {
                s.refused.remove(&slot);
            }
            ReloadResult::Refused { .. } => {
                s.refused.insert(slot, outcome.clone());
            }
        });
        if self.outcomes.try_send(outcome).is_err() {
            tracing::debug!(%slot, "policy reload outcome not queued for a Node Event (backlog full or no publisher)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_stays_until_the_slot_loads_again() {
        let board = StatusBoard::default();
        let mut rx = board.subscribe();
        let refused = ReloadOutcome {
            slot: Slot::BringUp,
            source: "file:/p.wasm".into(),
            at: SystemTime::UNIX_EPOCH,
            result: ReloadResult::Refused {
                reason: "corrupt",
                message: "bad".into(),
                kept: "sha256:a".into(),
            },
        };
        board.record(refused.clone());
        assert!(rx.has_changed().unwrap());
        assert_eq!(board.current().refused[&Slot::BringUp], refused);
        rx.mark_unchanged();
        board.set_active(
            Slot::BringUp,
            ActivePolicy {
                digest: "sha256:b".into(),
                source: "file:/p.wasm".into(),
                contract: "0.2.0".into(),
            },
        );
        board.record(ReloadOutcome {
            result: ReloadResult::Accepted {
                digest: "sha256:b".into(),
                contract: "0.2.0".into(),
            },
            ..refused
        });
        assert!(rx.has_changed().unwrap());
        assert!(board.current().refused.is_empty());
        let mut outcomes = board.take_outcomes().expect("the feed");
        assert!(board.take_outcomes().is_none(), "one consumer");
        assert!(matches!(
            outcomes.try_recv().unwrap().result,
            ReloadResult::Refused { .. }
        ));
        assert!(matches!(
            outcomes.try_recv().unwrap().result,
            ReloadResult::Accepted { .. }
        ));
    }
}
