//! Writing frames: [`encode`] appends the SPDY/3 wire form of a [`Frame`], refusing what the
//! wire cannot carry (stream id 0 or over 2^31-1, a payload over 2^24-1 bytes) rather than
//! truncating it.

use bytes::{BufMut, BytesMut};

use super::*;

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
