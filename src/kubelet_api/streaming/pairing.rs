//! Port-forward's connections in the making: a client opens a `data` and an `error` stream per
//! forwarded connection, tied by their `requestid`, and the first waits here for the second.
//!
//! What a waiting stream may cost is bounded, because a peer decides how many it opens and what
//! their headers hold:
//! * only `data` and `error` streams wait (another type is reset before anything is kept);
//! * a request id is short (at most [`MAX_REQUEST_ID`] bytes: the clients number their
//!   connections), and a waiting stream keeps only the headers forwarding reads;
//! * at most `limit` connections wait at once (the session's connection limit): a stream that
//!   would start one more is refused (RST_STREAM REFUSED_STREAM), the others stay;
//! * each waits at most the stream creation timeout, expired in deadline order (a timer queue:
//!   constant work per stream, however many wait).

use std::collections::HashMap;
use std::time::Duration;

use tokio_util::time::{DelayQueue, delay_queue};

use super::spdy::codec::HeaderBlock;
use super::spdy::codec::frame::rst;
use super::spdy::{Session, Stream};

/// The longest `requestid` accepted (kubectl and client-go send a decimal counter).
pub const MAX_REQUEST_ID: usize = 128;
/// The longest `port` value kept (a valid one has at most 5 digits; a longer one is reported
/// as invalid when the connection is made).
const MAX_PORT_VALUE: usize = 32;

/// The pair a stream belongs to: its `requestid`, or — for clients too old to send one — the
/// kubelet's guess from the stream ids (an error stream and the data stream 2 after it).
fn request_id(stream: &Stream) -> String {
    match stream.headers.get("requestid") {
        Some(id) if !id.is_empty() => id.to_string(),
        _ if stream.stream_type() == Some("data") => format!("#{}", stream.id.saturating_sub(2)),
        _ => format!("#{}", stream.id),
    }
}

/// The headers forwarding reads, each cut to a sane length; the rest of what the peer sent
/// (up to the session's header limit) is not kept while the stream waits.
fn kept_headers(headers: &HeaderBlock) -> HeaderBlock {
    let cut = |v: &str, max: usize| {
        let mut end = v.len().min(max);
        while !v.is_char_boundary(end) {
            end -= 1;
        }
        v[..end].to_string()
    };
    HeaderBlock(
        headers
            .0
            .iter()
            .filter_map(|(name, value)| match name.as_str() {
                "streamtype" | "requestid" => Some((name.clone(), cut(value, MAX_REQUEST_ID))),
                "port" => Some((name.clone(), cut(value, MAX_PORT_VALUE))),
                _ => None,
            })
            .collect(),
    )
}

#[derive(Default)]
struct Pair {
    data: Option<Stream>,
    error: Option<Stream>,
    timer: Option<delay_queue::Key>,
}

impl Pair {
    fn streams(&self) -> impl Iterator<Item = &Stream> {
        [&self.data, &self.error].into_iter().flatten()
    }
}

/// The connections of one port-forward session still waiting for their second stream.
pub struct Pairing {
    pending: HashMap<String, Pair>,
    timers: DelayQueue<String>,
    limit: usize,
    timeout: Duration,
}

impl Pairing {
    /// At most `limit` connections wait, each at most `timeout`.
    pub fn new(limit: usize, timeout: Duration) -> Self {
        Self {
            pending: HashMap::new(),
            timers: DelayQueue::new(),
            limit: limit.max(1),
            timeout,
        }
    }

    /// Connections waiting for their second stream.
    pub fn waiting(&self) -> usize {
        self.pending.len()
    }

    /// Files `stream` with its connection: both streams of it, once the second arrives. A
    /// stream that breaks the rules above is reset (and logged, its values escaped: they are
    /// the peer's).
    pub fn place(&mut self, session: &Session, mut stream: Stream) -> Option<(Stream, Stream)> {
        let kind = stream.stream_type();
        if !matches!(kind, Some("data" | "error")) {
            tracing::warn!(stream = stream.id, streamtype = ?kind, "port-forward: a stream that is neither data nor error; resetting it");
            session.reset(stream.id, rst::PROTOCOL_ERROR);
            return None;
        }
        let is_data = kind == Some("data");
        let id = request_id(&stream);
        if id.len() > MAX_REQUEST_ID {
            tracing::warn!(
                stream = stream.id,
                length = id.len(),
                "port-forward: a request id longer than {MAX_REQUEST_ID} bytes; resetting the stream"
            );
            session.reset(stream.id, rst::PROTOCOL_ERROR);
            return None;
        }
        stream.headers = kept_headers(&stream.headers);
        if !self.pending.contains_key(&id) && self.pending.len() >= self.limit {
            tracing::warn!(stream = stream.id, requestid = ?id, limit = self.limit, "port-forward: as many connections as the session may hold wait for their second stream; refusing one more");
            session.reset(stream.id, rst::REFUSED_STREAM);
            return None;
        }
        let pair = self.pending.entry(id.clone()).or_default();
        let slot = if is_data { &mut pair.data } else { &mut pair.error };
        if slot.is_some() {
            tracing::warn!(stream = stream.id, requestid = ?id, "port-forward: a second stream of the same type for one connection; resetting it");
            session.reset(stream.id, rst::PROTOCOL_ERROR);
            return None;
        }
        *slot = Some(stream);
        if pair.data.is_some() && pair.error.is_some() {
            let pair = self.pending.remove(&id)?;
            if let Some(key) = &pair.timer {
                self.timers.remove(key);
            }
            return Some((pair.data?, pair.error?));
        }
        if pair.timer.is_none() {
            pair.timer = Some(self.timers.insert(id, self.timeout));
        }
        None
    }

    /// Waits for the next connection whose time is up (forever while none waits), then resets
    /// its streams.
    pub async fn expire_next(&mut self, session: &Session) {
        let expired = std::future::poll_fn(|cx| match self.timers.poll_expired(cx) {
            // An empty queue is ready with None: wait for the next insert instead (the caller
            // polls again after every stream).
            std::task::Poll::Ready(None) => std::task::Poll::Pending,
            other => other,
        })
        .await;
        let Some(expired) = expired else { return };
        let id = expired.into_inner();
        if let Some(pair) = self.pending.remove(&id) {
            tracing::warn!(requestid = ?id, "port-forward: the client did not open both streams of a connection in time; resetting it");
            for s in pair.streams() {
                session.reset(s.id, rst::CANCEL);
            }
        }
    }
}
