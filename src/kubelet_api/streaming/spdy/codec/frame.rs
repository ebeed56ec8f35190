//! SPDY/3.1 framing: the 8-byte frame header, the control frames the kubelet's streaming
//! protocols use, and DATA. Header blocks stay compressed here ([`super::headers`] inflates them:
//! the zlib context spans the whole session, so it belongs to the session, not to a frame).
//!
//! The decoder is incremental and keeps little memory: a control frame is buffered whole (up to
//! [`Limits::max_control_len`]), a DATA frame is handed out in pieces as its bytes arrive, so a
//! peer's 16 MiB frame costs no 16 MiB buffer.

use bytes::{Buf, BufMut, Bytes, BytesMut};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    /// Inside a DATA frame: `remaining` payload bytes still to come.
    Data {
        stream_id: u32,
        fin: bool,
        remaining: usize,
    },
    /// Skipping the payload of an unknown control frame.
    Skip {
        remaining: usize,
    },
}

/// Incremental frame decoder: feed it the bytes read so far, take frames out.
#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    state: State,
}

fn type_name(t: u16) -> &'static str {
    match t {
        TYPE_SYN_STREAM => "SYN_STREAM",
        TYPE_SYN_REPLY => "SYN_REPLY",
        TYPE_RST_STREAM => "RST_STREAM",
        TYPE_SETTINGS => "SETTINGS",
        TYPE_PING => "PING",
        TYPE_GOAWAY => "GOAWAY",
        TYPE_HEADERS => "HEADERS",
        TYPE_WINDOW_UPDATE => "WINDOW_UPDATE",
        _ => "unknown",
    }
}

fn known(t: u16) -> bool {
    type_name(t) != "unknown"
}

impl Decoder {
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            state: State::Head,
        }
    }

    /// The next frame (or DATA piece) from the front of `buf`, consuming its bytes; `None`
    /// until enough bytes are there. An error leaves the session unusable (close it).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        loop {
            match self.state {
                State::Head => {
                    if buf.len() < HEADER_LEN {
                        return Ok(None);
                    }
                    let word = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
                    let flags = buf[4];
                    let len = (usize::from(buf[5]) << 16) | (usize::from(buf[6]) << 8) | usize::from(buf[7]);
                    if word & 0x8000_0000 == 0 {
                        let stream_id = word & ID_MASK;
                        if stream_id == 0 {
                            return Err(FrameError::DataOnStreamZero);
                        }
                        buf.advance(HEADER_LEN);
                        let fin = flags & FLAG_FIN != 0;
                        if len == 0 {
                            return Ok(Some(Frame::Data {
                                stream_id,
                                fin,
                                data: Bytes::new(),
                            }));
                        }
                        self.state = State::Data {
                            stream_id,
                            fin,
                            remaining: len,
                        };
                        continue;
                    }
                    let version = ((word >> 16) & 0x7fff) as u16;
                    let frame_type = (word & 0xffff) as u16;
                    if version != VERSION {
                        return Err(FrameError::UnsupportedVersion(version));
                    }
                    if !known(frame_type) {
                        buf.advance(HEADER_LEN);
                        self.state = State::Skip { remaining: len };
                        return Ok(Some(Frame::Unknown {
                            frame_type,
                            flags,
                            len: len as u32,
                        }));
                    }
                    if len > self.limits.max_control_len {
                        return Err(FrameError::ControlTooLarge {
                            frame: type_name(frame_type),
                            len,
                            limit: self.limits.max_control_len,
                        });
                    }
                    if buf.len() < HEADER_LEN + len {
                        buf.reserve(HEADER_LEN + len - buf.len());
                        return Ok(None);
                    }
                    buf.advance(HEADER_LEN);
                    let payload = buf.split_to(len).freeze();
                    return control(frame_type, flags, payload).map(Some);
                }
                State::Data {
                    stream_id,
                    fin,
                    remaining,
                } => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = remaining.min(buf.len()).min(self.limits.max_data_piece);
                    let data = buf.split_to(n).freeze();
                    let left = remaining - n;
                    self.state = if left == 0 {
                        State::Head
                    } else {
                        State::Data {
                            stream_id,
                            fin,
                            remaining: left,
                        }
                    };
                    return Ok(Some(Frame::Data {
                        stream_id,
                        fin: fin && left == 0,
                        data,
                    }));
                }
                State::Skip { remaining } => {
                    let n = remaining.min(buf.len());
                    buf.advance(n);
                    if n == remaining {
                        self.state = State::Head;
                        continue;
                    }
                    self.state = State::Skip {
                        remaining: remaining - n,
                    };
                    return Ok(None);
                }
            }
        }
    }
}

