//! The server side of one SPDY/3.1 session over an upgraded connection.
//!
//! Two tasks own the connection: the reader decodes frames, inflates header blocks, answers
//! PING, applies SETTINGS and WINDOW_UPDATE, accepts the peer's streams (replying SYN_REPLY at
//! once, as Go's spdystream server does) and routes DATA; the writer encodes and sends what the
//! streams and the reader queue — control frames first, then DATA in the order written.
//! A malformed frame or a header block that will not inflate ends the session with GOAWAY
//! (PROTOCOL_ERROR) and a reason [`Session::failure`] reports; a bad stream is reset alone.
//!
//! Back-pressure: each stream buffers at most [`STREAM_BUFFER`] pieces; a consumer that falls
//! behind stalls the reader (TCP then slows the peer), as spdystream's frame workers do.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::codec::frame::{SETTINGS_INITIAL_WINDOW_SIZE, encode, goaway, rst};
use super::codec::{Decoder, Deflater, Frame, HeaderBlock, Inflater, Limits};
use super::flow::{Enforcement, INITIAL_WINDOW, MAX_WINDOW, Window};
use super::stream::{Stream, StreamShared};
use crate::kubelet_api::streaming::supervise;

/// DATA pieces buffered per stream before the reader waits for its consumer.
pub const STREAM_BUFFER: usize = 16;
/// Queued control frames (PING answers, WINDOW_UPDATEs, resets, SYN_REPLYs) beyond which a peer
/// is taken to be flooding a session that cannot write: each of its frames may ask for one, and
/// a peer that stops reading would otherwise grow the queue without limit.
pub const MAX_QUEUED_CONTROL: usize = 4096;

/// After the session ends, how long the reader keeps draining the peer's bytes, waiting for its
/// EOF, before the connection is dropped. Closing a TCP socket with bytes unread makes the kernel
/// send a reset instead of a FIN, and a reset can discard what was written just before it (the
/// GOAWAY, a stream's last DATA, the error of a refused exec): a lingering close.
pub const LINGER: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub limits: Limits,
    /// The most bytes one header block may inflate to.
    pub max_header_len: usize,
    /// No frame either way for this long ends the session (the kubelet's
    /// `streamingConnectionIdleTimeout`, 4 h by default).
    pub idle_timeout: Duration,
    /// Streams open at once; more are refused (RST_STREAM REFUSED_STREAM).
    pub max_streams: usize,
    /// Counts a panic of the session's tasks (which then ends the session).
    pub panics: Option<prometheus::IntCounter>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            max_header_len: 64 * 1024,
            idle_timeout: Duration::from_secs(4 * 3600),
            max_streams: 1000,
            panics: None,
        }
    }
}

/// What the writer sends.
pub(super) enum Out {
    Frame(Frame),
    /// SYN_REPLY with no headers (compressed by the writer, which owns the deflater).
    Reply {
        stream_id: u32,
    },
    /// GOAWAY with this status, then close the connection.
    Shutdown {
        status: u32,
    },
}

struct Entry {
    /// `None` once the peer's FIN came.
    data: Option<mpsc::Sender<Bytes>>,
    stream: Arc<StreamShared>,
    local_fin: bool,
}

/// What the tasks, the streams and the handle share.
pub(super) struct Shared {
    ctl: mpsc::UnboundedSender<Out>,
    data: mpsc::Sender<Out>,
    queued_control: AtomicUsize,
    pub enforcement: Enforcement,
    pub send_window: Window,
    initial_window: AtomicI64,
    streams: Mutex<HashMap<u32, Entry>>,
    last_peer_stream: AtomicU64,
    closed: CancellationToken,
    going_away: AtomicBool,
    failure: Mutex<Option<String>>,
    started: Instant,
    last_activity_ms: AtomicU64,
}

impl Shared {
    pub fn data_sender(&self) -> mpsc::Sender<Out> {
        self.data.clone()
    }

    /// Queues a control frame ahead of DATA.
    pub fn control(&self, frame: Frame) {
        self.queue_control(Out::Frame(frame));
    }

