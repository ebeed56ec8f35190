//! The VM event stream (`vm status --event --format json`) with reconnects.
//!
//! Each connection's stdout is read line by line (lines up to [`MAX_LINE`]; longer, blank or undecodable
//! lines are skipped). When a connection cannot be opened or ends abnormally the stream waits with
//! exponential backoff (`initial` doubling to `max`); the backoff resets once a connection has delivered a
//! line (a good start). After a clean end (exit 0) it reconnects after `after_clean_end`.

use super::errors::RuntimeError;
use super::parse::{VmEvent, decode_event_line};
use crate::retry::{Delays, Schedule};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, BufReader};

/// Longest accepted event line (1 MiB).
pub const MAX_LINE: usize = 1 << 20;

/// Reconnect timings (injectable so tests run fast).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchBackoff {
    pub initial: Duration,
    pub max: Duration,
    pub after_clean_end: Duration,
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            after_clean_end: Duration::from_secs(2),
        }
    }
}

/// Backoff state of the event stream: `initial`, doubling, capped at `max` (jittered, the
/// daemon's [`Schedule`]); `reset` after a good start; a fixed delay after a clean end.
#[derive(Debug)]
pub struct Backoff {
    cfg: WatchBackoff,
    failures: Delays,
}

impl Backoff {
    pub fn new(cfg: WatchBackoff) -> Self {
        Self::with(cfg, Schedule::backoff(cfg.initial, cfg.max))
    }

    fn with(cfg: WatchBackoff, schedule: Schedule) -> Self {
        Backoff {
            cfg,
            failures: schedule.delays(),
        }
    }

    /// The delay before the next attempt after a failure; doubles the following one.
    pub fn on_failure(&mut self) -> Duration {
        self.failures.next().unwrap_or(self.cfg.max)
    }
    pub fn reset(&mut self) {
        self.failures.reset();
    }
    pub fn clean_end(&self) -> Duration {
        self.cfg.after_clean_end
    }
}

/// What the watch stream yields.
// Events are the common item and go through a channel one at a time: boxing them would add an
// allocation per event to spare a few hundred bytes on the rare disconnect.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum WatchItem {
    Event(VmEvent),
    /// The connection ended or could not be opened; the stream reconnects after `retry_in`.
    /// `clean` is true for a normal end of stream (exit 0), when callers may do housekeeping (e.g. GC cooldowns).
    Disconnected {
        clean: bool,
        reason: String,
        retry_in: Duration,
    },
}

/// One open event connection: its stdout and a future that resolves when the process ends
/// (`Ok(())` = clean exit). Dropping it must stop the process.
pub struct EventConnection {
    pub stdout: Box<dyn AsyncRead + Send + Unpin>,
    pub finished: BoxFuture<'static, Result<(), RuntimeError>>,
}

/// Opens event connections (the CLI client spawns `cocoon vm status --event --format json`).
pub type Connect = Box<dyn FnMut() -> BoxFuture<'static, Result<EventConnection, RuntimeError>> + Send>;

/// Reads one `\n`-terminated line into `buf` (without the newline). Returns `Ok(None)` at EOF,
/// `Ok(Some(false))` for a line longer than `max` (skipped, its bytes discarded), `Ok(Some(true))` otherwise.
pub async fn read_line_limited<R: AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    buf.clear();
    let mut oversized = false;
    let mut started = false;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(if started { Some(!oversized) } else { None });
        }
        started = true;
        let (take, done) = match avail.iter().position(|b| *b == b'\n') {
            Some(i) => (i, Some(i + 1)),
            None => (avail.len(), None),
        };
        if !oversized {
            if buf.len() + take > max {
                oversized = true;
                buf.clear();
            } else {
                buf.extend_from_slice(&avail[..take]);
            }
        }
        let consumed = done.unwrap_or(take);
        r.consume(consumed);
        if done.is_some() {
            return Ok(Some(!oversized));
        }
    }
}

