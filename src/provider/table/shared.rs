//! Work shared between pods (a fork snapshot, a clone source pull, an image pull or import) as a
//! single flight: the first caller of a key starts the work as a task of its own, and every
//! caller of that key — those already waiting and those arriving while it runs — gets its one
//! result. A caller that goes away (its pod deleted) does not stop it: others may still want it.
//! The work has its own deadline and stops when the provider closes. The key is forgotten once
//! the work ends, so a failure is not remembered: the next caller starts it anew.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio_util::sync::CancellationToken;

/// Why shared work ended without its own result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interrupted {
    /// It ran past its deadline.
    TimedOut(Duration),
    /// The provider is closing.
    Closing,
    /// The task ended abnormally (a panic).
    Lost(String),
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TimedOut(after) => write!(f, "gave up after {after:?}"),
            Self::Closing => f.write_str("the daemon is stopping"),
            Self::Lost(why) => write!(f, "the task ended abnormally: {why}"),
        }
    }
}

/// The deadline of one piece of shared work (a pull or an import of many GiB included).
pub const SHARED_WORK_DEADLINE: Duration = Duration::from_secs(30 * 60);

type Flight<T> = Shared<BoxFuture<'static, Result<T, Interrupted>>>;

/// The flights of one kind of result, by key.
pub struct SharedWork<T: Clone + Send + Sync + 'static> {
    flights: Arc<Mutex<HashMap<String, Flight<T>>>>,
}

impl<T: Clone + Send + Sync + 'static> Default for SharedWork<T> {
    fn default() -> Self {
        Self {
            flights: Arc::default(),
        }
    }
}

impl<T: Clone + Send + Sync + 'static> SharedWork<T> {
    /// The result of `key`'s work: joins the flight in progress, or starts `work` (within
    /// `deadline`, stopped by `closing`) as a new one.
    pub async fn run<F, Fut>(
        &self,
        key: &str,
        deadline: Duration,
        closing: &CancellationToken,
        work: F,
    ) -> Result<T, Interrupted>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T> + Send + 'static,
    {
        let flight = {
            let mut flights = self.flights.lock().expect("shared work");
            match flights.get(key) {
                Some(flight) => flight.clone(),
                None => {
                    let flight = self.start(key.to_string(), deadline, closing.clone(), work());
                    flights.insert(key.to_string(), flight.clone());
                    flight
                }
            }
        };
        flight.await
    }

    fn start(
        &self,
        key: String,
        deadline: Duration,
        closing: CancellationToken,
        work: impl Future<Output = T> + Send + 'static,
    ) -> Flight<T> {
        let flights = Arc::downgrade(&self.flights);
        let task = tokio::spawn(async move {
            let result = tokio::select! {
                _ = closing.cancelled() => Err(Interrupted::Closing),
                done = tokio::time::timeout(deadline, work) => done.map_err(|_| Interrupted::TimedOut(deadline)),
            };
            // Ended: the next caller starts the work anew.
            if let Some(flights) = flights.upgrade() {
                flights.lock().expect("shared work").remove(&key);
            }
            result
        });
        async move { task.await.unwrap_or_else(|e| Err(Interrupted::Lost(e.to_string()))) }
            .boxed()
            .shared()
    }

    /// Flights in progress.
    pub fn len(&self) -> usize {
        self.flights.lock().expect("shared work").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn callers_of_a_key_share_one_run_that_outlives_a_caller_who_left() {
        let work: Arc<SharedWork<usize>> = Arc::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let closing = CancellationToken::new();
        let (release, gate) = tokio::sync::oneshot::channel::<()>();
        let gate = gate.shared();
        let start = |work: Arc<SharedWork<usize>>| {
            let (runs, gate, closing) = (runs.clone(), gate.clone(), closing.clone());
            tokio::spawn(async move {
                work.run("image:a", Duration::from_secs(60), &closing, move || async move {
                    let _ = gate.await;
                    runs.fetch_add(1, Ordering::SeqCst) + 1
                })
                .await
            })
        };
        let first = start(work.clone());
        let second = start(work.clone());
        let leaver = start(work.clone());
        while work.is_empty() {
            tokio::task::yield_now().await;
        }
        // A caller goes away: the work goes on for the others.
        leaver.abort();
        let _ = leaver.await;
        release.send(()).unwrap();
        assert_eq!(first.await.unwrap(), Ok(1));
        assert_eq!(second.await.unwrap(), Ok(1), "one run, one result for both");
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(work.is_empty(), "the key is forgotten once the work ends");
        // The next call runs again (a failure is not remembered either).
        let again = work
            .run("image:a", Duration::from_secs(60), &closing, || async { 7 })
            .await;
        assert_eq!(again, Ok(7));
    }

    /// Work of different keys (two snapshots, two images) is not serialised: here the first
    /// key's work can only end once the second key's work has run.
    #[tokio::test]
    async fn different_keys_run_at_the_same_time() {
        let work: Arc<SharedWork<()>> = Arc::default();
        let closing = CancellationToken::new();
        let (open, gate) = tokio::sync::oneshot::channel::<()>();
        let first = {
            let (work, closing) = (work.clone(), closing.clone());
            tokio::spawn(async move {
                work.run("snapshot:a", Duration::from_secs(60), &closing, move || async move {
                    let _ = gate.await;
                })
                .await
            })
        };
        while work.is_empty() {
            tokio::task::yield_now().await;
        }
        let second = work.run("snapshot:b", Duration::from_secs(60), &closing, move || async move {
            let _ = open.send(());
        });
        let both = async { (second.await, first.await.unwrap()) };
        let (second, first) = tokio::time::timeout(Duration::from_secs(10), both)
            .await
            .expect("the second key waited for the first");
        assert_eq!((first, second), (Ok(()), Ok(())));
    }

    #[tokio::test]
    async fn the_work_has_its_own_deadline_and_stops_when_the_provider_closes() {
        let work: SharedWork<()> = SharedWork::default();
        let closing = CancellationToken::new();
        let slow = work
            .run("pull:x", Duration::from_millis(20), &closing, || {
                std::future::pending::<()>()
            })
            .await;
        assert_eq!(slow, Err(Interrupted::TimedOut(Duration::from_millis(20))));
        closing.cancel();
        let stopped = work
            .run("pull:y", Duration::from_secs(60), &closing, || {
                std::future::pending::<()>()
            })
            .await;
        assert_eq!(stopped, Err(Interrupted::Closing));
        assert!(work.is_empty());
    }
}
