//! The daemon's ordered shutdown. On SIGTERM or SIGINT, within one deadline
//! ([`ShutdownArgs::shutdown_deadline`]):
//!
//! 1. the pod controller stops taking work: no new pod operation starts;
//! 2. the pod operations in flight (a hibernate saving its guest, a wake) run to their end, until
//!    the drain's share of the deadline; what is still running then stops at its current await
//!    point, as a crash there would stop it (every step of an operation leaves state the next
//!    start resumes from);
//! 3. the provider's background loops and tasks stop (the VM event watcher, the status and
//!    reclaim loops, probe agents, guest work), then the stats sampler and the cert managers;
//! 4. the listeners: the kubelet API (its exec sessions), `/metrics`, the peer tier;
//! 5. the node's lease and status: the node reads Ready until the daemon is done;
//!
//! then the process exits, also when a phase did not end in its time.

use std::time::Duration;

use clap::Args;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use vk_cocoon::kubelet::{NodeStop, Stopping};
use vk_cocoon::settings::{parse_duration, parser};

/// The default deadline. The daemon is stopped by systemd (`deploy/vk-cocoon.service`,
/// `TimeoutStopSec=30`) or, run as a pod, by the kubelet (`terminationGracePeriodSeconds`,
/// 30 s unless set): both send SIGKILL 30 s after SIGTERM. 25 s keeps a margin under both, so
/// the daemon always ends its own shutdown; a larger grace period allows a larger deadline.
pub const DEFAULT_DEADLINE: &str = "25s";

/// The share of the deadline kept for the phases after the drain (background loops, listeners,
/// the lease) and the runtime's own exit: a fifth, at most this much.
const AFTER_DRAIN_MAX: Duration = Duration::from_secs(5);

/// How long the runtime waits for its blocking threads at exit (a policy decision or a file read
/// in progress); taken from the deadline.
pub const RUNTIME_EXIT: Duration = Duration::from_millis(500);

const DEADLINE_RULE: &str = "a duration such as 25s or 1m, more than 1s (keep it under the SIGKILL grace period: TimeoutStopSec, terminationGracePeriodSeconds)";

/// How the daemon stops.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Shutdown")]
pub struct ShutdownArgs {
    /// On SIGTERM or SIGINT, the process exits within this: pod operations in flight finish or stop at a step the next start resumes from
    #[arg(long, env = "VK_SHUTDOWN_DEADLINE", value_name = "DURATION", default_value = DEFAULT_DEADLINE,
          value_parser = parser("VK_SHUTDOWN_DEADLINE", DEADLINE_RULE, deadline))]
    pub shutdown_deadline: Duration,
}

fn deadline(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d <= Duration::from_secs(1) => Err("must be more than 1s".into()),
        d => Ok(d),
    }
}

/// The tokens of the phases, in the order they are cancelled.
#[derive(Debug, Clone)]
pub struct Phases {
    /// Phases 1, 2 and 5 (the node's own order).
    pub node: NodeStop,
    /// Phase 3.
    pub background: CancellationToken,
    /// Phase 4.
    pub listeners: CancellationToken,
    deadline: Duration,
}

impl Phases {
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    pub fn new(deadline: Duration) -> Self {
        Self {
            node: NodeStop {
                pods: Stopping::default(),
                drained: CancellationToken::new(),
                heartbeats: CancellationToken::new(),
            },
            background: CancellationToken::new(),
            listeners: CancellationToken::new(),
            deadline,
        }
    }

    /// Phases 1 and 2, from `at` (a signal, or the node stopping by itself): ends the intake of
    /// pod operations and waits for the node to drain those in flight, abandoning them at the
    /// drain's share of the deadline. Returns when the whole shutdown must be over.
    pub async fn drain(&self, at: Instant) -> Instant {
        let (drain, end) = split(self.deadline);
        let pods = &self.node.pods;
        pods.ops.cancel();
        let drained = self.node.drained.cancelled();
        tokio::pin!(drained);
        if tokio::time::timeout_at(at + drain, &mut drained).await.is_err() {
            pods.abandon.cancel();
            if tokio::time::timeout_at(at + end, drained).await.is_err() {
                tracing::warn!("shutdown deadline: the pod controller did not stop (still starting up?)");
            }
        }
        at + end
    }

    /// Phases 3 to 5, each waited for (`waits`, in order) until `end`.
    pub async fn finish(&self, end: Instant, waits: [(&str, &CancellationToken, tokio_util::task::TaskTracker); 3]) {
        for (phase, token, tasks) in waits {
            token.cancel();
            tasks.close();
            if tokio::time::timeout_at(end, tasks.wait()).await.is_err() {
                tracing::warn!(
                    phase,
                    still_running = tasks.len(),
                    "shutdown deadline: not waiting for the rest of this phase"
                );
            } else {
                tracing::debug!(phase, "shutdown phase done");
            }
        }
    }
}

/// (when the drain ends, when everything must be over), from the signal: the phases after the
/// drain get a fifth of the deadline (at most [`AFTER_DRAIN_MAX`]), the runtime's exit
/// [`RUNTIME_EXIT`] of it.
fn split(deadline: Duration) -> (Duration, Duration) {
    let end = deadline.saturating_sub(RUNTIME_EXIT);
    let after_drain = (deadline / 5).min(AFTER_DRAIN_MAX);
    (end.saturating_sub(after_drain), end)
}

/// Waits for SIGTERM or SIGINT; `None` when neither can be listened for (said in the log).
pub async fn signalled() -> Option<&'static str> {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(error) => {
            tracing::error!(%error, "cannot listen for SIGTERM");
            return None;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Some("SIGINT"),
        _ = term.recv() => Some("SIGTERM"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drain_leaves_the_later_phases_their_share() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        assert_eq!(split(s(25)), (s(25) - ms(500) - s(5), s(25) - ms(500)));
        assert_eq!(split(s(3)), (s(3) - ms(500) - ms(600), s(3) - ms(500)));
        assert_eq!(split(s(100)), (s(100) - ms(500) - s(5), s(100) - ms(500)));
    }

    #[test]
    fn the_deadline_is_a_duration_over_a_second() {
        assert_eq!(deadline("25s"), Ok(Duration::from_secs(25)));
        assert_eq!(deadline("1m30s"), Ok(Duration::from_secs(90)));
        assert!(deadline("1s").is_err());
        assert!(deadline("soon").is_err());
    }
}
