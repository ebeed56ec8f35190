//! SPDY/3.1 framing: the 8-byte frame header, the control frames the kubelet's streaming
//! protocols use, and DATA. Header blocks stay compressed here ([`super::headers`] inflates them:
//! the zlib context spans the whole session, so it belongs to the session, not to a frame).
//!
//! The decoder is incremental and keeps little memory: a control frame is buffered whole (up to
//! [`Limits::max_control_len`]), a DATA frame is handed out in pieces as its bytes arrive, so a
//! peer's 16 MiB frame costs no 16 MiB buffer.
//!
//! Split by job: this file holds the frame vocabulary (constants, [`Frame`], [`FrameError`],
//! [`Limits`]); the `decode` module parses bytes into frames incrementally ([`Decoder`]) and the
//! `encode` module writes them ([`encode`]). The round-trip tests below exercise both halves.

use bytes::Bytes;

mod decode;
mod encode;

pub use decode::Decoder;
pub use encode::encode;

/// The protocol version this codec speaks (the `SPDY/3.1` of the upgrade header).
pub const VERSION: u16 = 3;
/// Every frame starts with 8 bytes.
pub const HEADER_LEN: usize = 8;
/// The 24-bit length field's maximum.
pub const MAX_LENGTH: usize = (1 << 24) - 1;
/// Stream ids and window deltas are 31 bits.
const ID_MASK: u32 = 0x7fff_ffff;

pub const FLAG_FIN: u8 = 0x01;
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;
pub const FLAG_SETTINGS_CLEAR: u8 = 0x01;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// RST_STREAM status codes (SPDY/3 §2.6.3).
pub mod rst {
    pub const PROTOCOL_ERROR: u32 = 1;
    pub const INVALID_STREAM: u32 = 2;
    pub const REFUSED_STREAM: u32 = 3;
    pub const UNSUPPORTED_VERSION: u32 = 4;
    pub const CANCEL: u32 = 5;
    pub const INTERNAL_ERROR: u32 = 6;
    pub const FLOW_CONTROL_ERROR: u32 = 7;
    pub const STREAM_IN_USE: u32 = 8;
    pub const STREAM_ALREADY_CLOSED: u32 = 9;
    pub const FRAME_TOO_LARGE: u32 = 11;
}

/// GOAWAY status codes.
pub mod goaway {
    pub const OK: u32 = 0;
    pub const PROTOCOL_ERROR: u32 = 1;
    pub const INTERNAL_ERROR: u32 = 2;
}

/// SETTINGS ids this implementation acts on.
pub const SETTINGS_INITIAL_WINDOW_SIZE: u32 = 7;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    pub flags: u8,
    /// 24 bits.
    pub id: u32,
    pub value: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream_id: u32,
        associated_to: u32,
        /// 0 (highest) to 7.
        priority: u8,
        slot: u8,
        fin: bool,
        unidirectional: bool,
        /// The compressed header block.
        headers: Bytes,
    },
    SynReply {
        stream_id: u32,
        fin: bool,
        headers: Bytes,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        clear: bool,
        entries: Vec<Setting>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        fin: bool,
        headers: Bytes,
    },
    /// `stream_id` 0 is the session's window (SPDY/3.1).
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    /// DATA, possibly one piece of a larger frame: `fin` comes with the last piece only.
    Data {
        stream_id: u32,
        fin: bool,
        data: Bytes,
    },
    /// A control frame type this codec does not know (CREDENTIAL, NOOP of SPDY/2, later
    /// types): receivers ignore it, as the protocol asks. Its payload was skipped.
    Unknown {
        frame_type: u16,
        flags: u8,
        len: u32,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("SPDY control frame of version {0}: only SPDY/3 (3.1) is spoken here")]
    UnsupportedVersion(u16),
    #[error("SPDY {frame} frame of {len} bytes exceeds the {limit}-byte limit for control frames")]
    ControlTooLarge {
        frame: &'static str,
        len: usize,
        limit: usize,
    },
    #[error("malformed SPDY {frame} frame: {problem}")]
    Malformed { frame: &'static str, problem: String },
    #[error("a SPDY DATA frame on stream 0")]
    DataOnStreamZero,
    #[error("cannot encode: {0}")]
    Unencodable(String),
}