    /// Queues `out` on the control queue, unless [`MAX_QUEUED_CONTROL`] are already waiting:
    /// then the peer sends while it reads nothing, and the session ends. A GOAWAY could not
    /// reach such a peer (it would queue behind the frames it does not read), so the
    /// connection is closed (FIN) with the reason kept as the session's failure.
    fn queue_control(&self, out: Out) {
        let queued = self.queued_control.fetch_add(1, Ordering::Relaxed) + 1;
        if queued > MAX_QUEUED_CONTROL {
            self.queued_control.fetch_sub(1, Ordering::Relaxed);
            if !self.is_closed() {
                tracing::warn!(
                    limit = MAX_QUEUED_CONTROL,
                    "SPDY session: the peer keeps sending frames that need an answer while it reads none (a flood); closing the session"
                );
                self.fail(format!(
                    "control frame flood: {MAX_QUEUED_CONTROL} answers queued while the peer reads nothing"
                ));
                self.close();
            }
            return;
        }
        let _ = self.ctl.send(out);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    pub fn failure(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn fail(&self, reason: String) {
        let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            *f = Some(reason);
        }
    }

    fn streams(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Entry>> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn touch(&self) {
        self.last_activity_ms
            .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Ends the session: every stream sees it (reads end, writes fail), waiters wake.
    fn close(&self) {
        self.closed.cancel();
        let mut streams = self.streams();
        for (_, e) in streams.drain() {
            e.stream.reset.store(true, Ordering::Release);
            e.stream.send_window.wake_all();
        }
        self.send_window.wake_all();
    }

    fn reset(&self, stream_id: u32, status: u32) {
        if let Some(e) = self.streams().remove(&stream_id) {
            e.stream.reset.store(true, Ordering::Release);
            e.stream.send_window.wake_all();
        }
        self.control(Frame::RstStream { stream_id, status });
    }

    fn local_fin(&self, stream_id: u32) {
        let mut streams = self.streams();
        if let Some(e) = streams.get_mut(&stream_id) {
            e.local_fin = true;
            if e.data.is_none() {
                streams.remove(&stream_id);
            }
        }
    }
}

/// The handle of a running session.
#[derive(Clone)]
pub struct Session {
    shared: Arc<Shared>,
}

impl Session {
    /// Resolves when the connection is over (either side ended it, or it idled out).
    pub async fn closed(&self) {
        self.shared.closed.cancelled().await
    }

    pub fn is_closed(&self) -> bool {
        self.shared.is_closed()
    }

    /// A token cancelled when the connection is over.
    pub fn token(&self) -> CancellationToken {
        self.shared.closed.clone()
    }

    /// Why the session ended abnormally (a protocol error, a read error, the idle timeout).
    pub fn failure(&self) -> Option<String> {
        self.shared.failure()
    }

    /// Control frames queued and not yet written.
    #[cfg(test)]
    pub(super) fn queued_control(&self) -> usize {
        self.shared.queued_control.load(Ordering::Relaxed)
    }

    /// Resets one stream (RST_STREAM `status`).
    pub fn reset(&self, stream_id: u32, status: u32) {
        self.shared.reset(stream_id, status);
    }

    /// Sends everything queued so far, then GOAWAY, and closes the connection (waits at
    /// most `within`).
    pub async fn shutdown(&self, within: Duration) {
        self.shared.going_away.store(true, Ordering::Release);
        let queued = tokio::select! {
            r = self.shared.data.send(Out::Shutdown { status: goaway::OK }) => r.is_ok(),
            _ = self.shared.closed.cancelled() => false,
        };
        if queued && tokio::time::timeout(within, self.closed()).await.is_err() {
            tracing::debug!("SPDY session: the peer did not take the last frames in time; closing");
        }
        self.shared.close();
    }
}

/// Serves one session on `io`; the peer's streams arrive on the receiver.
pub fn serve<IO>(io: IO, config: SessionConfig) -> (Session, mpsc::Receiver<Stream>)
where
    IO: AsyncRead + AsyncWrite + Send + 'static,
{
    let (ctl_tx, ctl_rx) = mpsc::unbounded_channel();
    let (data_tx, data_rx) = mpsc::channel(64);
    let (incoming_tx, incoming_rx) = mpsc::channel(16);
    let shared = Arc::new(Shared {
        ctl: ctl_tx,
        data: data_tx,
        queued_control: AtomicUsize::new(0),
        enforcement: Enforcement::default(),
        send_window: Window::new(INITIAL_WINDOW),
        initial_window: AtomicI64::new(INITIAL_WINDOW),
        streams: Mutex::new(HashMap::new()),
        last_peer_stream: AtomicU64::new(0),
        closed: CancellationToken::new(),
        going_away: AtomicBool::new(false),
        failure: Mutex::new(None),
        started: Instant::now(),
        last_activity_ms: AtomicU64::new(0),
    });
    let (read, write) = tokio::io::split(io);
    let ender = |shared: &Arc<Shared>, what: &'static str| {
        let shared = shared.clone();
        move || {
            shared.fail(format!("internal error: the session's {what} panicked"));
            shared.close();
        }
    };
    supervise::spawn(
        "SPDY writer",
        config.panics.clone(),
        write_loop(write, ctl_rx, data_rx, shared.clone()),
        ender(&shared, "writer"),
    );
    supervise::spawn(
        "SPDY reader",
        config.panics.clone(),
        read_loop(read, incoming_tx, shared.clone(), config.clone()),
        ender(&shared, "reader"),
    );
    tokio::spawn(idle_watch(shared.clone(), config.idle_timeout));
    (Session { shared }, incoming_rx)
}

async fn idle_watch(shared: Arc<Shared>, timeout: Duration) {
    loop {
        let last = Duration::from_millis(shared.last_activity_ms.load(Ordering::Relaxed));
        let idle = shared.started.elapsed().saturating_sub(last);
        if idle >= timeout {
            tracing::info!(?timeout, "SPDY session idle; closing it");
            shared.fail(format!("no frame for {timeout:?} (the stream idle timeout)"));
            shared.close();
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(timeout - idle) => {}
            _ = shared.closed.cancelled() => return,
        }
    }
}

async fn write_loop<W>(
    mut io: W,
    mut ctl: mpsc::UnboundedReceiver<Out>,
    mut data: mpsc::Receiver<Out>,
    shared: Arc<Shared>,
) where
    W: AsyncWrite + Unpin,
{
    let mut deflater = Deflater::new();
    let mut buf = BytesMut::with_capacity(128 * 1024);
    'session: loop {
        let first = tokio::select! {
            biased;
            Some(o) = ctl.recv() => o,
            Some(o) = data.recv() => o,
            _ = shared.closed.cancelled() => break,
            else => break,
        };
        let mut next = Some(first);
        let mut shutdown = false;
        while let Some(item) = next.take() {
            match item {
                Out::Frame(frame) => {
                    if let Frame::Data {
                        stream_id, fin: true, ..
                    } = &frame
                    {
                        shared.local_fin(*stream_id);
                    }
                    if !matches!(frame, Frame::Data { .. }) {
                        shared.queued_control.fetch_sub(1, Ordering::Relaxed);
                    }
                    if let Err(e) = encode(&frame, &mut buf) {
                        tracing::warn!(error = %e, "SPDY session: dropping a frame it cannot encode");
                    }
                }
                Out::Reply { stream_id } => {
                    shared.queued_control.fetch_sub(1, Ordering::Relaxed);
                    let headers = deflater.deflate(&HeaderBlock::default());
                    let reply = Frame::SynReply {
                        stream_id,
                        fin: false,
                        headers,
                    };
                    let _ = encode(&reply, &mut buf);
                }
                Out::Shutdown { status } => {
                    let last_good_stream_id = shared.last_peer_stream.load(Ordering::Acquire) as u32;
                    let _ = encode(
                        &Frame::GoAway {
                            last_good_stream_id,
                            status,
                        },
                        &mut buf,
                    );
                    shutdown = true;
                    break;
                }
            }
            if buf.len() < 256 * 1024 {
                next = ctl.try_recv().ok().or_else(|| data.try_recv().ok());
            }
        }
        let written = tokio::select! {
            r = async {
                io.write_all(&buf).await?;
                io.flush().await
            } => r,
            _ = shared.closed.cancelled() => break 'session,
        };
        buf.clear();
        if let Err(e) = written {
            shared.fail(format!("writing to the peer: {e}"));
            break;
        }
        shared.touch();
        if shutdown {
            break;
        }
    }
    shared.close();
    // Whatever ended the session, tell the peer (FIN; TLS close_notify first) while the reader
    // drains its side: the connection is dropped when both are done.
    let _ = tokio::time::timeout(LINGER, io.shutdown()).await;
}

/// A reason to end the whole session.
struct Fatal(String);

/// How the reader stopped.
enum ReadEnd {
    /// The peer's EOF, or a read error: nothing more will come.
    PeerDone,
    /// The session was closed from this side (GOAWAY sent, idle timeout, a write error).
    Closed,
    /// A malformed frame: GOAWAY (PROTOCOL_ERROR), then close.
    Fatal(String),
}

async fn read_loop<R>(mut io: R, incoming: mpsc::Sender<Stream>, shared: Arc<Shared>, config: SessionConfig)
where
    R: AsyncRead + Unpin,
{
    let mut decoder = Decoder::new(config.limits);
    let mut inflater = Inflater::new(config.max_header_len);
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let end = 'session: loop {
        loop {
            match decoder.decode(&mut buf) {
                Ok(None) => break,
                Ok(Some(frame)) => {
                    if let Err(Fatal(reason)) = on_frame(frame, &mut inflater, &incoming, &shared, &config).await {
                        break 'session ReadEnd::Fatal(reason);
                    }
                }
                Err(e) => break 'session ReadEnd::Fatal(e.to_string()),
            }
        }
        if shared.is_closed() {
            break ReadEnd::Closed;
        }
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        let read = tokio::select! {
            r = io.read_buf(&mut buf) => r,
            _ = shared.closed.cancelled() => break ReadEnd::Closed,
        };
        match read {
            Ok(0) => break ReadEnd::PeerDone,
            Ok(_) => shared.touch(),
            Err(e) => {
                shared.fail(format!("reading from the peer: {e}"));
                break ReadEnd::PeerDone;
            }
        }
    };
    match end {
        ReadEnd::PeerDone => {
            shared.close();
            return;
        }
        ReadEnd::Closed => {}
        ReadEnd::Fatal(reason) => {
            tracing::warn!(%reason, "SPDY session: protocol error from the peer; sending GOAWAY and closing");
            shared.fail(format!("protocol error: {reason}"));
            let _ = shared.ctl.send(Out::Shutdown {
                status: goaway::PROTOCOL_ERROR,
            });
        }
    }
    drop(incoming);
    drain_until_eof(&mut io, buf).await;
    // A writer still blocked on a peer that reads nothing (after a protocol error, say) is
    // released: nothing more is read, so the session is over.
    shared.close();
}

