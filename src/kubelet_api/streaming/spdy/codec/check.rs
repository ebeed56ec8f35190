//! The property the fuzz target (`tests/fuzz/fuzz_targets/spdy_frames.rs`) checks on arbitrary
//! bytes, and the unit test that replays its corpus: decoding never panics, gives the same
//! frames and the same error however the input is split into reads, and every frame it yields
//! encodes back to bytes that decode to the same frame (header blocks: the inflated pairs
//! survive a fresh deflate / inflate).

use bytes::BytesMut;

use super::frame::{Decoder, Frame, Limits, encode};
use super::headers::{Deflater, HeaderBlock, Inflater};

/// What a peer's bytes amount to, independent of how they were split: control frames, data
/// bytes per stream (consecutive pieces joined), FIN marks, inflated header blocks, and the
/// error that ended the session, if one did.
#[derive(Debug, PartialEq, Eq)]
enum Event {
    Control(Frame),
    Headers(Result<HeaderBlock, String>),
    Data(u32, Vec<u8>),
    Fin(u32),
    Error(String),
}

fn limits(data_piece: usize) -> Limits {
    Limits {
        max_control_len: 4096,
        max_data_piece: data_piece,
    }
}

fn push(events: &mut Vec<Event>, frame: Frame) {
    match frame {
        Frame::Data { stream_id, fin, data } => {
            if !data.is_empty() {
                match events.last_mut() {
                    Some(Event::Data(id, bytes)) if *id == stream_id => bytes.extend_from_slice(&data),
                    _ => events.push(Event::Data(stream_id, data.to_vec())),
                }
            }
            if fin {
                events.push(Event::Fin(stream_id));
            }
        }
        other => events.push(Event::Control(other)),
    }
}

/// Decodes `input` fed in reads of `step` bytes, inflating header blocks as a session would.
fn decode(input: &[u8], step: usize, data_piece: usize) -> Vec<Event> {
    let mut decoder = Decoder::new(limits(data_piece));
    let mut inflater = Inflater::new(16 * 1024);
    let mut buf = BytesMut::new();
    let mut events = Vec::new();
    for chunk in input.chunks(step.max(1)) {
        buf.extend_from_slice(chunk);
        loop {
            match decoder.decode(&mut buf) {
                Ok(None) => break,
                Ok(Some(frame)) => {
                    let block = match &frame {
                        Frame::SynStream { headers, .. }
                        | Frame::SynReply { headers, .. }
                        | Frame::Headers { headers, .. } => Some(inflater.inflate(headers)),
                        _ => None,
                    };
                    push(&mut events, frame);
                    if let Some(block) = block {
                        let session_over = block.as_ref().is_err_and(|e| !e.is_stream_error());
                        events.push(Event::Headers(block.map_err(|e| e.to_string())));
                        if session_over {
                            return events;
                        }
                    }
                }
                Err(e) => {
                    events.push(Event::Error(e.to_string()));
                    return events;
                }
            }
        }
    }
    events
}

/// Encodes `frame` alone and decodes it again.
fn reencoded(frame: &Frame) -> Option<Vec<Event>> {
    let mut wire = BytesMut::new();
    encode(frame, &mut wire).ok()?;
    let mut d = Decoder::new(limits(usize::MAX));
    let mut events = Vec::new();
    while let Some(f) = d.decode(&mut wire).expect("an encoded frame decodes") {
        push(&mut events, f);
    }
    assert!(wire.is_empty(), "the whole encoding is consumed");
    Some(events)
}

/// Asserts the properties above on one input. Its first byte picks the read size and the
/// DATA piece size, the rest is the peer's byte stream.
pub fn check(data: &[u8]) {
    let Some((&knob, input)) = data.split_first() else {
        return;
    };
    let step = usize::from(knob & 0x0f) + 1;
    let piece = usize::from(knob >> 4) * 97 + 1;
    let whole = decode(input, input.len().max(1), usize::MAX);
    let split = decode(input, step, piece);
    assert_eq!(
        whole, split,
        "the same bytes, read {step} at a time, decode differently"
    );
    for event in &whole {
        match event {
            Event::Control(frame @ Frame::Unknown { .. }) => {
                assert!(reencoded(frame).is_none(), "unknown frames are not re-encoded");
            }
            Event::Control(frame) => {
                let again = reencoded(frame).expect("a decoded frame encodes");
                assert_eq!(again, vec![Event::Control(frame.clone())]);
            }
            Event::Headers(Ok(block)) => {
                let wire = Deflater::new().deflate(block);
                assert_eq!(
                    &Inflater::new(1 << 20).inflate(&wire).expect("re-deflated block"),
                    block
                );
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz/corpus/spdy_frames")
    }

    fn corpus_file(name: &str) -> Vec<u8> {
        std::fs::read(corpus_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    #[test]
    fn the_fuzz_corpus_replays() {
        let mut n = 0;
        for entry in std::fs::read_dir(corpus_dir()).unwrap() {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{} fails the codec property", path.display());
            n += 1;
        }
        assert!(n >= 10, "the seed corpus is there ({n} files)");
    }

    /// Bytes a real kube-apiserver (1.36) sent for `kubectl exec -i pod -- cat` with
    /// `hello spdy\n` on stdin, captured behind a stand-in kubelet: Go's zlib streams inflate
    /// with this dictionary, and the streams are what the kubelet protocol expects.
    #[test]
    fn the_apiservers_own_frames_decode() {
        let capture = corpus_file("apiserver-exec-stdin-00");
        let events = decode(&capture[1..], 5, 64);
        let streams: Vec<(u32, String)> = events
            .windows(2)
            .filter_map(|w| match w {
                [
                    Event::Control(Frame::SynStream { stream_id, .. }),
                    Event::Headers(Ok(b)),
                ] => Some((*stream_id, b.get("streamtype").unwrap().to_string())),
                _ => None,
            })
            .collect();
        assert_eq!(
            streams,
            [(1, "error"), (3, "stdin"), (5, "stdout"), (7, "stderr")].map(|(i, s)| (i, s.to_string()))
        );
        assert!(events.contains(&Event::Data(3, b"hello spdy\n".to_vec())));
        assert_eq!(events.last(), Some(&Event::Fin(3)), "stdin ends with FIN: {events:?}");

        let capture = corpus_file("apiserver-portforward-http-00");
        let events = decode(&capture[1..], 1000, 1000);
        let Event::Headers(Ok(data_headers)) = &events[4] else {
            panic!("{events:?}")
        };
        assert_eq!(
            (
                data_headers.get("streamtype"),
                data_headers.get("port"),
                data_headers.get("requestid")
            ),
            (Some("data"), Some("80"), Some("0"))
        );
        assert!(events.contains(&Event::Data(3, b"GET / HTTP/1.0\r\n\r\n".to_vec())));
    }
}
