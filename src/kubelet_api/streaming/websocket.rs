//! The WebSocket transports (what the apiserver forwards from kubectl once the node declares
//! `ExtendWebSocketsToKubelet`, and what a client reaching the port directly may use):
//!
//! * [`Channels`]: the Kubernetes channel protocols for exec and attach. Every binary message
//!   starts with its channel (0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize);
//!   `v5.channel.k8s.io` adds the close signal `[255, channel]` (the client has no more to send
//!   on that channel: stdin's EOF), which `v4.channel.k8s.io` lacks.
//! * [`Tunnel`]: `SPDY/3.1+portforward.k8s.io`, a SPDY byte stream carried in binary messages
//!   (kubectl's port-forward over WebSockets); the SPDY session runs on top of it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use bytes::{BufMut, Bytes, BytesMut};
use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, PollSender};

use super::supervise;

pub const V5: &str = "v5.channel.k8s.io";
pub const V4: &str = "v4.channel.k8s.io";
pub const SPDY_TUNNEL: &str = "SPDY/3.1+portforward.k8s.io";

pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const ERROR: u8 = 3;
pub const RESIZE: u8 = 4;
/// v5: `[CLOSE, channel]` says the client closed `channel`.
const CLOSE: u8 = 255;

/// The largest message this side sends (a channel byte plus this much data).
const MAX_MESSAGE_DATA: usize = 64 * 1024;

/// Pieces of stdin queued for a command that has not read them yet; with pieces of at most
/// [`STDIN_PIECE`] bytes, at most 1 MiB waits per session (plus the one message being split).
/// A client sending stdin faster than the command reads it is then held back by TCP.
const STDIN_QUEUE: usize = 16;
/// The most bytes of one queued stdin piece: a larger message (a client may send up to the
/// message limit at once) is queued as copies of this size, so the queue holds what it counts.
const STDIN_PIECE: usize = 64 * 1024;

enum WsOut {
    Data(u8, Bytes),
    Close,
}

/// Last traffic either way, for the idle timeout.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        })
    }

    fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        self.start
            .elapsed()
            .saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

async fn idle_watch(activity: Arc<Activity>, timeout: Duration, closed: CancellationToken) {
    loop {
        let idle = activity.idle();
        if idle >= timeout {
            tracing::info!(?timeout, "WebSocket stream idle; closing it");
            closed.cancel();
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(timeout - idle) => {}
            _ = closed.cancelled() => return,
        }
    }
}

/// One exec or attach connection in a channel protocol.
pub struct Channels {
    /// What the client sends on channel 0 (`None` unless stdin was asked for).
    pub stdin: Option<ChannelReader>,
    out: mpsc::Sender<WsOut>,
    /// Cancelled when the client is gone (closed, broke off, or idled out).
    pub closed: CancellationToken,
    writer: tokio::task::JoinHandle<()>,
    reader: tokio::task::JoinHandle<()>,
}

impl Channels {
    /// Starts the reader and writer of `socket`, which negotiated `protocol` (v4 or v5); a
    /// panic in either ends the session and is counted on `panics`.
    pub fn start(
        socket: WebSocket,
        protocol: &str,
        want_stdin: bool,
        idle_timeout: Duration,
        panics: Option<prometheus::IntCounter>,
    ) -> Self {
        let v5 = protocol == V5;
        let (sink, stream) = socket.split();
        let (out_tx, out_rx) = mpsc::channel(64);
        let (stdin_tx, stdin_rx) = mpsc::channel(STDIN_QUEUE);
        let closed = CancellationToken::new();
        let activity = Activity::new();
        let ender = |closed: &CancellationToken| {
            let closed = closed.clone();
            move || closed.cancel()
        };
        let writer = supervise::spawn(
            "WebSocket writer",
            panics.clone(),
            write_channels(sink, out_rx, closed.clone(), activity.clone()),
            ender(&closed),
        );
        let reader = supervise::spawn(
            "WebSocket reader",
            panics,
            read_channels(
                stream,
                want_stdin.then_some(stdin_tx),
                v5,
                closed.clone(),
                activity.clone(),
            ),
            ender(&closed),
        );
        tokio::spawn(idle_watch(activity, idle_timeout, closed.clone()));
        Self {
            stdin: want_stdin.then(|| ChannelReader {
                data: stdin_rx,
                pending: Bytes::new(),
            }),
            out: out_tx,
            closed,
            writer,
            reader,
        }
    }

