//! [`Progress`]: the bytes a transfer moved and, once known, the bytes it will move — updated by the
//! transfer, read by whoever reports on it (logs, metrics, the stall watchdog).

use std::sync::atomic::{AtomicU64, Ordering};

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