/// Reads and drops the peer's bytes until its EOF, a read error or [`LINGER`].
async fn drain_until_eof<R: AsyncRead + Unpin>(io: &mut R, mut buf: BytesMut) {
    let drained = tokio::time::timeout(LINGER, async {
        loop {
            buf.clear();
            buf.reserve(16 * 1024);
            match io.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::debug!(linger = ?LINGER, "SPDY session: the peer did not close in time; dropping the connection");
    }
}

async fn on_frame(
    frame: Frame,
    inflater: &mut Inflater,
    incoming: &mpsc::Sender<Stream>,
    shared: &Arc<Shared>,
    config: &SessionConfig,
) -> Result<(), Fatal> {
    match frame {
        Frame::SynStream {
            stream_id,
            fin,
            headers,
            ..
        } => {
            // Inflate first, always: the zlib stream spans the session.
            let block = match inflater.inflate(&headers) {
                Ok(b) => b,
                Err(e) if e.is_stream_error() => {
                    tracing::warn!(stream_id, error = %e, "SPDY session: refusing a stream");
                    shared.reset(stream_id, rst::PROTOCOL_ERROR);
                    return Ok(());
                }
                Err(e) => return Err(Fatal(e.to_string())),
            };
            accept(stream_id, fin, block, incoming, shared, config).await;
        }
        Frame::SynReply { headers, .. } | Frame::Headers { headers, .. } => {
            // This side opens no streams and ignores trailing headers; the block still
            // advances the zlib stream.
            if let Err(e) = inflater.inflate(&headers)
                && !e.is_stream_error()
            {
                return Err(Fatal(e.to_string()));
            }
        }
        Frame::RstStream { stream_id, status } => {
            tracing::debug!(stream_id, status, "SPDY session: the peer reset a stream");
            if let Some(e) = shared.streams().remove(&stream_id) {
                e.stream.reset.store(true, Ordering::Release);
                e.stream.send_window.wake_all();
            }
        }
        Frame::Settings { entries, .. } => {
            for s in entries.iter().filter(|s| s.id == SETTINGS_INITIAL_WINDOW_SIZE) {
                let value = i64::from(s.value);
                if value > MAX_WINDOW {
                    return Err(Fatal(format!("an initial window of {value} bytes (at most 2^31-1)")));
                }
                let delta = value - shared.initial_window.swap(value, Ordering::AcqRel);
                shared.enforcement.enable();
                for e in shared.streams().values() {
                    let _ = e.stream.send_window.grow(delta);
                }
            }
        }
        Frame::Ping { id } => {
            // Odd ids are the client's: echo them. Even ones would answer pings this side
            // never sends.
            if id % 2 == 1 {
                shared.control(Frame::Ping { id });
            }
        }
        Frame::GoAway { .. } => {
            shared.going_away.store(true, Ordering::Release);
        }
        Frame::WindowUpdate { stream_id, delta } => {
            shared.enforcement.enable();
            if stream_id == 0 {
                shared
                    .send_window
                    .grow(i64::from(delta))
                    .map_err(|e| Fatal(e.to_string()))?;
            } else {
                let overflow = shared
                    .streams()
                    .get(&stream_id)
                    .is_some_and(|e| e.stream.send_window.grow(i64::from(delta)).is_err());
                if overflow {
                    shared.reset(stream_id, rst::FLOW_CONTROL_ERROR);
                }
            }
        }
        Frame::Data { stream_id, fin, data } => {
            let sender = {
                let streams = shared.streams();
                match streams.get(&stream_id) {
                    None => None,
                    Some(Entry { data: None, .. }) => {
                        drop(streams);
                        shared.reset(stream_id, rst::STREAM_ALREADY_CLOSED);
                        return Ok(());
                    }
                    Some(Entry { data: Some(tx), .. }) => Some(tx.clone()),
                }
            };
            let delivered = match (&sender, data.is_empty()) {
                (Some(tx), false) => tokio::select! {
                    r = tx.send(data.clone()) => r.is_ok(),
                    _ = shared.closed.cancelled() => return Ok(()),
                },
                _ => data.is_empty(),
            };
            if !delivered && !data.is_empty() {
                // Nobody reads this stream (reset, or its reader is gone): give the session
                // window back so the peer's other streams keep flowing.
                shared.control(Frame::WindowUpdate {
                    stream_id: 0,
                    delta: data.len() as u32,
                });
            }
            if fin {
                let mut streams = shared.streams();
                if let Some(e) = streams.get_mut(&stream_id) {
                    e.data = None;
                    if e.local_fin {
                        streams.remove(&stream_id);
                    }
                }
            }
        }
        Frame::Unknown { frame_type, .. } => {
            tracing::debug!(frame_type, "SPDY session: ignoring a control frame of an unknown type");
        }
    }
    Ok(())
}

async fn accept(
    stream_id: u32,
    fin: bool,
    headers: HeaderBlock,
    incoming: &mpsc::Sender<Stream>,
    shared: &Arc<Shared>,
    config: &SessionConfig,
) {
    let last = shared.last_peer_stream.load(Ordering::Acquire) as u32;
    if stream_id.is_multiple_of(2) || stream_id <= last {
        tracing::warn!(
            stream_id,
            last,
            "SPDY session: a stream id that is even or not increasing; resetting it"
        );
        shared.reset(stream_id, rst::PROTOCOL_ERROR);
        return;
    }
    shared.last_peer_stream.store(u64::from(stream_id), Ordering::Release);
    if shared.going_away.load(Ordering::Acquire) {
        shared.reset(stream_id, rst::REFUSED_STREAM);
        return;
    }
    if shared.streams().len() >= config.max_streams {
        tracing::warn!(
            stream_id,
            max = config.max_streams,
            "SPDY session: too many open streams; refusing one"
        );
        shared.reset(stream_id, rst::REFUSED_STREAM);
        return;
    }
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let stream = Arc::new(StreamShared {
        id: stream_id,
        send_window: Window::new(shared.initial_window.load(Ordering::Acquire)),
        reset: AtomicBool::new(false),
    });
    shared.streams().insert(
        stream_id,
        Entry {
            data: (!fin).then_some(tx),
            stream: stream.clone(),
            local_fin: false,
        },
    );
    shared.queue_control(Out::Reply { stream_id });
    let stream = Stream::new(stream_id, headers, rx, stream, shared.clone());
    let taken = tokio::select! {
        r = incoming.send(stream) => r.is_ok(),
        _ = shared.closed.cancelled() => return,
    };
    if !taken {
        shared.reset(stream_id, rst::REFUSED_STREAM);
    }
}