/// The never-ending event stream over `connect`. Dropping the stream drops the current connection.
pub fn watch(mut connect: Connect, timings: WatchBackoff) -> BoxStream<'static, WatchItem> {
    Box::pin(async_stream::stream! {
        let mut backoff = Backoff::new(timings);
        loop {
            let conn = match connect().await {
                Ok(c) => c,
                Err(e) => {
                    let retry_in = backoff.on_failure();
                    tracing::warn!(error = %e, ?retry_in, "cocoon event stream: start failed");
                    yield WatchItem::Disconnected { clean: false, reason: e.to_string(), retry_in };
                    tokio::time::sleep(retry_in).await;
                    continue;
                }
            };
            let EventConnection { stdout, finished } = conn;
            let mut reader = BufReader::with_capacity(64 * 1024, stdout);
            let mut buf = Vec::new();
            let mut got_line = false;
            let read_error = loop {
                match read_line_limited(&mut reader, &mut buf, MAX_LINE).await {
                    Ok(None) => break None,
                    Ok(Some(ok)) => {
                        if !got_line {
                            got_line = true;
                            backoff.reset();
                        }
                        if !ok {
                            tracing::warn!(max = MAX_LINE, "cocoon event stream: oversized line skipped");
                            continue;
                        }
                        match decode_event_line(&buf) {
                            Some(ev) => yield WatchItem::Event(ev),
                            None => {
                                if !buf.trim_ascii().is_empty() {
                                    tracing::debug!(line = %String::from_utf8_lossy(&buf[..buf.len().min(200)]), "cocoon event stream: undecodable line skipped");
                                }
                            }
                        }
                    }
                    Err(e) => break Some(e),
                }
            };
            drop(reader);
            let end = match read_error {
                Some(e) => Err(format!("reading event stream: {e}")),
                None => finished.await.map_err(|e| e.to_string()),
            };
            match end {
                Ok(()) => {
                    let retry_in = backoff.clean_end();
                    tracing::info!(?retry_in, "cocoon event stream ended; reconnecting");
                    yield WatchItem::Disconnected { clean: true, reason: "stream ended".into(), retry_in };
                    tokio::time::sleep(retry_in).await;
                }
                Err(reason) => {
                    let retry_in = backoff.on_failure();
                    tracing::warn!(%reason, ?retry_in, "cocoon event stream failed; reconnecting");
                    yield WatchItem::Disconnected { clean: false, reason, retry_in };
                    tokio::time::sleep(retry_in).await;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::{Arc, Mutex};

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let cfg = WatchBackoff::default();
        let mut b = Backoff::with(cfg, Schedule::backoff(cfg.initial, cfg.max).exact());
        let got: Vec<u64> = (0..8).map(|_| b.on_failure().as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8, 16, 32, 60, 60]);
        b.reset();
        assert_eq!(b.on_failure(), Duration::from_secs(1));
        assert_eq!(b.clean_end(), Duration::from_secs(2));
    }

    #[tokio::test]
    async fn line_reader_limits_and_skips() {
        let mut data = Vec::new();
        data.extend_from_slice(b"short\n");
        data.extend(std::iter::repeat_n(b'x', 100));
        data.extend_from_slice(b"\nafter\nno-newline");
        let mut r = BufReader::with_capacity(7, data.as_slice());
        let mut buf = Vec::new();
        assert_eq!(read_line_limited(&mut r, &mut buf, 50).await.unwrap(), Some(true));
        assert_eq!(buf, b"short");
        assert_eq!(read_line_limited(&mut r, &mut buf, 50).await.unwrap(), Some(false));
        assert_eq!(read_line_limited(&mut r, &mut buf, 50).await.unwrap(), Some(true));
        assert_eq!(buf, b"after");
        assert_eq!(read_line_limited(&mut r, &mut buf, 50).await.unwrap(), Some(true));
        assert_eq!(buf, b"no-newline");
        assert_eq!(read_line_limited(&mut r, &mut buf, 50).await.unwrap(), None);
    }

    /// Scripted connections: each entry is Err (start fails) or Ok((stdout bytes, clean exit)).
    fn scripted(script: Vec<Result<(Vec<u8>, bool), ()>>) -> (Connect, Arc<Mutex<usize>>) {
        let calls = Arc::new(Mutex::new(0));
        let c2 = calls.clone();
        let script = Arc::new(Mutex::new(script.into_iter()));
        let connect: Connect = Box::new(move || -> BoxFuture<'static, Result<EventConnection, RuntimeError>> {
            *c2.lock().unwrap() += 1;
            let next = script.lock().unwrap().next();
            Box::pin(async move {
                match next {
                    Some(Ok((bytes, clean))) => Ok(EventConnection {
                        stdout: Box::new(std::io::Cursor::new(bytes)),
                        finished: Box::pin(async move {
                            if clean {
                                Ok(())
                            } else {
                                Err(RuntimeError::Command {
                                    verb: "vm status".into(),
                                    code: Some(1),
                                    stderr: "boom".into(),
                                })
                            }
                        }),
                    }),
                    Some(Err(())) => Err(RuntimeError::Command {
                        verb: "vm status".into(),
                        code: None,
                        stderr: "spawn".into(),
                    }),
                    None => futures::future::pending().await,
                }
            })
        });
        (connect, calls)
    }

    #[tokio::test]
    async fn reconnects_with_backoff_and_reset() {
        let ev = br#"{"event":"ADDED","vm":{"id":"A","state":"running","config":{"name":"a"}}}"#.to_vec();
        let mut good = ev.clone();
        good.extend_from_slice(b"\ngarbage\n\n");
        let script = vec![
            Err(()),
            Err(()),
            Ok((good, false)),
            Err(()),
            Ok((ev.clone(), true)),
            Ok((Vec::new(), false)),
            Err(()),
            Err(()),
        ];
        let (connect, calls) = scripted(script);
        let timings = WatchBackoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(25),
            after_clean_end: Duration::from_millis(7),
        };
        let items: Vec<WatchItem> = watch(connect, timings).take(10).collect().await;
        let delays: Vec<_> = items
            .iter()
            .filter_map(|i| match i {
                WatchItem::Disconnected { retry_in, clean, .. } => Some((retry_in.as_millis(), *clean)),
                _ => None,
            })
            .collect();
        // fail 10, fail 20, (a line: reset) abnormal end 10, fail 20, (a line: reset) clean end 7,
        // end without lines 10, fail 20, fail 25 (capped). Failures wait the nominal delay jittered
        // down by at most half; a clean end waits its fixed delay.
        let nominal = [
            (10, false),
            (20, false),
            (10, false),
            (20, false),
            (7, true),
            (10, false),
            (20, false),
            (25, false),
        ];
        assert_eq!(delays.len(), nominal.len(), "{delays:?}");
        for ((got, clean), (want, want_clean)) in delays.iter().zip(nominal) {
            assert_eq!(*clean, want_clean, "{delays:?}");
            if want_clean {
                assert_eq!(*got, want, "{delays:?}");
            } else {
                assert!(
                    *got >= want / 2 && *got <= want,
                    "{got} ms outside [{}, {want}]: {delays:?}",
                    want / 2
                );
            }
        }
        assert_eq!(*calls.lock().unwrap(), 8);
        let events: Vec<_> = items.iter().filter(|i| matches!(i, WatchItem::Event(_))).collect();
        assert_eq!(events.len(), 2, "garbage and blank lines are skipped: {items:?}");
    }
}
