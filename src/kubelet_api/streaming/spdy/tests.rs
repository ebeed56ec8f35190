//! The session against a scripted peer over an in-memory pipe, or a loopback TCP connection where
//! the kernel's behaviour matters (the peer uses the same codec, with its own zlib contexts, as a
//! separate program would).

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};

use super::codec::frame::{encode, goaway, rst};
use super::codec::{Decoder, Deflater, Frame, HeaderBlock, Inflater, Limits};
use super::*;

struct Peer<IO = DuplexStream> {
    io: IO,
    decoder: Decoder,
    inflater: Inflater,
    deflater: Deflater,
    buf: BytesMut,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> Peer<IO> {
    fn new(io: IO) -> Self {
        Self {
            io,
            decoder: Decoder::new(Limits {
                max_data_piece: usize::MAX,
                ..Limits::default()
            }),
            inflater: Inflater::new(1 << 16),
            deflater: Deflater::new(),
            buf: BytesMut::new(),
        }
    }

    async fn send(&mut self, frame: Frame) {
        let mut out = BytesMut::new();
        encode(&frame, &mut out).unwrap();
        self.io.write_all(&out).await.unwrap();
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        self.io.write_all(bytes).await.unwrap();
    }

    async fn open(&mut self, stream_id: u32, pairs: &[(&str, &str)]) {
        let block = HeaderBlock(pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect());
        let headers = self.deflater.deflate(&block);
        self.send(Frame::SynStream {
            stream_id,
            associated_to: 0,
            priority: 0,
            slot: 0,
            fin: false,
            unidirectional: false,
            headers,
        })
        .await;
    }

    /// The next frame from the session (`None` at EOF); SYN_REPLY blocks are inflated
    /// (checked to be empty).
    async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(f) = self.decoder.decode(&mut self.buf).unwrap() {
                if let Frame::SynReply { headers, .. } = &f {
                    assert_eq!(self.inflater.inflate(headers).unwrap(), HeaderBlock::default());
                }
                return Some(f);
            }
            let n = tokio::time::timeout(Duration::from_secs(30), self.io.read_buf(&mut self.buf))
                .await
                .expect("the session answers")
                .unwrap();
            if n == 0 {
                return None;
            }
        }
    }

    /// Reads DATA of `stream_id` until `n` bytes came.
    async fn read_data(&mut self, stream_id: u32, n: usize) -> Vec<u8> {
        let mut got = Vec::new();
        while got.len() < n {
            match self.next().await {
                Some(Frame::Data {
                    stream_id: id, data, ..
                }) if id == stream_id => got.extend_from_slice(&data),
                Some(Frame::WindowUpdate { .. }) => {}
                other => panic!("expected DATA on {stream_id}, got {other:?}"),
            }
        }
        got
    }
}

fn pair(config: SessionConfig) -> (Peer, Session, tokio::sync::mpsc::Receiver<Stream>) {
    let (client, server) = tokio::io::duplex(1 << 20);
    let (session, incoming) = serve(server, config);
    (Peer::new(client), session, incoming)
}

async fn accept(incoming: &mut tokio::sync::mpsc::Receiver<Stream>) -> Stream {
    tokio::time::timeout(Duration::from_secs(30), incoming.recv())
        .await
        .expect("a stream arrives")
        .expect("the session is up")
}

