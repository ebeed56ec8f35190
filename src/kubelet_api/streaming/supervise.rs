//! The tasks of a streaming session (its transport's reader and writer, the handler body that
//! runs on the upgraded connection) must not die silently: a panic in one is caught, logged with
//! what it was doing, counted (`cocoon_vk_kubelet_api_panics_total{where="session"}`), and the
//! caller's `on_panic` ends the session, so its client sees the connection close at once and
//! its admission slot is freed — instead of a half-open session that lives until the idle
//! timeout.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use prometheus::IntCounter;
use tokio::task::JoinHandle;

/// What a panic said, for the log.
pub fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// Logs and counts the panic of `what` (a task already caught by its join handle, or by
/// [`spawn`]).
pub fn report_panic(what: &str, panics: &Option<IntCounter>, panic: &(dyn Any + Send)) {
    tracing::error!(
        task = what,
        panic = panic_message(panic),
        "kubelet API: a streaming task panicked (caught: what it served is ended)"
    );
    if let Some(counter) = panics {
        counter.inc();
    }
}

/// Spawns `task`; should it panic, the panic is logged and counted on `panics`, and
/// `on_panic` runs.
pub fn spawn<F, P>(what: &'static str, panics: Option<IntCounter>, task: F, on_panic: P) -> JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
    P: FnOnce() + Send + 'static,
{
    // Unwind safety: `on_panic` ends the session, so no state the task shared is used again
    // as if the task had finished.
    tokio::spawn(async move {
        if let Err(panic) = AssertUnwindSafe(task).catch_unwind().await {
            report_panic(what, &panics, panic.as_ref());
            on_panic();
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panicking_task_is_counted_and_ends_its_session() {
        let counter = IntCounter::new("panics", "test").unwrap();
        let ended = tokio_util::sync::CancellationToken::new();
        let on_panic = ended.clone();
        let task = spawn("test", Some(counter.clone()), async { panic!("boom") }, move || {
            on_panic.cancel()
        });
        task.await.expect("the panic does not escape the task");
        assert!(ended.is_cancelled());
        assert_eq!(counter.get(), 1);
        // A task that ends normally leaves both alone.
        let calm = IntCounter::new("calm", "test").unwrap();
        spawn("test", Some(calm.clone()), async {}, || {
            panic!("on_panic of a calm task")
        })
        .await
        .unwrap();
        assert_eq!(calm.get(), 0);
    }
}
