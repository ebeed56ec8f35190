//! The incremental SPDY/3 decoder: a control frame is buffered whole (up to
//! [`Limits::max_control_len`]) and parsed into a [`Frame`], a DATA frame is handed out in
//! bounded pieces as its bytes arrive, an unknown control frame is skipped whatever its size.

use bytes::{Buf, Bytes, BytesMut};

use super::*;

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
