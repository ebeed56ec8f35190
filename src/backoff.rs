//! Exponential backoff without jitter, shared by every retry loop of the daemon: pure delay
//! computation, and an iterator usable as kube-runtime's watcher `Backoff`.

use std::time::Duration;

/// `base · 2^(failures−1)`, capped at `max`; 0 failures ⇒ zero.
pub fn delay(failures: u32, base: Duration, max: Duration) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    let factor = 1u32.checked_shl(failures.saturating_sub(1).min(31)).unwrap_or(u32::MAX);
    base.checked_mul(factor).unwrap_or(max).min(max)
}

/// An endless exponential backoff that resets to its first delay.
#[derive(Debug, Clone)]
pub struct Exponential {
    base: Duration,
    max: Duration,
    failures: u32,
}

impl Exponential {
    pub fn new(base: Duration, max: Duration) -> Self {
        Self { base, max, failures: 0 }
    }
}

impl Iterator for Exponential {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.failures = self.failures.saturating_add(1);
        Some(delay(self.failures, self.base, self.max))
    }
}

impl kube::runtime::utils::Backoff for Exponential {
    fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::utils::Backoff;

    #[test]
    fn doubles_and_caps() {
        let (b, m) = (Duration::from_millis(100), Duration::from_secs(1));
        let got: Vec<u128> = (0..7).map(|f| delay(f, b, m).as_millis()).collect();
        assert_eq!(got, vec![0, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(delay(u32::MAX, b, m), m);
    }

    #[test]
    fn iterator_resets() {
        let mut e = Exponential::new(Duration::from_millis(10), Duration::from_secs(1));
        assert_eq!(e.next(), Some(Duration::from_millis(10)));
        assert_eq!(e.next(), Some(Duration::from_millis(20)));
        e.reset();
        assert_eq!(e.next(), Some(Duration::from_millis(10)));
    }
}
