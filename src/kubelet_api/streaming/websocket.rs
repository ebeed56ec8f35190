//! The WebSocket transports (what the apiserver forwards from kubectl once the node declares
//! `ExtendWebSocketsToKubelet`, and what a client reaching the port directly may use):
//!
//! * [`Channels`]: the Kubernetes channel protocols for exec and attach. Every binary message
//!   starts with its channel (0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize);
//!   `v5.channel.k8s.io` adds the close signal `[255, channel]` (the client has no more to send
//!   on that channel: stdin's EOF), which `v4.channel.k8s.io` lacks.
//! * [`Tunnel`]: `SPDY/3.1+portforward.k8s.io`, a SPDY byte stream carried in binary messages
//!   (kubectl's port-forward over WebSockets); the SPDY session runs on top of it.
//! * [`PortChannels`]: the kubelet's own port-forward protocol in channels (`v4.channel.k8s.io`,
//!   its base64 form `v4.base64.channel.k8s.io`, or no sub-protocol at all — what the Python,
//!   Java and JavaScript clients speak): the ports come with the request, port *i* has the data
//!   channel 2*i* and the error channel 2*i*+1, and each channel's first message is its port.

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
/// v4 with every message as text: the channel as an ASCII digit, then the data in base64.
pub const V4_BASE64: &str = "v4.base64.channel.k8s.io";
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

/// How a channel message is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// A binary message: the channel's number as a byte, then the data.
    Binary,
    /// A text message: the channel's number as an ASCII digit (`'0' + channel`), then the
    /// data in base64 (`v4.base64.channel.k8s.io`).
    Base64,
}

/// What one message from the client carries.
#[derive(Debug, PartialEq, Eq)]
enum Incoming {
    Data(u8, Bytes),
    /// Nothing for a channel (a ping, an empty message, one that does not decode).
    Nothing,
    /// The client closed the connection, or it broke.
    End,
}

impl Framing {
    fn encode(self, channel: u8, data: &[u8]) -> Message {
        match self {
            Framing::Binary => {
                let mut m = BytesMut::with_capacity(data.len() + 1);
                m.put_u8(channel);
                m.put_slice(data);
                Message::Binary(m.freeze())
            }
            Framing::Base64 => {
                use base64::Engine;
                let digit = char::from_u32(u32::from(b'0') + u32::from(channel)).unwrap_or('0');
                let mut text = String::with_capacity(data.len() * 4 / 3 + 5);
                text.push(digit);
                base64::engine::general_purpose::STANDARD.encode_string(data, &mut text);
                Message::Text(text.into())
            }
        }
    }

    fn decode(self, message: Option<Result<Message, axum::Error>>) -> Incoming {
        let bytes = match message {
            Some(Ok(Message::Binary(data))) => data,
            // The base64 form is text; the kubelet reads either kind of message the same way.
            Some(Ok(Message::Text(text))) if self == Framing::Base64 => Bytes::from(text.as_str().to_owned()),
            Some(Ok(Message::Text(_))) => {
                tracing::debug!("WebSocket: ignoring a text message (this channel protocol is binary)");
                return Incoming::Nothing;
            }
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => return Incoming::Nothing,
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => return Incoming::End,
        };
        let Some(&first) = bytes.first() else {
            return Incoming::Nothing;
        };
        match self {
            Framing::Binary => Incoming::Data(first, bytes.slice(1..)),
            Framing::Base64 => {
                use base64::Engine;
                match base64::engine::general_purpose::STANDARD.decode(&bytes[1..]) {
                    Ok(data) => Incoming::Data(first.wrapping_sub(b'0'), Bytes::from(data)),
                    Err(error) => {
                        tracing::debug!(%error, "WebSocket: ignoring a message that is not base64");
                        Incoming::Nothing
                    }
                }
            }
        }
    }
}

/// Queues what the client wrote on a channel for its reader: a small message as it is, a
/// large one as copies of [`STDIN_PIECE`] each, so that what waits in a queue is bounded in
/// bytes, not messages. `Err(())` when the reader is gone; returns early if `closed`.
async fn feed(tx: &mpsc::Sender<Bytes>, chunk: Bytes, closed: &CancellationToken) -> Result<(), ()> {
    let whole = chunk.len() <= STDIN_PIECE;
    for piece in chunk.chunks(STDIN_PIECE) {
        let piece = if whole {
            chunk.clone()
        } else {
            Bytes::copy_from_slice(piece)
        };
        tokio::select! {
            r = tx.send(piece) => r.map_err(|_| ())?,
            _ = closed.cancelled() => return Ok(()),
        }
    }
    Ok(())
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
            write_channels(sink, out_rx, Framing::Binary, closed.clone(), activity.clone()),
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
        close_link(out, closed, writer, reader, within).await;
    }
}

