//! Whether a connection is doing anything: the requests it has in flight (from the moment the
//! service is called until the response body is done or dropped) and since when it has had
//! none. The idle watchdog closes a connection that stays without a request in flight too long;
//! a request streaming a long body (a peer slice, `kubectl logs -f`) is in flight throughout, so
//! it is never cut as idle.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
struct State {
    in_flight: usize,
    /// When the last request ended (or the connection was accepted).
    since: Instant,
}

/// One connection's activity.
#[derive(Clone)]
pub struct Activity(watch::Sender<State>);

impl Activity {
    /// A connection accepted now, with no request yet.
    pub fn new() -> Self {
        Self(watch::Sender::new(State {
            in_flight: 0,
            since: Instant::now(),
        }))
    }

    /// A request starts; it ends when the returned guard drops.
    pub fn begin(&self) -> InFlight {
        self.0.send_modify(|s| s.in_flight += 1);
        InFlight(self.0.clone())
    }

    /// Completes once the connection has had no request in flight for `first` since it was
    /// accepted (before its first request), or for `idle` since its last request ended.
    pub async fn idle(&self, first: Duration, idle: Duration) {
        let mut rx = self.0.subscribe();
        let mut limit = first;
        loop {
            let state = *rx.borrow_and_update();
            if state.in_flight > 0 {
                limit = idle;
                // The sender lives as long as `self`: `changed` cannot fail here.
                let _ = rx.changed().await;
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(state.since + limit) => return,
                _ = rx.changed() => limit = idle,
            }
        }
    }
}

impl Default for Activity {
    fn default() -> Self {
        Self::new()
    }
}

/// A request in flight; dropping it ends the request.
pub struct InFlight(watch::Sender<State>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.send_modify(|s| {
            s.in_flight = s.in_flight.saturating_sub(1);
            s.since = Instant::now();
        });
    }
}

/// A response body that keeps its request in flight until it is done or dropped.
pub struct Tracked<B> {
    inner: B,
    _request: InFlight,
}

impl<B> Tracked<B> {
    pub fn new(inner: B, request: InFlight) -> Self {
        Self {
            inner,
            _request: request,
        }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn idle_counts_only_time_without_a_request_in_flight() {
        let (first, idle) = (Duration::from_millis(200), Duration::from_millis(300));
        let activity = Activity::new();
        let started = Instant::now();
        // No request at all: the first limit applies from the accept.
        activity.idle(first, idle).await;
        assert!(started.elapsed() >= first, "{:?}", started.elapsed());

        let activity = Activity::new();
        let request = activity.begin();
        let watching = activity.clone();
        let (tx, mut fired) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            watching.idle(first, idle).await;
            let _ = tx.send(Instant::now());
        });
        // A request in flight past both limits keeps the connection busy (the request's own
        // length, not a wait for anything).
        tokio::time::sleep(first + idle * 2).await;
        assert!(fired.try_recv().is_err(), "idle while a request was in flight");
        let ended = Instant::now();
        drop(request);
        let at = fired.await.unwrap();
        assert!(
            at - ended >= idle,
            "the idle limit runs from the request's end: {:?}",
            at - ended
        );
    }
}
