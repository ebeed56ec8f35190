//! Turns of the node's bring-ups (`VK_MAX_CONCURRENT_BRING_UPS`): at most that many creates run
//! their cocoon work (lookups, the clone or restore) at once; the others wait, first come first
//! served. The wait is a queue, not a retry: the pod's operation stays in flight and starts its
//! bring-up the moment a turn frees, with no timer and no polling in between. How long creates
//! waited is `cocoon_vk_bring_up_wait_seconds`; how many wait now, `cocoon_vk_bring_ups_waiting`.

use std::time::{Duration, Instant};

use prometheus::{Histogram, IntGauge};
use tokio::sync::{Semaphore, SemaphorePermit};

/// The node's bring-up turns.
pub(super) struct Turns {
    slots: Semaphore,
    waiting: IntGauge,
    running: IntGauge,
    waited: Histogram,
}

/// One bring-up's turn, held while its cocoon work runs; dropping it gives the turn to the next.
pub(super) struct Turn<'a> {
    _permit: SemaphorePermit<'a>,
    running: &'a IntGauge,
    /// How long this bring-up waited for its turn.
    pub waited: Duration,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.running.dec();
    }
}

/// Counts a waiter while it waits, also when its create is dropped mid-wait.
struct Waiting<'a>(&'a IntGauge);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Turns {
    /// `limit` turns (at least one).
    pub fn new(limit: usize, waiting: IntGauge, running: IntGauge, waited: Histogram) -> Self {
        Self {
            slots: Semaphore::new(limit.max(1)),
            waiting,
            running,
            waited,
        }
    }

    /// Waits for a turn (FIFO: tokio's semaphore serves waiters in order).
    pub async fn take(&self) -> Turn<'_> {
        let started = Instant::now();
        self.waiting.inc();
        let guard = Waiting(&self.waiting);
        // The semaphore is never closed, so acquiring only fails if it were.
        let permit = self.slots.acquire().await.expect("the bring-up turns are never closed");
        drop(guard);
        self.running.inc();
        let waited = started.elapsed();
        self.waited.observe(waited.as_secs_f64());
        Turn {
            _permit: permit,
            running: &self.running,
            waited,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turns(limit: usize) -> Turns {
        let gauge = |n: &str| IntGauge::new(n, n).unwrap();
        let histogram = Histogram::with_opts(prometheus::HistogramOpts::new("w", "w")).unwrap();
        Turns::new(limit, gauge("waiting"), gauge("running"), histogram)
    }

    #[tokio::test]
    async fn a_bring_up_beyond_the_limit_waits_for_a_turn_to_free_and_is_counted_waiting() {
        let t = turns(2);
        let (a, b) = (t.take().await, t.take().await);
        assert_eq!(t.running.get(), 2);
        let mut third = Box::pin(t.take());
        // Polled once: it queues (counted waiting), it does not run.
        assert!(futures::poll!(third.as_mut()).is_pending());
        assert_eq!((t.waiting.get(), t.running.get()), (1, 2));
        drop(a);
        let c = third.await;
        assert_eq!((t.waiting.get(), t.running.get()), (0, 2));
        assert_eq!(t.waited.get_sample_count(), 3);
        drop((b, c));
        assert_eq!(t.running.get(), 0);
    }

    #[tokio::test]
    async fn a_create_dropped_while_it_waits_is_no_longer_counted_waiting() {
        let t = turns(1);
        let held = t.take().await;
        let mut waiter = Box::pin(t.take());
        assert!(futures::poll!(waiter.as_mut()).is_pending());
        assert_eq!(t.waiting.get(), 1);
        drop(waiter);
        assert_eq!(t.waiting.get(), 0);
        drop(held);
        assert_eq!(t.slots.available_permits(), 1);
    }
}