/// Sends what was queued on `out`, then a normal close, and waits (at most `within`) for the
/// writer to finish and the reader to see the client's answer (see [`Channels::close`]).
async fn close_link(
    out: mpsc::Sender<WsOut>,
    closed: CancellationToken,
    writer: tokio::task::JoinHandle<()>,
    reader: tokio::task::JoinHandle<()>,
    within: Duration,
) {
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

/// The streams of one forwarded port of a [`PortChannels`] connection.
pub struct PortStreams {
    pub port: u16,
    /// What the client sends to the port (ends when the connection does: the channel
    /// protocol has no half-close).
    pub from_client: ChannelReader,
    /// What goes back to the client from the port.
    pub to_client: ChannelWriter,
    /// Why forwarding failed, as text for the client.
    pub error: ChannelWriter,
}

/// One port-forward connection in the channel protocol: a data and an error channel per port
/// asked for, each announced by a first message holding its port (2 bytes, little-endian);
/// the client writes the data channels only.
pub struct PortChannels {
    pub ports: Vec<PortStreams>,
    /// Cancelled when the client is gone (closed, broke off, or idled out).
    pub closed: CancellationToken,
    out: mpsc::Sender<WsOut>,
    writer: tokio::task::JoinHandle<()>,
    reader: tokio::task::JoinHandle<()>,
}

impl PortChannels {
    /// Most ports one connection may forward: channels are numbered by a byte, two per port.
    pub const MAX_PORTS: usize = 128;

    /// Starts the reader and writer of `socket` for `ports` (at most [`Self::MAX_PORTS`]) and
    /// queues each channel's port message ahead of anything else; a panic in the reader or
    /// the writer ends the connection and is counted on `panics`.
    pub async fn start(
        socket: WebSocket,
        framing: Framing,
        ports: &[u16],
        idle_timeout: Duration,
        panics: Option<prometheus::IntCounter>,
    ) -> Self {
        let ports = &ports[..ports.len().min(Self::MAX_PORTS)];
        let (sink, stream) = socket.split();
        let (out_tx, out_rx) = mpsc::channel(64);
        let closed = CancellationToken::new();
        let activity = Activity::new();
        let mut inputs = Vec::with_capacity(ports.len() * 2);
        let mut readers = Vec::with_capacity(ports.len());
        for _ in ports {
            let (tx, rx) = mpsc::channel(STDIN_QUEUE);
            inputs.push(Some(tx));
            inputs.push(None); // the error channel: the client does not write it
            readers.push(ChannelReader {
                data: rx,
                pending: Bytes::new(),
            });
        }
        let ender = |closed: &CancellationToken| {
            let closed = closed.clone();
            move || closed.cancel()
        };
        let writer = supervise::spawn(
            "WebSocket writer",
            panics.clone(),
            write_channels(sink, out_rx, framing, closed.clone(), activity.clone()),
            ender(&closed),
        );
        let reader = supervise::spawn(
            "WebSocket reader",
            panics,
            read_ports(stream, inputs, framing, closed.clone(), activity.clone()),
            ender(&closed),
        );
        tokio::spawn(idle_watch(activity, idle_timeout, closed.clone()));
        for (i, port) in ports.iter().enumerate() {
            for channel in [2 * i, 2 * i + 1] {
                let first = Bytes::copy_from_slice(&port.to_le_bytes());
                if out_tx.send(WsOut::Data(channel as u8, first)).await.is_err() {
                    closed.cancel();
                }
            }
        }
        let writer_of = |channel: usize| ChannelWriter {
            channel: channel as u8,
            out: PollSender::new(out_tx.clone()),
        };
        let streams = ports
            .iter()
            .zip(readers)
            .enumerate()
            .map(|(i, (&port, from_client))| PortStreams {
                port,
                from_client,
                to_client: writer_of(2 * i),
                error: writer_of(2 * i + 1),
            })
            .collect();
        Self {
            ports: streams,
            closed,
            out: out_tx,
            writer,
            reader,
        }
    }

    /// Sends what was queued, then a normal close; waits at most `within` for the client's
    /// answer (see [`Channels::close`]).
    pub async fn close(self, within: Duration) {
        let Self {
            out,
            closed,
            writer,
            reader,
            ports,
        } = self;
        drop(ports);
        close_link(out, closed, writer, reader, within).await;
    }
}

/// Reads the client's messages into the readers of their channels (`inputs`, by channel
/// number; `None` for a channel the client does not write, whose messages are dropped as the
/// kubelet drops them).
async fn read_ports<S>(
    mut stream: S,
    mut inputs: Vec<Option<mpsc::Sender<Bytes>>>,
    framing: Framing,
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
        let (channel, data) = match framing.decode(message) {
            Incoming::Data(channel, data) => (channel, data),
            Incoming::Nothing => continue,
            Incoming::End => break,
        };
        let Some(Some(tx)) = inputs.get(usize::from(channel)) else {
            tracing::debug!(
                channel,
                "WebSocket port-forward: ignoring a message on a channel clients do not write"
            );
            continue;
        };
        if feed(tx, data, &closed).await.is_err() {
            // That port's forwarding is over; what the client still sends it goes nowhere.
            inputs[usize::from(channel)] = None;
        }
        if closed.is_cancelled() {
            return;
        }
    }
    closed.cancel();
}

