//! One SPDY stream as tokio I/O: [`StreamReader`] yields what the peer sends (EOF at its FIN,
//! an error after its RST_STREAM), [`StreamWriter`] sends DATA (respecting the flow-control
//! windows once the peer uses them; shutdown sends FIN).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

use super::codec::{Frame, HeaderBlock};
use super::flow::{Credit, Window};
use super::session::{Out, Shared};

/// Largest DATA frame this side sends.
pub const MAX_DATA_FRAME: usize = 64 * 1024;

/// What a stream's two halves share with the session.
#[derive(Debug)]
pub(super) struct StreamShared {
    pub id: u32,
    pub send_window: Window,
    /// The peer reset the stream (or the session ended): reads and writes fail.
    pub reset: AtomicBool,
}

/// A stream the peer opened (the session already sent its SYN_REPLY).
pub struct Stream {
    pub id: u32,
    pub headers: HeaderBlock,
    pub reader: StreamReader,
    pub writer: StreamWriter,
}

impl Stream {
    pub(super) fn new(
        id: u32,
        headers: HeaderBlock,
        data: mpsc::Receiver<Bytes>,
        stream: Arc<StreamShared>,
        session: Arc<Shared>,
    ) -> Self {
        Self {
            id,
            headers,
            reader: StreamReader {
                data,
                pending: Bytes::new(),
                credit: Credit::default(),
                stream: stream.clone(),
                session: session.clone(),
            },
            writer: StreamWriter {
                out: PollSender::new(session.data_sender()),
                fin_sent: false,
                stream,
                session,
            },
        }
    }

    /// The `streamtype` header of the Kubernetes sub-protocols.
    pub fn stream_type(&self) -> Option<&str> {
        self.headers.get("streamtype")
    }
}

/// The peer-to-us half of a stream.
pub struct StreamReader {
    data: mpsc::Receiver<Bytes>,
    pending: Bytes,
    credit: Credit,
    stream: Arc<StreamShared>,
    session: Arc<Shared>,
}

impl AsyncRead for StreamReader {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pending.is_empty() {
            match ready!(this.data.poll_recv(cx)) {
                Some(chunk) => this.pending = chunk,
                None if this.stream.reset.load(Ordering::Acquire) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        format!("SPDY stream {} was reset", this.stream.id),
                    )));
                }
                None => return Poll::Ready(Ok(())),
            }
        }
        let n = this.pending.len().min(buf.remaining());
        buf.put_slice(&this.pending.split_to(n));
        if let Some(delta) = this.credit.consumed(n) {
            this.session.control(Frame::WindowUpdate {
                stream_id: this.stream.id,
                delta,
            });
            this.session.control(Frame::WindowUpdate { stream_id: 0, delta });
        }
        Poll::Ready(Ok(()))
    }
}

/// The us-to-peer half of a stream.
pub struct StreamWriter {
    out: PollSender<Out>,
    fin_sent: bool,
    stream: Arc<StreamShared>,
    session: Arc<Shared>,
}

impl StreamWriter {
    fn broken(&self) -> io::Error {
        let why = match self.session.failure() {
            Some(e) => format!("the SPDY session ended: {e}"),
            None if self.session.is_closed() => "the SPDY session ended".to_string(),
            None => format!("SPDY stream {} was reset by the peer", self.stream.id),
        };
        io::Error::new(io::ErrorKind::BrokenPipe, why)
    }

    fn check(&self) -> io::Result<()> {
        if self.fin_sent {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "write after FIN"));
        }
        if self.stream.reset.load(Ordering::Acquire) || self.session.is_closed() {
            return Err(self.broken());
        }
        Ok(())
    }
}

impl AsyncWrite for StreamWriter {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.check()?;
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let this = &mut *self;
        if ready!(this.out.poll_reserve(cx)).is_err() {
            return Poll::Ready(Err(this.broken()));
        }
        let mut n = buf.len().min(MAX_DATA_FRAME);
        if this.session.enforcement.enabled() {
            n = ready!(this.stream.send_window.poll_open(cx, n));
            n = ready!(this.session.send_window.poll_open(cx, n));
            // A session that ended while this writer waited wakes it to fail.
            this.check()?;
        }
        let frame = Frame::Data {
            stream_id: this.stream.id,
            fin: false,
            data: Bytes::copy_from_slice(&buf[..n]),
        };
        if this.out.send_item(Out::Frame(frame)).is_err() {
            return Poll::Ready(Err(this.broken()));
        }
        this.stream.send_window.consume(n);
        this.session.send_window.consume(n);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Frames go out in order as the session's writer drains its queue.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.fin_sent {
            return Poll::Ready(Ok(()));
        }
        if self.stream.reset.load(Ordering::Acquire) || self.session.is_closed() {
            return Poll::Ready(Err(self.broken()));
        }
        let this = &mut *self;
        if ready!(this.out.poll_reserve(cx)).is_err() {
            return Poll::Ready(Err(this.broken()));
        }
        let fin = Frame::Data {
            stream_id: this.stream.id,
            fin: true,
            data: Bytes::new(),
        };
        if this.out.send_item(Out::Frame(fin)).is_err() {
            return Poll::Ready(Err(this.broken()));
        }
        this.fin_sent = true;
        Poll::Ready(Ok(()))
    }
}