#[tokio::test]
async fn streams_are_replied_and_carry_data_both_ways() {
    let (mut peer, _session, mut incoming) = pair(SessionConfig::default());
    peer.open(1, &[("streamtype", "stdin")]).await;
    let mut stream = accept(&mut incoming).await;
    assert_eq!((stream.id, stream.stream_type()), (1, Some("stdin")));
    assert!(matches!(peer.next().await, Some(Frame::SynReply { stream_id: 1, .. })));

    peer.send(Frame::Data {
        stream_id: 1,
        fin: false,
        data: Bytes::from_static(b"abc"),
    })
    .await;
    peer.send(Frame::Data {
        stream_id: 1,
        fin: true,
        data: Bytes::new(),
    })
    .await;
    let mut got = Vec::new();
    stream.reader.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, b"abc", "data, then EOF at the peer's FIN");

    stream.writer.write_all(b"xyz").await.unwrap();
    stream.writer.shutdown().await.unwrap();
    assert_eq!(
        peer.next().await,
        Some(Frame::Data {
            stream_id: 1,
            fin: false,
            data: Bytes::from_static(b"xyz")
        })
    );
    assert_eq!(
        peer.next().await,
        Some(Frame::Data {
            stream_id: 1,
            fin: true,
            data: Bytes::new()
        })
    );
    assert!(stream.writer.write_all(b"late").await.is_err(), "no DATA after FIN");
}

#[tokio::test]
async fn pings_are_echoed_and_unknown_frames_ignored() {
    let (mut peer, _session, _incoming) = pair(SessionConfig::default());
    peer.send_raw(b"\x80\x03\x00\x0a\x00\x00\x00\x03abc").await;
    peer.send(Frame::Ping { id: 1 }).await;
    peer.send(Frame::Ping { id: 2 }).await;
    peer.send(Frame::Ping { id: 3 }).await;
    assert_eq!(peer.next().await, Some(Frame::Ping { id: 1 }));
    assert_eq!(
        peer.next().await,
        Some(Frame::Ping { id: 3 }),
        "even ids are this side's own"
    );
}

#[tokio::test]
async fn a_peer_without_flow_control_is_not_held_back_one_with_it_is() {
    // Go's spdystream never sends WINDOW_UPDATE: 200 KiB go out past the 64 KiB window.
    let (mut peer, _session, mut incoming) = pair(SessionConfig::default());
    peer.open(1, &[("streamtype", "stdout")]).await;
    let mut stream = accept(&mut incoming).await;
    let body = vec![5u8; 200 * 1024];
    stream.writer.write_all(&body).await.unwrap();
    assert!(matches!(peer.next().await, Some(Frame::SynReply { .. })));
    assert_eq!(peer.read_data(1, body.len()).await, body);

    // A peer that sends WINDOW_UPDATE gets at most the window.
    let (mut peer, _session, mut incoming) = pair(SessionConfig::default());
    peer.open(1, &[("streamtype", "stdout")]).await;
    let mut stream = accept(&mut incoming).await;
    assert!(matches!(peer.next().await, Some(Frame::SynReply { .. })));
    peer.send(Frame::WindowUpdate { stream_id: 1, delta: 1 }).await;
    tokio::task::yield_now().await;
    let writer = tokio::spawn(async move {
        stream.writer.write_all(&vec![6u8; 200 * 1024]).await.unwrap();
        stream.writer
    });
    // The session window (64 KiB) is the tighter one.
    assert_eq!(peer.read_data(1, 65536).await.len(), 65536);
    // Absence can only be shown by waiting a while.
    let stalled = tokio::time::timeout(Duration::from_millis(300), peer.next()).await;
    assert!(stalled.is_err(), "nothing past the window: {stalled:?}");
    assert!(!writer.is_finished());
    peer.send(Frame::WindowUpdate {
        stream_id: 0,
        delta: 1 << 20,
    })
    .await;
    peer.send(Frame::WindowUpdate {
        stream_id: 1,
        delta: 1 << 20,
    })
    .await;
    assert_eq!(peer.read_data(1, 200 * 1024 - 65536).await.len(), 200 * 1024 - 65536);
    writer.await.unwrap();
}