fn stream_id(frame: &'static str, raw: u32) -> Result<u32, FrameError> {
    match raw & ID_MASK {
        0 => Err(malformed(frame, "stream id 0")),
        id => Ok(id),
    }
}

fn need(frame: &'static str, p: &Bytes, exact: Option<usize>, min: usize) -> Result<(), FrameError> {
    match exact {
        Some(n) if p.len() != n => Err(malformed(frame, format!("length {} (it is {n})", p.len()))),
        _ if p.len() < min => Err(malformed(frame, format!("length {} (at least {min})", p.len()))),
        _ => Ok(()),
    }
}

fn control(frame_type: u16, flags: u8, mut p: Bytes) -> Result<Frame, FrameError> {
    let name = type_name(frame_type);
    let fin = flags & FLAG_FIN != 0;
    Ok(match frame_type {
        TYPE_SYN_STREAM => {
            need(name, &p, None, 10)?;
            let id = stream_id(name, p.get_u32())?;
            let associated_to = p.get_u32() & ID_MASK;
            let priority = p.get_u8() >> 5;
            let slot = p.get_u8();
            Frame::SynStream {
                stream_id: id,
                associated_to,
                priority,
                slot,
                fin,
                unidirectional: flags & FLAG_UNIDIRECTIONAL != 0,
                headers: p,
            }
        }
        TYPE_SYN_REPLY => {
            need(name, &p, None, 4)?;
            let id = stream_id(name, p.get_u32())?;
            Frame::SynReply {
                stream_id: id,
                fin,
                headers: p,
            }
        }
        TYPE_HEADERS => {
            need(name, &p, None, 4)?;
            let id = stream_id(name, p.get_u32())?;
            Frame::Headers {
                stream_id: id,
                fin,
                headers: p,
            }
        }
        TYPE_RST_STREAM => {
            need(name, &p, Some(8), 8)?;
            let id = stream_id(name, p.get_u32())?;
            Frame::RstStream {
                stream_id: id,
                status: p.get_u32(),
            }
        }
        TYPE_SETTINGS => {
            need(name, &p, None, 4)?;
            let n = p.get_u32() as usize;
            if p.len() / 8 != n || !p.len().is_multiple_of(8) {
                return Err(malformed(
                    name,
                    format!("{n} entries announced, {} bytes of entries", p.len()),
                ));
            }
            let entries = (0..n)
                .map(|_| {
                    let word = p.get_u32();
                    Setting {
                        flags: (word >> 24) as u8,
                        id: word & 0x00ff_ffff,
                        value: p.get_u32(),
                    }
                })
                .collect();
            Frame::Settings {
                clear: flags & FLAG_SETTINGS_CLEAR != 0,
                entries,
            }
        }
        TYPE_PING => {
            need(name, &p, Some(4), 4)?;
            Frame::Ping { id: p.get_u32() }
        }
        TYPE_GOAWAY => {
            need(name, &p, Some(8), 8)?;
            Frame::GoAway {
                last_good_stream_id: p.get_u32() & ID_MASK,
                status: p.get_u32(),
            }
        }
        TYPE_WINDOW_UPDATE => {
            need(name, &p, Some(8), 8)?;
            let id = p.get_u32() & ID_MASK;
            let delta = p.get_u32() & ID_MASK;
            if delta == 0 {
                return Err(malformed(name, "a delta of 0 (1 to 2^31-1)"));
            }
            Frame::WindowUpdate { stream_id: id, delta }
        }
        _ => unreachable!("known() admits only the types above"),
    })
}

