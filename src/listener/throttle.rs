//! A warning that a flood cannot turn into a log flood: every occurrence is counted, and the
//! warning is due at most once per period (with the count so far); the rest go to debug.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub struct Throttled {
    every: Duration,
    count: AtomicU64,
    warned: Mutex<Option<Instant>>,
}

impl Throttled {
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            count: AtomicU64::new(0),
            warned: Mutex::new(None),
        }
    }

    /// Counts one occurrence; `Some(total so far)` when the warning is due.
    pub fn note(&self) -> Option<u64> {
        let total = self.count.fetch_add(1, Ordering::Relaxed) + 1;
        let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        if warned.is_some_and(|at| at.elapsed() < self.every) {
            return None;
        }
        *warned = Some(Instant::now());
        Some(total)
    }

    /// Occurrences so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_occurrence_warns_then_only_once_per_period() {
        let t = Throttled::new(Duration::from_secs(3600));
        assert_eq!(t.note(), Some(1));
        for _ in 0..99 {
            assert_eq!(t.note(), None);
        }
        assert_eq!(t.count(), 100);
        let t = Throttled::new(Duration::ZERO);
        assert_eq!((t.note(), t.note()), (Some(1), Some(2)));
    }
}
