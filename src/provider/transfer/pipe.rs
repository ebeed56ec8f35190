//! A bounded in-memory byte pipe from a writer (the registry streaming an import tar) to a reader
//! (`cocoon snapshot import`'s stdin). Unlike a plain duplex, the reader reaches EOF only after the
//! writer [`PipeWriter::finish`]ed: a writer that failed or was dropped mid-stream makes the reader
//! fail, so cocoon never registers a stream that was cut short at an entry boundary (a tar without its
//! end marker reads as a complete, shorter archive).

use bytes::{Buf, Bytes, BytesMut};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;

/// Bytes are handed over in chunks of this size: few enough wake-ups, little memory.
const CHUNK: usize = 256 << 10;

enum Frame {
    Data(Bytes),
    End,
    Failed(String),
}

/// A pipe holding at most about `budget` bytes in flight.
pub fn pipe(budget: usize) -> (PipeWriter, PipeReader) {
    let (tx, rx) = mpsc::channel(budget.div_ceil(CHUNK).max(2));
    (
        PipeWriter {
            tx: PollSender::new(tx),
            buf: BytesMut::with_capacity(CHUNK),
        },
        PipeReader {
            rx,
            cur: Bytes::new(),
            done: false,
        },
    )
}

pub struct PipeWriter {
    tx: PollSender<Frame>,
    buf: BytesMut,
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the reading side stopped")
}

impl PipeWriter {
    fn poll_send(&mut self, cx: &mut Context<'_>, frame: impl FnOnce(&mut BytesMut) -> Frame) -> Poll<io::Result<()>> {
        ready!(self.tx.poll_reserve(cx)).map_err(|_| closed())?;
        let f = frame(&mut self.buf);
        self.tx.send_item(f).map_err(|_| closed())?;
        Poll::Ready(Ok(()))
    }

    fn poll_send_buf(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.buf.is_empty() {
            return Poll::Ready(Ok(()));
        }
        ready!(self.poll_send(cx, |b| {
            let data = b.split().freeze();
            b.reserve(CHUNK);
            Frame::Data(data)
        }))?;
        Poll::Ready(Ok(()))
    }

    /// Flushes and ends the stream: the reader sees EOF after the last byte.
    pub async fn finish(mut self) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_send_buf(cx)).await?;
        std::future::poll_fn(|cx| self.poll_send(cx, |_| Frame::End)).await
    }

    /// Ends the stream with an error the reader returns (after the bytes already handed over).
    pub async fn fail(mut self, why: String) {
        self.buf.clear();
        let _ = std::future::poll_fn(|cx| self.poll_send(cx, |_| Frame::Failed(why.clone()))).await;
    }
}

impl AsyncWrite for PipeWriter {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.buf.len() >= CHUNK {
            ready!(this.poll_send_buf(cx))?;
        }
        let n = data.len().min(CHUNK - this.buf.len());
        this.buf.extend_from_slice(&data[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_send_buf(cx)
    }

    /// Flushes only: the end of the stream is [`PipeWriter::finish`], which says it is complete.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_send_buf(cx)
    }
}

pub struct PipeReader {
    rx: mpsc::Receiver<Frame>,
    cur: Bytes,
    done: bool,
}

impl AsyncRead for PipeReader {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, out: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.cur.is_empty() {
                let n = this.cur.len().min(out.remaining());
                out.put_slice(&this.cur[..n]);
                this.cur.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.done {
                return Poll::Ready(Ok(()));
            }
            match ready!(this.rx.poll_recv(cx)) {
                Some(Frame::Data(b)) => this.cur = b,
                Some(Frame::End) => this.done = true,
                Some(Frame::Failed(why)) => return Poll::Ready(Err(io::Error::other(why))),
                None => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the stream was cut off before its end",
                    )));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_arrive_in_order_and_end_only_when_finished() {
        let (mut w, mut r) = pipe(1 << 20);
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let expected = data.clone();
        let writer = async move {
            for part in data.chunks(70_001) {
                w.write_all(part).await.unwrap();
            }
            w.finish().await.unwrap();
        };
        let reader = async {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            got
        };
        let ((), got) = tokio::join!(writer, reader);
        assert!(got == expected);
    }

    #[tokio::test]
    async fn a_failed_or_dropped_writer_fails_the_reader() {
        let (mut w, mut r) = pipe(1 << 20);
        w.write_all(b"partial").await.unwrap();
        w.flush().await.unwrap();
        w.fail("blob sha256:x is corrupt".into()).await;
        let mut got = Vec::new();
        let e = r.read_to_end(&mut got).await.unwrap_err();
        assert_eq!(
            (got.as_slice(), e.to_string().as_str()),
            (&b"partial"[..], "blob sha256:x is corrupt")
        );

        let (mut w, mut r) = pipe(1 << 20);
        w.write_all(b"cut").await.unwrap();
        w.shutdown().await.unwrap();
        drop(w);
        let e = r.read_to_end(&mut Vec::new()).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[tokio::test]
    async fn a_reader_that_stops_breaks_the_writer() {
        let (mut w, r) = pipe(CHUNK);
        drop(r);
        let e = w.write_all(&vec![0u8; 4 * CHUNK]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }
}