fn put_control(out: &mut BytesMut, frame_type: u16, flags: u8, len: usize) -> Result<(), FrameError> {
    if len > MAX_LENGTH {
        return Err(FrameError::Unencodable(format!("a {len}-byte frame")));
    }
    out.put_u16(0x8000 | VERSION);
    out.put_u16(frame_type);
    out.put_u8(flags);
    out.put_uint(len as u64, 3);
    Ok(())
}

fn check_id(id: u32) -> Result<u32, FrameError> {
    if id == 0 || id > ID_MASK {
        return Err(FrameError::Unencodable(format!("stream id {id}")));
    }
    Ok(id)
}

fn fin_flag(fin: bool) -> u8 {
    if fin { FLAG_FIN } else { 0 }
}

/// Appends the wire form of `frame` to `out`.
pub fn encode(frame: &Frame, out: &mut BytesMut) -> Result<(), FrameError> {
    match frame {
        Frame::SynStream {
            stream_id,
            associated_to,
            priority,
            slot,
            fin,
            unidirectional,
            headers,
        } => {
            let flags = fin_flag(*fin) | if *unidirectional { FLAG_UNIDIRECTIONAL } else { 0 };
            put_control(out, TYPE_SYN_STREAM, flags, 10 + headers.len())?;
            out.put_u32(check_id(*stream_id)?);
            out.put_u32(associated_to & ID_MASK);
            out.put_u8((priority & 0x7) << 5);
            out.put_u8(*slot);
            out.put_slice(headers);
        }
        Frame::SynReply {
            stream_id,
            fin,
            headers,
        } => {
            put_control(out, TYPE_SYN_REPLY, fin_flag(*fin), 4 + headers.len())?;
            out.put_u32(check_id(*stream_id)?);
            out.put_slice(headers);
        }
        Frame::Headers {
            stream_id,
            fin,
            headers,
        } => {
            put_control(out, TYPE_HEADERS, fin_flag(*fin), 4 + headers.len())?;
            out.put_u32(check_id(*stream_id)?);
            out.put_slice(headers);
        }
        Frame::RstStream { stream_id, status } => {
            put_control(out, TYPE_RST_STREAM, 0, 8)?;
            out.put_u32(check_id(*stream_id)?);
            out.put_u32(*status);
        }
        Frame::Settings { clear, entries } => {
            let flags = if *clear { FLAG_SETTINGS_CLEAR } else { 0 };
            put_control(out, TYPE_SETTINGS, flags, 4 + 8 * entries.len())?;
            out.put_u32(entries.len() as u32);
            for e in entries {
                if e.id > 0x00ff_ffff {
                    return Err(FrameError::Unencodable(format!("setting id {}", e.id)));
                }
                out.put_u32((u32::from(e.flags) << 24) | e.id);
                out.put_u32(e.value);
            }
        }
        Frame::Ping { id } => {
            put_control(out, TYPE_PING, 0, 4)?;
            out.put_u32(*id);
        }
        Frame::GoAway {
            last_good_stream_id,
            status,
        } => {
            put_control(out, TYPE_GOAWAY, 0, 8)?;
            out.put_u32(last_good_stream_id & ID_MASK);
            out.put_u32(*status);
        }
        Frame::WindowUpdate { stream_id, delta } => {
            if *delta == 0 || *delta > ID_MASK || *stream_id > ID_MASK {
                return Err(FrameError::Unencodable(format!(
                    "WINDOW_UPDATE of {delta} on stream {stream_id}"
                )));
            }
            put_control(out, TYPE_WINDOW_UPDATE, 0, 8)?;
            out.put_u32(*stream_id);
            out.put_u32(*delta);
        }
        Frame::Data { stream_id, fin, data } => {
            if data.len() > MAX_LENGTH {
                return Err(FrameError::Unencodable(format!("a {}-byte DATA frame", data.len())));
            }
            out.put_u32(check_id(*stream_id)?);
            out.put_u8(fin_flag(*fin));
            out.put_uint(data.len() as u64, 3);
            out.put_slice(data);
        }
        Frame::Unknown { frame_type, .. } => {
            return Err(FrameError::Unencodable(format!("control frame type {frame_type}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
