//! The daemon's one retry schedule. Every wait between two attempts of anything — a pod operation
//! the pod controller retries, a requeue a provider asks for, a watch reconnect, a lease renewal,
//! an apiserver write retried inside an operation, the guest fixup's fixed cadence — is a
//! [`Schedule`], and its delays come from [`backon`] (the crate kube-runtime's own watcher backoff
//! is built on).
//!
//! A backoff schedule doubles from `min` to `max` with *equal jitter*: each delay is drawn from
//! `[d/2, d)` of the un-jittered delay `d`, so a thousand pods that failed together (a registry
//! outage) do not retry in step, and no delay ever exceeds `max`. (backon's jitter adds up to one
//! more delay; asking it for half the delays gives the equal-jitter spread.) A fixed cadence kept
//! from the Go daemon (the fixup every 3 s) is `Schedule::every` and has no jitter. An optional
//! budget bounds a loop by elapsed time — the time of the attempts included, as the spec's budgets
//! are written — and an optional attempt count bounds it by tries.
//!
//! Nothing else in the provider sleeps: a loop that tries again takes its waits from here
//! ([`Schedule::retry`] on backon's `Retryable`, [`Delays::wait`] / [`Delays::wait_or_cancel`]
//! for a loop whose body decides more than "ok or error", [`Schedule::poll`] for a wait on a
//! condition, [`pause`] for a cadence computed elsewhere), so every wait is a schedule a reader
//! can find and a cancellation token can stop.

use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable};
use tokio_util::sync::CancellationToken;

/// When to try again.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    min: Duration,
    max: Duration,
    factor: f32,
    jitter: bool,
    /// At most this many waits (so `attempts + 1` tries).
    retries: Option<usize>,
    /// No wait that would end past this much time since the first try.
    budget: Option<Duration>,
}

impl Schedule {
    /// Doubling from `min` to `max`, with equal jitter.
    pub const fn backoff(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            factor: 2.0,
            jitter: true,
            retries: None,
            budget: None,
        }
    }

    /// A fixed cadence: every `interval`, no jitter.
    pub const fn every(interval: Duration) -> Self {
        Self {
            min: interval,
            max: interval,
            factor: 1.0,
            jitter: false,
            retries: None,
            budget: None,
        }
    }

    /// The same delays without jitter (a cadence the spec fixes, a test that counts).
    pub const fn exact(mut self) -> Self {
        self.jitter = false;
        self
    }

    /// At most `tries` tries in all.
    pub const fn tries(mut self, tries: usize) -> Self {
        self.retries = Some(tries.saturating_sub(1));
        self
    }

    /// Within `budget` of elapsed time since the first try.
    pub const fn within(mut self, budget: Duration) -> Self {
        self.budget = Some(budget);
        self
    }

    pub const fn min(&self) -> Duration {
        self.min
    }

    pub const fn max(&self) -> Duration {
        self.max
    }

    pub const fn budget(&self) -> Option<Duration> {
        self.budget
    }

    /// The waits of one run of the schedule, its clock starting now.
    pub fn delays(&self) -> Delays {
        self.delays_seeded(None)
    }

    /// [`Schedule::delays`] with a fixed jitter seed (reproducible tests).
    pub fn delays_seeded(&self, seed: Option<u64>) -> Delays {
        Delays {
            schedule: *self,
            seed,
            inner: self.builder(seed).build(),
            started: Instant::now(),
        }
    }

    fn builder(&self, seed: Option<u64>) -> ExponentialBuilder {
        // Equal jitter: backon draws from [h, 2h); halving every delay gives [d/2, d).
        let (min, max) = if self.jitter {
            (self.min / 2, self.max / 2)
        } else {
            (self.min, self.max)
        };
        let mut b = ExponentialBuilder::new()
            .with_min_delay(min)
            .with_max_delay(max)
            .with_factor(self.factor)
            .without_max_times();
        if let Some(retries) = self.retries {
            b = b.with_max_times(retries);
        }
        if self.jitter {
            b = b.with_jitter();
            if let Some(seed) = seed {
                b = b.with_jitter_seed(seed);
            }
        }
        b
    }

    /// Runs `attempt` until it succeeds, `retryable` says an error is final, or the schedule
    /// runs out (the last error is returned). `on_retry` sees each retried error and its wait.
    /// The loop is backon's [`Retryable`] over this schedule's [`Delays`] (its budget included).
    pub async fn retry<T, E, F, Fut>(
        &self,
        attempt: F,
        retryable: impl FnMut(&E) -> bool,
        on_retry: impl FnMut(&E, Duration),
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        attempt
            .retry(self.delays())
            .sleep(tokio::time::sleep)
            .when(retryable)
            .notify(on_retry)
            .await
    }

    /// Asks `done` on this schedule's cadence until it says yes; false when the schedule ran
    /// out first (a wait on a condition, never a fixed sleep standing in for one).
    pub async fn poll(&self, mut done: impl FnMut() -> bool) -> bool {
        let mut delays = self.delays();
        loop {
            if done() {
                return true;
            }
            if !delays.wait().await {
                return false;
            }
        }
    }
}

/// Waits `wait`, or less when `cancel` fires first: whether the wait ran to its end. The one
/// wait of the daemon's loops that is not a retry (a prober's cadence, a first delay) but must
/// still stop with its owner.
pub async fn pause(wait: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(wait) => true,
    }
}

/// The waits of one run of a [`Schedule`]: an iterator that ends when the schedule's tries or
/// budget are used up.
#[derive(Debug)]
pub struct Delays {
    schedule: Schedule,
    seed: Option<u64>,
    inner: ExponentialBackoff,
    started: Instant,
}