fn malformed(frame: &'static str, problem: impl Into<String>) -> FrameError {
    FrameError::Malformed {
        frame,
        problem: problem.into(),
    }
}

/// What the decoder accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest control frame payload buffered (header blocks are small; 64 KiB is generous).
    pub max_control_len: usize,
    /// Largest DATA piece handed out at once.
    pub max_data_piece: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_control_len: 64 * 1024,
            max_data_piece: 64 * 1024,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn wire(frame: &Frame) -> BytesMut {
        let mut out = BytesMut::new();
        encode(frame, &mut out).unwrap();
        out
    }

    fn decode_all(bytes: &[u8], limits: Limits) -> Result<Vec<Frame>, FrameError> {
        let mut d = Decoder::new(limits);
        let mut buf = BytesMut::from(bytes);
        let mut out = Vec::new();
        while let Some(f) = d.decode(&mut buf)? {
            out.push(f);
        }
        Ok(out)
    }

    fn samples() -> Vec<Frame> {
        vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 3,
                slot: 0,
                fin: false,
                unidirectional: false,
                headers: Bytes::from_static(b"\x78\x01compressed"),
            },
            Frame::SynReply {
                stream_id: 1,
                fin: true,
                headers: Bytes::from_static(b"hb"),
            },
            Frame::RstStream {
                stream_id: 3,
                status: rst::CANCEL,
            },
            Frame::Settings {
                clear: true,
                entries: vec![Setting {
                    flags: 1,
                    id: SETTINGS_INITIAL_WINDOW_SIZE,
                    value: 1 << 20,
                }],
            },
            Frame::Ping { id: 7 },
            Frame::GoAway {
                last_good_stream_id: 5,
                status: goaway::PROTOCOL_ERROR,
            },
            Frame::Headers {
                stream_id: 9,
                fin: false,
                headers: Bytes::new(),
            },
            Frame::WindowUpdate {
                stream_id: 0,
                delta: 65536,
            },
            Frame::Data {
                stream_id: 1,
                fin: true,
                data: Bytes::from_static(b"hello"),
            },
            Frame::Data {
                stream_id: 3,
                fin: false,
                data: Bytes::new(),
            },
        ]
    }

    #[test]
    fn every_frame_round_trips() {
        for f in samples() {
            assert_eq!(
                decode_all(&wire(&f), Limits::default()).unwrap(),
                vec![f.clone()],
                "{f:?}"
            );
        }
    }

    #[test]
    fn the_wire_layout_is_spdy3() {
        // A PING: control bit + version 3, type 6, no flags, length 4, id.
        assert_eq!(
            &wire(&Frame::Ping { id: 0x0102_0304 })[..],
            b"\x80\x03\x00\x06\x00\x00\x00\x04\x01\x02\x03\x04"
        );
        // DATA: stream id, FIN flag, 24-bit length.
        assert_eq!(
            &wire(&Frame::Data {
                stream_id: 5,
                fin: true,
                data: Bytes::from_static(b"ab")
            })[..],
            b"\x00\x00\x00\x05\x01\x00\x00\x02ab"
        );
        // SYN_STREAM: priority in the top 3 bits.
        let w = wire(&Frame::SynStream {
            stream_id: 1,
            associated_to: 0,
            priority: 7,
            slot: 0,
            fin: false,
            unidirectional: true,
            headers: Bytes::new(),
        });
        assert_eq!(
            &w[..],
            b"\x80\x03\x00\x01\x02\x00\x00\x0a\x00\x00\x00\x01\x00\x00\x00\x00\xe0\x00"
        );
    }

    #[test]
    fn frames_split_anywhere_decode_the_same() {
        let mut all = BytesMut::new();
        for f in samples() {
            encode(&f, &mut all).unwrap();
        }
        let whole = decode_all(&all, Limits::default()).unwrap();
        for step in [1, 2, 3, 7, 13] {
            let mut d = Decoder::new(Limits::default());
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for chunk in all.chunks(step) {
                buf.extend_from_slice(chunk);
                while let Some(f) = d.decode(&mut buf).unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(merge_data(got), merge_data(whole.clone()), "step {step}");
        }
    }

    /// Joins consecutive DATA pieces of one frame (a split input yields smaller pieces).
    fn merge_data(frames: Vec<Frame>) -> Vec<Frame> {
        let mut out: Vec<Frame> = Vec::new();
        let mut open = false;
        for f in frames {
            if let (
                Frame::Data { stream_id, fin, data },
                Some(Frame::Data {
                    stream_id: last_id,
                    fin: last_fin,
                    data: last,
                }),
            ) = (&f, out.last_mut())
                && open
                && stream_id == last_id
            {
                let mut joined = BytesMut::from(&last[..]);
                joined.extend_from_slice(data);
                *last = joined.freeze();
                *last_fin = *fin;
                open = !fin && !data.is_empty();
                continue;
            }
            open = matches!(&f, Frame::Data { fin: false, data, .. } if !data.is_empty());
            out.push(f);
        }
        out
    }

    #[test]
    fn large_data_frames_come_in_bounded_pieces() {
        let data = Bytes::from(vec![7u8; 200_000]);
        let limits = Limits {
            max_data_piece: 65536,
            ..Limits::default()
        };
        let pieces = decode_all(
            &wire(&Frame::Data {
                stream_id: 1,
                fin: true,
                data: data.clone(),
            }),
            limits,
        )
        .unwrap();
        assert_eq!(pieces.len(), 4);
        let mut joined = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            let Frame::Data { fin, data, .. } = p else { panic!() };
            assert!(data.len() <= 65536);
            assert_eq!(*fin, i == 3, "FIN on the last piece only");
            joined.extend_from_slice(data);
        }
        assert_eq!(joined, data);
    }

    #[test]
    fn bad_frames_are_errors_that_say_what_is_wrong() {
        let cases: Vec<(&[u8], &str)> = vec![
            (b"\x80\x02\x00\x06\x00\x00\x00\x04\x00\x00\x00\x01", "version 2"),
            (
                b"\x80\x03\x00\x06\x00\x00\x00\x05\x00\x00\x00\x01\x00",
                "PING frame: length 5",
            ),
            (
                b"\x80\x03\x00\x03\x00\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x01",
                "stream id 0",
            ),
            (
                b"\x80\x03\x00\x09\x00\x00\x00\x08\x00\x00\x00\x01\x00\x00\x00\x00",
                "delta of 0",
            ),
            (
                b"\x80\x03\x00\x04\x00\x00\x00\x0c\x00\x00\x00\x02\x00\x00\x00\x07\x00\x00\x00\x01",
                "2 entries",
            ),
            (b"\x80\x03\x00\x01\x00\x00\x00\x04\x00\x00\x00\x01", "at least 10"),
            (b"\x00\x00\x00\x00\x00\x00\x00\x00", "stream 0"),
        ];
        for (bytes, want) in cases {
            let err = decode_all(bytes, Limits::default()).unwrap_err().to_string();
            assert!(err.contains(want), "{err:?} should mention {want:?}");
        }
        let big = [b"\x80\x03\x00\x01\x00\x01\x00\x00".as_slice(), &[0u8; 65536]].concat();
        let err = decode_all(
            &big,
            Limits {
                max_control_len: 1024,
                ..Limits::default()
            },
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "SPDY SYN_STREAM frame of 65536 bytes exceeds the 1024-byte limit for control frames"
        );
    }

    #[test]
    fn unknown_control_frames_are_skipped_whatever_their_size() {
        let mut bytes = b"\x80\x03\x00\x0a\x00\x01\x00\x00".to_vec();
        bytes.extend(vec![0u8; 65536]);
        bytes.extend_from_slice(&wire(&Frame::Ping { id: 2 }));
        let frames = decode_all(
            &bytes,
            Limits {
                max_control_len: 16,
                ..Limits::default()
            },
        )
        .unwrap();
        assert_eq!(
            frames,
            vec![
                Frame::Unknown {
                    frame_type: 10,
                    flags: 0,
                    len: 65536
                },
                Frame::Ping { id: 2 }
            ]
        );
    }
}
