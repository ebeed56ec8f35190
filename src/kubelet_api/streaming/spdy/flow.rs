//! SPDY/3.1 send windows (per stream and per session, 64 KiB to start; WINDOW_UPDATE and
//! SETTINGS_INITIAL_WINDOW_SIZE move them).
//!
//! Go's spdystream — the apiserver's and kubectl's side — neither sends WINDOW_UPDATE nor
//! honours it: it relies on TCP back-pressure. Holding data back until a window opens would stall
//! such a peer forever after 64 KiB. So the windows are always counted, but only enforced once the
//! peer has shown it does flow control (its first WINDOW_UPDATE or INITIAL_WINDOW_SIZE); from then
//! on a sender waits for the window like the protocol asks.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};

/// The initial window of every stream and of the session.
pub const INITIAL_WINDOW: i64 = 64 * 1024;
/// A window may not grow past 2^31-1.
pub const MAX_WINDOW: i64 = 0x7fff_ffff;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the peer grew a SPDY flow-control window past 2^31-1")]
pub struct WindowOverflow;

/// One send window.
#[derive(Debug)]
pub struct Window {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    available: i64,
    wakers: Vec<Waker>,
}

impl Window {
    pub fn new(initial: i64) -> Self {
        Self {
            state: Mutex::new(State {
                available: initial,
                wakers: Vec::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn available(&self) -> i64 {
        self.lock().available
    }

    /// Up to `want` bytes of window, or `Pending` (woken by [`Window::grow`]) while it is
    /// closed.
    pub fn poll_open(&self, cx: &mut Context<'_>, want: usize) -> Poll<usize> {
        let mut s = self.lock();
        if s.available > 0 {
            return Poll::Ready(want.min(s.available as usize));
        }
        if !s.wakers.iter().any(|w| w.will_wake(cx.waker())) {
            s.wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// `n` bytes were sent.
    pub fn consume(&self, n: usize) {
        self.lock().available -= n as i64;
    }

    /// A WINDOW_UPDATE (or a changed initial size, `delta` possibly negative).
    pub fn grow(&self, delta: i64) -> Result<(), WindowOverflow> {
        let mut s = self.lock();
        let next = s.available + delta;
        if next > MAX_WINDOW {
            return Err(WindowOverflow);
        }
        s.available = next;
        if next > 0 {
            for w in s.wakers.drain(..) {
                w.wake();
            }
        }
        Ok(())
    }

    /// Wakes every waiter (the session ended: they must see it).
    pub fn wake_all(&self) {
        for w in self.lock().wakers.drain(..) {
            w.wake();
        }
    }
}

/// Whether the peer has shown it does flow control.
#[derive(Debug, Default)]
pub struct Enforcement(AtomicBool);

impl Enforcement {
    pub fn enabled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    pub fn enable(&self) {
        self.0.store(true, Ordering::Release);
    }
}

/// How much a receiver has consumed since it last returned credit: a WINDOW_UPDATE is due
/// once half the window is used (fewer, larger updates).
#[derive(Debug, Default)]
pub struct Credit(u32);

impl Credit {
    /// Counts `n` consumed bytes; returns the delta to send, if one is due.
    pub fn consumed(&mut self, n: usize) -> Option<u32> {
        self.0 = self.0.saturating_add(n as u32);
        if i64::from(self.0) >= INITIAL_WINDOW / 2 {
            Some(std::mem::take(&mut self.0))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_closed_window_parks_the_sender_until_an_update() {
        let w = Window::new(10);
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert_eq!(w.poll_open(&mut cx, 100), Poll::Ready(10), "at most what is open");
        w.consume(10);
        assert_eq!(w.poll_open(&mut cx, 100), Poll::Pending);
        w.grow(4).unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken by the update");
        assert_eq!(w.poll_open(&mut cx, 100), Poll::Ready(4));
        // A negative delta (a smaller initial window) may close it again.
        w.grow(-10).unwrap();
        assert_eq!(w.available(), -6);
        assert_eq!(w.poll_open(&mut cx, 1), Poll::Pending);
    }

    #[test]
    fn windows_cannot_overflow() {
        let w = Window::new(INITIAL_WINDOW);
        assert_eq!(w.grow(MAX_WINDOW), Err(WindowOverflow));
        assert!(w.grow(MAX_WINDOW - INITIAL_WINDOW).is_ok());
    }

    #[test]
    fn credit_is_returned_in_half_window_steps() {
        let mut c = Credit::default();
        assert_eq!(c.consumed(20_000), None);
        assert_eq!(c.consumed(20_000), Some(40_000));
        assert_eq!(c.consumed(1), None);
    }
}