impl Delays {
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Starts over (the first wait again; the budget's clock from now).
    pub fn reset(&mut self) {
        *self = self.schedule.delays_seeded(self.seed);
    }

    /// Time since the first try.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Waits the schedule's next delay: false, without waiting, when the schedule has run out.
    pub async fn wait(&mut self) -> bool {
        match self.next() {
            Some(wait) => {
                tokio::time::sleep(wait).await;
                true
            }
            None => false,
        }
    }

    /// [`Delays::wait`], or less when `cancel` fires first: false when the schedule has run out
    /// or the wait was cancelled (the loop's owner is stopping).
    pub async fn wait_or_cancel(&mut self, cancel: &CancellationToken) -> bool {
        match self.next() {
            Some(wait) => pause(wait, cancel).await,
            None => false,
        }
    }

    /// Whether the budget would still admit a wait of `wait`.
    fn admits(&self, wait: Duration) -> bool {
        self.schedule.budget.is_none_or(|b| self.elapsed() + wait < b)
    }
}

impl Iterator for Delays {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let wait = self.inner.next()?;
        self.admits(wait).then_some(wait)
    }
}

/// kube-runtime's watcher takes a resettable backoff.
impl kube::runtime::utils::Backoff for Delays {
    fn reset(&mut self) {
        Delays::reset(self);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_backoff_doubles_to_its_cap_with_equal_jitter() {
        let schedule = Schedule::backoff(S, 300 * S);
        for seed in 0..20 {
            let waits: Vec<Duration> = schedule.delays_seeded(Some(seed)).take(12).collect();
            let mut nominal = S;
            for w in &waits {
                assert!(
                    *w >= nominal / 2 && *w <= nominal,
                    "seed {seed}: {w:?} outside [{:?}, {nominal:?}]",
                    nominal / 2
                );
                nominal = (nominal * 2).min(300 * S);
            }
            assert!(waits.iter().all(|w| *w <= 300 * S), "never past the cap");
        }
        let spread: std::collections::HashSet<Duration> = (0..20)
            .map(|seed| schedule.delays_seeded(Some(seed)).next().unwrap())
            .collect();
        assert!(spread.len() > 10, "the first waits of many pods are spread: {spread:?}");
    }

    #[test]
    fn exact_schedules_and_fixed_cadences() {
        let waits: Vec<u64> = Schedule::backoff(15 * S, 300 * S)
            .exact()
            .delays()
            .take(8)
            .map(|d| d.as_secs())
            .collect();
        assert_eq!(waits, vec![15, 30, 60, 120, 240, 300, 300, 300]);
        let every: Vec<Duration> = Schedule::every(3 * S).delays().take(3).collect();
        assert_eq!(every, vec![3 * S; 3]);
        assert_eq!(
            Schedule::every(Duration::ZERO).tries(3).delays().count(),
            2,
            "three tries wait twice"
        );
    }

    #[test]
    fn a_budget_ends_the_waits() {
        let mut d = Schedule::every(3 * S).within(180 * S).delays();
        assert_eq!(d.next(), Some(3 * S));
        let mut d = Schedule::every(3 * S).within(2 * S).delays();
        assert_eq!(d.next(), None, "a wait that would end past the budget is not taken");
        d.reset();
        assert_eq!(d.next(), None);
    }

    #[tokio::test]
    async fn retry_stops_on_success_a_final_error_or_the_last_try() {
        let schedule = Schedule::every(Duration::ZERO).tries(3);
        let mut calls = 0;
        let r: Result<(), &str> = schedule
            .retry(
                || {
                    calls += 1;
                    async { Err("down") }
                },
                |_| true,
                |_, _| {},
            )
            .await;
        assert_eq!((r, calls), (Err("down"), 3));
        let mut calls = 0;
        let r: Result<(), &str> = schedule
            .retry(
                || {
                    calls += 1;
                    async { Err("refused") }
                },
                |e| *e != "refused",
                |_, _| {},
            )
            .await;
        assert_eq!((r, calls), (Err("refused"), 1));
        let mut calls = 0;
        let r = schedule
            .retry(
                || {
                    calls += 1;
                    let n = calls;
                    async move { if n < 2 { Err("x") } else { Ok(n) } }
                },
                |_| true,
                |_, _| {},
            )
            .await;
        assert_eq!(r, Ok(2));
    }

    #[tokio::test]
    async fn waits_end_with_their_schedule_or_their_cancellation() {
        let mut two = Schedule::every(Duration::ZERO).tries(3).delays();
        assert!(two.wait().await && two.wait().await, "three tries wait twice");
        assert!(!two.wait().await, "then the schedule has run out");
        let cancel = CancellationToken::new();
        cancel.cancel();
        let mut long = Schedule::every(3600 * S).delays();
        assert!(
            !long.wait_or_cancel(&cancel).await,
            "a cancelled owner does not wait out the hour"
        );
        assert!(!pause(3600 * S, &cancel).await);
        assert!(pause(Duration::ZERO, &CancellationToken::new()).await);
    }

    #[tokio::test]
    async fn poll_asks_until_the_condition_holds_or_the_schedule_ends() {
        let mut asked = 0;
        let met = Schedule::every(Duration::ZERO)
            .tries(10)
            .poll(|| {
                asked += 1;
                asked == 4
            })
            .await;
        assert!(met);
        assert_eq!(asked, 4, "no question after the condition held");
        let mut asked = 0;
        let met = Schedule::every(Duration::ZERO)
            .tries(3)
            .poll(|| {
                asked += 1;
                false
            })
            .await;
        assert!(!met);
        assert_eq!(asked, 3, "one question per try");
    }
}
