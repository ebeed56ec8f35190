//! Running a synchronous policy decision on the calling task's own thread.
//!
//! A decision takes microseconds; a hop to the blocking pool costs a thread wake-up, hundreds of
//! microseconds of a create on a loaded node. On a multi-thread runtime `block_in_place` lets the
//! decision run here while the worker's other tasks move to another thread, so a policy that
//! spins until its deadline still stalls no other task.

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `decide` on this thread, the runtime's other tasks carried on meanwhile, and gives back
/// its answer, or its panic as an error.
///
/// Needs a multi-thread runtime (`block_in_place` panics on a current-thread one): the caller
/// checks the flavour.
///
/// The task yields once after the decision: a task notices the runtime's shutdown only when it
/// next waits, and without that wait a create whose daemon was stopped during its decision would
/// go on to its next cocoon call. With it, the task ends at that await, as a task waiting on the
/// blocking pool does.
pub(super) async fn on_this_thread<T>(decide: impl FnOnce() -> T) -> std::thread::Result<T> {
    // A panic in the host's side of a decision fails only the operation that asked.
    let decided = tokio::task::block_in_place(|| catch_unwind(AssertUnwindSafe(decide)));
    tokio::task::yield_now().await;
    decided
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    /// Sends on its channel when dropped: the task that owned it has ended.
    struct Ended(mpsc::Sender<()>);
    impl Drop for Ended {
        fn drop(&mut self) {
            let _ = self.0.send(());
        }
    }

    fn one_worker() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    /// The runtime is stopped while a task is inside its decision, and the decision returns
    /// only once the runtime has taken note (a runtime notices its shutdown on its own worker
    /// thread: a task woken before that is polled as usual, whatever it waited on).
    #[test]
    fn a_task_whose_runtime_stopped_during_its_decision_goes_no_further() {
        let rt = one_worker();
        let (started_tx, started) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let (ended_tx, ended) = mpsc::channel();
        let went_on = Arc::new(AtomicBool::new(false));
        rt.spawn({
            let went_on = went_on.clone();
            async move {
                let _ended = Ended(ended_tx);
                let answer = on_this_thread(move || {
                    started_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    7
                })
                .await;
                // Stands for the operation's next cocoon call.
                went_on.store(answer.is_ok(), Ordering::SeqCst);
            }
        });
        let wait = Duration::from_secs(30);
        started.recv_timeout(wait).expect("the decision started");
        // A task on the thread that took the worker's other tasks over: once it was polled,
        // that thread runs the runtime, and it is dropped when the runtime processes its
        // shutdown.
        let (polled_tx, polled) = mpsc::channel();
        let (sentinel_tx, sentinel_dropped) = mpsc::channel();
        rt.spawn(async move {
            let _dropped = Ended(sentinel_tx);
            polled_tx.send(()).unwrap();
            std::future::pending::<()>().await;
        });
        polled
            .recv_timeout(wait)
            .expect("the runtime runs its other tasks meanwhile");
        let handle = rt.handle().clone();
        rt.shutdown_background();
        sentinel_dropped
            .recv_timeout(wait)
            .expect("the runtime processed its shutdown");
        // Every task is taken off the runtime's list as it is stopped.
        let until = std::time::Instant::now() + wait;
        while handle.metrics().num_alive_tasks() > 0 {
            assert!(std::time::Instant::now() < until, "the runtime never stopped its tasks");
            std::thread::yield_now();
        }
        release.send(()).unwrap();
        ended.recv_timeout(wait).expect("the task ended");
        assert!(
            !went_on.load(Ordering::SeqCst),
            "the task went on past its decision after the runtime was shut down"
        );
    }

    #[test]
    fn a_decision_that_panics_is_an_error_of_its_caller_only() {
        let rt = one_worker();
        let answer = rt.block_on(async {
            tokio::spawn(on_this_thread(|| -> u32 { panic!("a host bug") }))
                .await
                .expect("the calling task itself survives")
        });
        assert!(answer.is_err());
        assert_eq!(
            rt.block_on(async { tokio::spawn(on_this_thread(|| 7)).await.unwrap().unwrap() }),
            7
        );
    }
}