    /// A writer of `channel`.
    pub fn writer(&self, channel: u8) -> ChannelWriter {
        ChannelWriter {
            channel,
            out: PollSender::new(self.out.clone()),
        }
    }

    /// Sends what was queued, then a normal close, and reads on until the client answers the
    /// close; waits at most `within` for both.
    ///
    /// Dropping the socket with the client's messages still unread in it (a `kubectl exec -t`
    /// sends a terminal size first) makes the kernel reset the connection, and a reset can
    /// discard what was sent before it: the client saw an abnormal closure instead of the
    /// refusal on the error channel. Reading to the client's close first (RFC 6455 §7.1.1:
    /// the server closes TCP after the close handshake) leaves nothing unread.
    pub async fn close(self, within: Duration) {
        let Self {
            out,
            closed,
            writer,
            reader,
            ..
        } = self;
        let _ = out.send(WsOut::Close).await;
        drop(out);
        let handshake = async {
            let _ = writer.await;
            let _ = reader.await;
        };
        if tokio::time::timeout(within, handshake).await.is_err() {
            tracing::debug!("WebSocket: the client did not take the last messages or answer the close in time");
        }
        closed.cancel();
    }
}

async fn write_channels<S>(
    mut sink: S,
    mut out: mpsc::Receiver<WsOut>,
    closed: CancellationToken,
    activity: Arc<Activity>,
) where
    S: Sink<Message> + Unpin,
{
    loop {
        // Biased: what was queued before the client went away (a refusal, an exit status) is
        // still offered to it; a random pick could drop the last messages of a session.
        let item = tokio::select! {
            biased;
            item = out.recv() => item,
            _ = closed.cancelled() => None,
        };
        let message = match item {
            Some(WsOut::Data(channel, data)) => {
                let mut m = BytesMut::with_capacity(data.len() + 1);
                m.put_u8(channel);
                m.put_slice(&data);
                Message::Binary(m.freeze())
            }
            Some(WsOut::Close) => {
                let _ = sink
                    .send(Message::Close(Some(CloseFrame {
                        code: close_code::NORMAL,
                        reason: "".into(),
                    })))
                    .await;
                return;
            }
            None => return,
        };
        // Flush when nothing else is queued: output is live, bursts are batched.
        let sent = if out.is_empty() {
            sink.send(message).await
        } else {
            sink.feed(message).await
        };
        if sent.is_err() {
            closed.cancel();
            return;
        }
        activity.touch();
    }
}

