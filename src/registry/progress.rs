//! [`Progress`]: the bytes a transfer moved and, once known, the bytes it will move — updated by the
//! transfer, read by whoever reports on it (logs, metrics, the stall watchdog).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
// tokio's clock, so the watchdog follows a paused test clock too.
use tokio::time::Instant;

#[derive(Debug, Default)]
pub struct Progress {
    done: AtomicU64,
    /// 0 while unknown.
    total: AtomicU64,
}

impl Progress {
    pub fn new() -> Self {
        Self::default()
    }

    /// `n` more bytes moved.
    pub fn advance(&self, n: u64) {
        self.done.fetch_add(n, Ordering::Relaxed);
    }

    /// The transfer's size is known now.
    pub fn set_total(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
    }

    /// The known size grew by `n` (a push learns it entry by entry from the export's tar headers).
    pub fn grow_total(&self, n: u64) {
        self.total.fetch_add(n, Ordering::Relaxed);
    }

    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// The size known so far; `None` while nothing is known.
    pub fn total(&self) -> Option<u64> {
        Some(self.total.load(Ordering::Relaxed)).filter(|t| *t > 0)
    }
}

/// How a running transfer reports on itself: a progress line every `interval`, and failure when no byte
/// moved for `stall` (`SNAPSHOT_PROGRESS_INTERVAL_SECONDS`, `SNAPSHOT_STALL_TIMEOUT_SECONDS`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Watch {
    pub interval: Duration,
    pub stall: Duration,
}

/// Why a watched transfer stopped early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stalled {
    pub moved: u64,
    pub idle: Duration,
}

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no byte moved for {} s after {} bytes (SNAPSHOT_STALL_TIMEOUT_SECONDS); the transfer was stopped",
            self.idle.as_secs(),
            self.moved
        )
    }
}

/// Runs `transfer` while watching `progress`: logs bytes, rate and ETA every `watch.interval`, and gives
/// up with [`Stalled`] when the byte count stays still for `watch.stall` (the transfer is dropped, which
/// cancels its requests and its reader).
pub(crate) async fn watched<T>(
    transfer: impl Future<Output = T>,
    progress: &Progress,
    watch: Watch,
    what: &str,
) -> Result<T, Stalled> {
    let started = Instant::now();
    // Fine enough to notice a stall within a second or so of its deadline, cheap either way.
    let tick = watch
        .interval
        .min(watch.stall / 4)
        .clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut ticker = tokio::time::interval(tick);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut transfer = std::pin::pin!(transfer);
    let (mut last_bytes, mut last_move) = (progress.done(), Instant::now());
    let mut last_log = Instant::now();
    loop {
        tokio::select! {
            out = &mut transfer => return Ok(out),
            _ = ticker.tick() => {
                let done = progress.done();
                let now = Instant::now();
                if done != last_bytes {
                    (last_bytes, last_move) = (done, now);
                } else if now - last_move >= watch.stall {
                    tracing::warn!(transfer = what, bytes = done, idle_s = (now - last_move).as_secs(), "transfer stalled");
                    return Err(Stalled { moved: done, idle: now - last_move });
                }
                if now - last_log >= watch.interval {
                    last_log = now;
                    let line = progress.line(now - started);
                    tracing::info!(transfer = what, bytes = done, total = progress.total(), rate_mib_s = line.rate_mib_s, eta_s = line.eta_s, "transfer progress");
                }
            }
        }
    }
}

/// A progress report's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Line {
    pub rate_mib_s: f64,
    /// Seconds left at the current average rate, while the total is known and the rate is not zero.
    pub eta_s: Option<u64>,
}

impl Progress {
    pub(crate) fn line(&self, elapsed: Duration) -> Line {
        let done = self.done();
        let secs = elapsed.as_secs_f64().max(1e-3);
        let rate = done as f64 / secs;
        let eta_s = self
            .total()
            .filter(|_| rate > 0.0)
            .map(|t| (t.saturating_sub(done) as f64 / rate).ceil() as u64);
        Line {
            rate_mib_s: rate / (1u64 << 20) as f64,
            eta_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_has_the_average_rate_and_the_time_left() {
        let p = Progress::new();
        assert_eq!(p.line(Duration::from_secs(1)).eta_s, None);
        p.set_total(300 << 20);
        p.advance(100 << 20);
        let l = p.line(Duration::from_secs(10));
        assert_eq!(l.rate_mib_s, 10.0);
        assert_eq!(l.eta_s, Some(20));
    }

    #[tokio::test]
    async fn a_transfer_that_moves_no_byte_for_the_stall_time_is_stopped() {
        let p = Progress::new();
        let watch = Watch {
            interval: Duration::from_millis(50),
            stall: Duration::from_secs(2),
        };
        // Moves a byte every 50 ms (never idle for anything near the stall time), four times, then stops.
        let transfer = async {
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                p.advance(1);
            }
            std::future::pending::<()>().await
        };
        let e = watched(transfer, &p, watch, "t").await.unwrap_err();
        assert_eq!(e.moved, 4, "stopped only once the bytes stopped");
        assert!(e.idle >= watch.stall, "{e:?}");
        assert!(e.to_string().contains("SNAPSHOT_STALL_TIMEOUT_SECONDS"), "{e}");
    }

    #[tokio::test]
    async fn a_finished_transfer_returns_its_outcome() {
        let p = Progress::new();
        let watch = Watch {
            interval: Duration::from_secs(1),
            stall: Duration::from_secs(5),
        };
        let out = watched(async { 7 }, &p, watch, "t").await.unwrap();
        assert_eq!(out, 7);
    }
}
