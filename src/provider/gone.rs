//! What a VM event means for its pod, as pure decisions: which events
//! are worth an inspect, what the inspect result asks for, and the deferred-recheck steps.

use std::time::{Duration, Instant};

use crate::kubelet::EventReason;
use crate::runtime::{EventKind, VmEvent, VmState};

/// A `DELETED` event, or a `MODIFIED` one whose VM is no longer running.
pub fn is_candidate(event: &VmEvent) -> bool {
    if event.vm.id.is_empty() && event.vm.name().is_empty() {
        return false;
    }
    match event.kind {
        EventKind::Deleted => true,
        EventKind::Modified => event.vm.state != VmState::Running,
        EventKind::Added => false,
    }
}

/// What `vm inspect` said about the VM (only success and NotFound are definitive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inspected {
    NotFound,
    Inconclusive(String),
    State(VmState),
}

/// Why a pod is evicted, as its Event reason and the terminated container's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    pub reason: EventReason,
    pub message: String,
}

impl Eviction {
    pub fn vm_gone() -> Self {
        Self {
            reason: EventReason::VmGone,
            message: "vm no longer exists".into(),
        }
    }
    pub fn restart_cooldown() -> Self {
        Self {
            reason: EventReason::RestartCooldown,
            message: "restart cooldown not elapsed".into(),
        }
    }
    pub fn inspect_timeout() -> Self {
        Self {
            reason: EventReason::VmInspectTimeout,
            message: "vm inspect did not resolve within budget".into(),
        }
    }
    pub fn restart_failed(error: &str) -> Self {
        Self {
            reason: EventReason::RestartFailed,
            message: error.to_string(),
        }
    }
}

/// The action after the inline inspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Running after all: a false alarm.
    Ignore,
    /// Gone: release its leases and evict the pod.
    Evict(Eviction),
    /// Undecidable now: recheck in the background.
    Recheck,
    /// Stopped again soon after a restart: remove it, then evict.
    RemoveThenEvict(Eviction),
    /// Stopped: start it in place.
    Restart,
}

/// The inspect result decides: not found evicts (`VMGone`), running is a false alarm, an
/// inconclusive inspect is rechecked later, and any other state is started in place unless it was
/// restarted within `cooldown` (then it is removed and the pod evicted, `RestartCooldown`).
pub fn after_inspect(inspected: &Inspected, last_restart: Option<Instant>, now: Instant, cooldown: Duration) -> Action {
    match inspected {
        Inspected::NotFound => Action::Evict(Eviction::vm_gone()),
        Inspected::Inconclusive(_) => Action::Recheck,
        Inspected::State(VmState::Running) => Action::Ignore,
        Inspected::State(_) if last_restart.is_some_and(|at| now.saturating_duration_since(at) < cooldown) => {
            Action::RemoveThenEvict(Eviction::restart_cooldown())
        }
        Inspected::State(_) => Action::Restart,
    }
}

/// One step of a deferred recheck.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recheck {
    /// Keep checking after the next backoff delay.
    Continue,
    /// Definitively gone: evict.
    Evict(Eviction),
    /// Still undecidable past the budget: remove the VM, then evict.
    RemoveThenEvict(Eviction),
    /// Not running: handle it as a fresh event (restart or cooldown).
    Replay,
    /// Running again: nothing to do.
    Stop,
}

pub fn recheck_step(inspected: &Inspected, elapsed: Duration, budget: Duration) -> Recheck {
    match inspected {
        Inspected::NotFound => Recheck::Evict(Eviction::vm_gone()),
        Inspected::Inconclusive(_) if elapsed >= budget => Recheck::RemoveThenEvict(Eviction::inspect_timeout()),
        Inspected::Inconclusive(_) => Recheck::Continue,
        Inspected::State(VmState::Running) => Recheck::Stop,
        Inspected::State(_) => Recheck::Replay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::VmRecord;

    fn event(kind: EventKind, id: &str, state: VmState) -> VmEvent {
        VmEvent {
            kind,
            vm: VmRecord {
                id: id.into(),
                state,
                ..Default::default()
            },
        }
    }

    #[test]
    fn deleted_and_not_running_events_are_candidates() {
        assert!(is_candidate(&event(EventKind::Deleted, "a", VmState::Running)));
        assert!(is_candidate(&event(EventKind::Modified, "a", VmState::Stopped)));
        assert!(is_candidate(&event(EventKind::Modified, "a", VmState::StoppedStale)));
        assert!(!is_candidate(&event(EventKind::Modified, "a", VmState::Running)));
        assert!(!is_candidate(&event(EventKind::Added, "a", VmState::Stopped)));
        assert!(
            !is_candidate(&event(EventKind::Deleted, "", VmState::Running)),
            "no id and no name"
        );
    }

    #[test]
    fn the_inspect_table() {
        let now = Instant::now();
        let cooldown = Duration::from_secs(30);
        assert_eq!(
            after_inspect(&Inspected::NotFound, None, now, cooldown),
            Action::Evict(Eviction::vm_gone())
        );
        assert_eq!(
            after_inspect(&Inspected::Inconclusive("db locked".into()), None, now, cooldown),
            Action::Recheck
        );
        assert_eq!(
            after_inspect(&Inspected::State(VmState::Running), None, now, cooldown),
            Action::Ignore
        );
        assert_eq!(
            after_inspect(&Inspected::State(VmState::Stopped), None, now, cooldown),
            Action::Restart
        );
        assert_eq!(
            after_inspect(
                &Inspected::State(VmState::Error),
                Some(now - Duration::from_secs(40)),
                now,
                cooldown
            ),
            Action::Restart
        );
        assert_eq!(
            after_inspect(
                &Inspected::State(VmState::StoppedStale),
                Some(now - Duration::from_secs(5)),
                now,
                cooldown
            ),
            Action::RemoveThenEvict(Eviction::restart_cooldown())
        );
    }

    #[test]
    fn the_recheck_steps() {
        let budget = Duration::from_secs(1800);
        let e = Inspected::Inconclusive("x".into());
        assert_eq!(recheck_step(&e, Duration::from_secs(10), budget), Recheck::Continue);
        assert_eq!(
            recheck_step(&e, budget, budget),
            Recheck::RemoveThenEvict(Eviction::inspect_timeout())
        );
        assert_eq!(
            recheck_step(&Inspected::NotFound, Duration::ZERO, budget),
            Recheck::Evict(Eviction::vm_gone())
        );
        assert_eq!(
            recheck_step(&Inspected::State(VmState::Running), Duration::ZERO, budget),
            Recheck::Stop
        );
        assert_eq!(
            recheck_step(&Inspected::State(VmState::Stopped), Duration::ZERO, budget),
            Recheck::Replay
        );
    }
}