async fn read_channels<S>(
    mut stream: S,
    mut stdin: Option<mpsc::Sender<Bytes>>,
    v5: bool,
    closed: CancellationToken,
    activity: Arc<Activity>,
) where
    S: Stream<Item = Result<Message, axum::Error>> + Unpin,
{
    loop {
        let message = tokio::select! {
            m = stream.next() => m,
            _ = closed.cancelled() => return,
        };
        activity.touch();
        let data = match message {
            Some(Ok(Message::Binary(data))) => data,
            Some(Ok(Message::Text(_))) => {
                tracing::debug!("WebSocket: ignoring a text message (the channel protocols are binary)");
                continue;
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
        };
        let Some((&channel, payload)) = data.split_first() else {
            continue;
        };
        match channel {
            STDIN => {
                if let Some(tx) = &stdin {
                    let chunk = data.slice(1..);
                    // A small message is queued as it is; a large one as copies of a piece
                    // each, so that what waits in the queue is bounded in bytes, not messages.
                    let whole = chunk.len() <= STDIN_PIECE;
                    for piece in chunk.chunks(STDIN_PIECE) {
                        let piece = if whole {
                            chunk.clone()
                        } else {
                            Bytes::copy_from_slice(piece)
                        };
                        tokio::select! {
                            r = tx.send(piece) => if r.is_err() { stdin = None; break },
                            _ = closed.cancelled() => return,
                        }
                    }
                }
            }
            CLOSE if v5 => {
                if payload.first() == Some(&STDIN) {
                    stdin = None; // the command sees EOF
                }
            }
            RESIZE => {}
            other => tracing::debug!(
                channel = other,
                "WebSocket: ignoring a message on a channel clients do not write"
            ),
        }
    }
    closed.cancel();
}

/// What the client writes on a channel, as tokio I/O (EOF at the close signal or the end).
pub struct ChannelReader {
    data: mpsc::Receiver<Bytes>,
    pending: Bytes,
}

impl AsyncRead for ChannelReader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.pending.is_empty() {
            match ready!(self.data.poll_recv(cx)) {
                Some(chunk) => self.pending = chunk,
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = self.pending.len().min(buf.remaining());
        let chunk = self.pending.split_to(n);
        buf.put_slice(&chunk);
        Poll::Ready(Ok(()))
    }
}

/// Writes one channel.
pub struct ChannelWriter {
    channel: u8,
    out: PollSender<WsOut>,
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the WebSocket client is gone")
}

impl AsyncWrite for ChannelWriter {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        if ready!(self.out.poll_reserve(cx)).is_err() {
            return Poll::Ready(Err(gone()));
        }
        let n = buf.len().min(MAX_MESSAGE_DATA);
        let item = WsOut::Data(self.channel, Bytes::copy_from_slice(&buf[..n]));
        if self.out.send_item(item).is_err() {
            return Poll::Ready(Err(gone()));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// The channel protocols have no per-channel close from the server: the connection's
    /// close ends every channel.
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl ChannelWriter {
    /// Sends an empty message on this channel (the kubelet's "streams are ready" signal).
    pub async fn announce(&mut self) -> io::Result<()> {
        let out = self.out.get_ref().ok_or_else(gone)?.clone();
        out.send(WsOut::Data(self.channel, Bytes::new()))
            .await
            .map_err(|_| gone())
    }
}

/// A byte stream over binary WebSocket messages (the SPDY tunnel of port-forward).
pub struct Tunnel {
    socket: WebSocket,
    pending: Bytes,
    eof: bool,
}

impl Tunnel {
    pub fn new(socket: WebSocket) -> Self {
        Self {
            socket,
            pending: Bytes::new(),
            eof: false,
        }
    }
}

fn ws_error(e: axum::Error) -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, format!("WebSocket: {e}"))
}

impl AsyncRead for Tunnel {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        while this.pending.is_empty() {
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            match ready!(Pin::new(&mut this.socket).poll_next(cx)) {
                Some(Ok(Message::Binary(data))) => this.pending = data,
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "a text message in the SPDY tunnel (it carries binary messages only)",
                    )));
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_))) | None => this.eof = true,
                Some(Err(e)) => return Poll::Ready(Err(ws_error(e))),
            }
        }
        let n = this.pending.len().min(buf.remaining());
        let chunk = this.pending.split_to(n);
        buf.put_slice(&chunk);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        ready!(Pin::new(&mut self.socket).poll_ready(cx)).map_err(ws_error)?;
        let n = buf.len().min(MAX_MESSAGE_DATA);
        Pin::new(&mut self.socket)
            .start_send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
            .map_err(ws_error)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_flush(cx).map_err(ws_error)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.socket).poll_close(cx).map_err(ws_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client sends stdin (in the largest messages allowed) to a command that never reads
    /// it: what the session holds for it stays small, whatever the message size.
    #[tokio::test]
    async fn unread_stdin_is_bounded_in_bytes() {
        const MESSAGE: usize = 4 << 20;
        let mut message = vec![STDIN];
        message.resize(MESSAGE + 1, b'x');
        let message = Bytes::from(message);
        let messages = futures::stream::iter((0..40).map(move |_| Ok(Message::Binary(message.clone()))))
            .chain(futures::stream::pending());
        let (tx, mut rx) = mpsc::channel(16);
        let closed = CancellationToken::new();
        let reader = tokio::spawn(read_channels(
            Box::pin(messages),
            Some(tx),
            true,
            closed.clone(),
            Activity::new(),
        ));
        // The reader stops taking messages once the stdin queue is full; nothing reads it.
        let deadline = Instant::now() + Duration::from_secs(30);
        while rx.len() < rx.max_capacity() {
            assert!(Instant::now() < deadline, "the stdin queue never fills");
            tokio::task::yield_now().await;
        }
        let mut queued = 0;
        while let Ok(chunk) = rx.try_recv() {
            queued += chunk.len();
        }
        closed.cancel();
        let _ = reader.await;
        assert!(queued <= 1 << 20, "{} MiB of unread stdin queued", queued >> 20);
    }
}