#[tokio::test]
async fn consumed_data_is_credited_back() {
    let (mut peer, _session, mut incoming) = pair(SessionConfig::default());
    peer.open(1, &[("streamtype", "stdin")]).await;
    let mut stream = accept(&mut incoming).await;
    peer.send(Frame::Data {
        stream_id: 1,
        fin: false,
        data: Bytes::from(vec![1u8; 40_000]),
    })
    .await;
    let mut got = vec![0u8; 40_000];
    stream.reader.read_exact(&mut got).await.unwrap();
    let mut updates = Vec::new();
    while updates.len() < 2 {
        match peer.next().await {
            Some(Frame::WindowUpdate { stream_id, delta }) => updates.push((stream_id, delta)),
            Some(Frame::SynReply { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    updates.sort();
    assert_eq!(updates, vec![(0, 40_000), (1, 40_000)]);
}

#[tokio::test]
async fn a_malformed_frame_ends_the_session_with_goaway_and_a_reason() {
    let (mut peer, session, _incoming) = pair(SessionConfig::default());
    peer.send_raw(b"\x80\x03\x00\x06\x00\x00\x00\x05\x00\x00\x00\x01\x00")
        .await;
    assert_eq!(
        peer.next().await,
        Some(Frame::GoAway {
            last_good_stream_id: 0,
            status: goaway::PROTOCOL_ERROR
        })
    );
    assert_eq!(peer.next().await, None, "then the connection closes");
    session.closed().await;
    let why = session.failure().unwrap();
    assert!(why.contains("malformed SPDY PING frame"), "{why}");
}

#[tokio::test]
async fn a_bad_header_block_resets_its_stream_only() {
    let (mut peer, _session, mut incoming) = pair(SessionConfig::default());
    peer.open(1, &[("StreamType", "x")]).await;
    assert_eq!(
        peer.next().await,
        Some(Frame::RstStream {
            stream_id: 1,
            status: rst::PROTOCOL_ERROR
        })
    );
    peer.open(3, &[("streamtype", "error")]).await;
    assert_eq!(accept(&mut incoming).await.id, 3, "the session goes on");
    assert!(matches!(peer.next().await, Some(Frame::SynReply { stream_id: 3, .. })));
    // A reused id is refused too.
    peer.open(3, &[("streamtype", "error")]).await;
    assert_eq!(
        peer.next().await,
        Some(Frame::RstStream {
            stream_id: 3,
            status: rst::PROTOCOL_ERROR
        })
    );
}

#[tokio::test]
async fn a_reset_from_the_peer_fails_both_halves() {
    let (mut peer, _session, mut incoming) = pair(SessionConfig::default());
    peer.open(1, &[("streamtype", "data")]).await;
    let mut stream = accept(&mut incoming).await;
    peer.send(Frame::RstStream {
        stream_id: 1,
        status: rst::CANCEL,
    })
    .await;
    let mut buf = [0u8; 4];
    let err = stream.reader.read(&mut buf).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset);
    let err = stream.writer.write_all(b"x").await.unwrap_err();
    assert!(err.to_string().contains("reset by the peer"), "{err}");
}

#[tokio::test]
async fn streams_past_the_limit_are_refused() {
    let (mut peer, _session, mut incoming) = pair(SessionConfig {
        max_streams: 1,
        ..SessionConfig::default()
    });
    peer.open(1, &[("streamtype", "data")]).await;
    let _first = accept(&mut incoming).await;
    peer.open(3, &[("streamtype", "data")]).await;
    assert!(matches!(peer.next().await, Some(Frame::SynReply { stream_id: 1, .. })));
    assert_eq!(
        peer.next().await,
        Some(Frame::RstStream {
            stream_id: 3,
            status: rst::REFUSED_STREAM
        })
    );
}

#[tokio::test]
async fn an_idle_session_is_closed_after_the_idle_timeout() {
    let (mut peer, session, _incoming) = pair(SessionConfig {
        idle_timeout: Duration::from_millis(200),
        ..SessionConfig::default()
    });
    session.closed().await;
    assert!(session.failure().unwrap().contains("idle timeout"));
    assert_eq!(peer.next().await, None);
}

#[tokio::test]
async fn shutdown_sends_what_was_written_then_goaway() {
    let (mut peer, session, mut incoming) = pair(SessionConfig::default());
    peer.open(1, &[("streamtype", "error")]).await;
    let mut stream = accept(&mut incoming).await;
    stream.writer.write_all(b"{\"status\":\"Success\"}").await.unwrap();
    stream.writer.shutdown().await.unwrap();
    session.shutdown(Duration::from_secs(10)).await;
    assert!(matches!(peer.next().await, Some(Frame::SynReply { .. })));
    assert_eq!(peer.read_data(1, 20).await, b"{\"status\":\"Success\"}");
    assert!(matches!(peer.next().await, Some(Frame::Data { fin: true, .. })));
    assert_eq!(
        peer.next().await,
        Some(Frame::GoAway {
            last_good_stream_id: 1,
            status: goaway::OK
        })
    );
    assert_eq!(peer.next().await, None);
    assert!(session.failure().is_none());
}

#[tokio::test]
async fn the_peer_leaving_ends_the_session_and_its_streams() {
    let (peer, session, mut incoming) = pair(SessionConfig::default());
    let mut peer = peer;
    peer.open(1, &[("streamtype", "stdin")]).await;
    let mut stream = accept(&mut incoming).await;
    drop(peer);
    session.closed().await;
    let mut buf = Vec::new();
    assert!(stream.reader.read_to_end(&mut buf).await.is_err());
    assert!(stream.writer.write_all(b"x").await.is_err());
}

/// Over TCP, the close after GOAWAY is a lingering one: the session reads on until the peer's EOF,
/// so what the peer sends meanwhile is taken, not answered with a reset (which could discard the
/// GOAWAY and the last DATA before the peer read them).
#[tokio::test]
async fn after_goaway_the_session_reads_on_until_the_peer_closes() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let (session, _incoming) = serve(server, SessionConfig::default());
    let mut peer = Peer::new(client);
    session.shutdown(Duration::from_secs(10)).await;
    assert_eq!(
        peer.next().await,
        Some(Frame::GoAway {
            last_good_stream_id: 0,
            status: goaway::OK
        })
    );
    assert_eq!(peer.next().await, None, "the session's FIN");
    // The peer has not seen the GOAWAY yet, say, and goes on talking: a socket closed with these
    // bytes unread would answer with a reset, and the next write would fail.
    for id in 1..=3u32 {
        let mut ping = BytesMut::new();
        encode(&Frame::Ping { id }, &mut ping).unwrap();
        peer.io
            .write_all(&ping)
            .await
            .expect("the session still reads: no reset");
        tokio::task::yield_now().await;
    }
    peer.io.shutdown().await.expect("the peer closes its side cleanly");
    assert_eq!(peer.io.read(&mut [0u8; 16]).await.expect("no reset"), 0);
}

/// A peer that stops reading while it sends 1-byte DATA frames to a stream that does not exist:
/// each one asks for a WINDOW_UPDATE the session cannot write. The queue of control frames is
/// bounded: past it the session ends, naming the flood, instead of growing without limit.
#[tokio::test]
async fn a_peer_that_floods_frames_and_never_reads_is_cut_off() {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let (session, _incoming) = serve(server, SessionConfig::default());
    let (_never_read, mut write) = tokio::io::split(client);
    // DATA, stream 99, no flags, length 1, "A".
    let frame: &[u8] = b"\x00\x00\x00\x63\x00\x00\x00\x01\x41";
    let flood = tokio::spawn(async move {
        let chunk = frame.repeat(10_000);
        for _ in 0..100 {
            if write.write_all(&chunk).await.is_err() {
                return;
            }
        }
        // All of it read: keep the connection open, as a peer that simply stops reading would.
        std::future::pending::<()>().await;
    });
    let closed = tokio::time::timeout(Duration::from_secs(60), session.closed()).await;
    let queued = session.queued_control();
    flood.abort();
    assert!(
        closed.is_ok(),
        "1M frames taken while the peer reads nothing, and the session goes on ({queued} control frames queued)"
    );
    assert!(queued <= 4096 + 16, "{queued} control frames queued");
    let why = session.failure().unwrap_or_default();
    assert!(why.contains("flood"), "{why}");
}