async fn write_channels<S>(
    mut sink: S,
    mut out: mpsc::Receiver<WsOut>,
    framing: Framing,
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
            Some(WsOut::Data(channel, data)) => framing.encode(channel, &data),
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
                    if feed(tx, data.slice(1..), &closed).await.is_err() {
                        stdin = None;
                    }
                    if closed.is_cancelled() {
                        return;
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

    #[test]
    fn both_framings_carry_the_channel_and_the_data() {
        let data = b"\x00\xffport data";
        for framing in [Framing::Binary, Framing::Base64] {
            let message = framing.encode(3, data);
            assert_eq!(
                framing.decode(Some(Ok(message))),
                Incoming::Data(3, Bytes::from_static(data)),
                "{framing:?}"
            );
        }
        // What a base64 client sends: '0' then "hi" in base64, on channel 0.
        assert_eq!(
            Framing::Base64.decode(Some(Ok(Message::Text("0aGk=".into())))),
            Incoming::Data(0, Bytes::from_static(b"hi"))
        );
        assert_eq!(Framing::Base64.encode(1, b"hi"), Message::Text("1aGk=".into()));
        assert_eq!(
            Framing::Base64.decode(Some(Ok(Message::Text("0not base64!".into())))),
            Incoming::Nothing
        );
        assert_eq!(
            Framing::Binary.decode(Some(Ok(Message::Text("0aGk=".into())))),
            Incoming::Nothing,
            "text is not the binary protocol"
        );
        assert_eq!(
            Framing::Binary.decode(Some(Ok(Message::Binary(Bytes::new())))),
            Incoming::Nothing
        );
        assert_eq!(Framing::Binary.decode(None), Incoming::End);
    }

    /// Port-forward's reader: a data channel's messages reach its port, an error channel's
    /// and unknown channels' are dropped, and the end of the client ends the connection.
    #[tokio::test]
    async fn port_channels_reach_their_ports_only() {
        let frame = |channel: u8, data: &[u8]| {
            let mut m = vec![channel];
            m.extend_from_slice(data);
            Ok(Message::Binary(Bytes::from(m)))
        };
        let messages = futures::stream::iter(vec![
            frame(0, b"to port a"),
            frame(1, b"on a's error channel"),
            frame(2, b"to port b"),
            frame(9, b"nowhere"),
        ]);
        let (a_tx, mut a_rx) = mpsc::channel(16);
        let (b_tx, mut b_rx) = mpsc::channel(16);
        let closed = CancellationToken::new();
        read_ports(
            messages,
            vec![Some(a_tx), None, Some(b_tx), None],
            Framing::Binary,
            closed.clone(),
            Activity::new(),
        )
        .await;
        assert_eq!(a_rx.recv().await.unwrap(), Bytes::from_static(b"to port a"));
        assert_eq!(b_rx.recv().await.unwrap(), Bytes::from_static(b"to port b"));
        assert!(a_rx.recv().await.is_none() && b_rx.recv().await.is_none());
        assert!(closed.is_cancelled(), "the client's end ends the connection");
    }
}
