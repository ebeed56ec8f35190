//! SPDY/3 header blocks: name/value pairs (32-bit lengths, lowercase names, several values
//! joined by NUL), compressed with zlib primed with the protocol's dictionary. One inflater and
//! one deflater live for a whole session (each side's blocks form one zlib stream), so a block
//! that fails to inflate breaks the session, while a well-compressed block with bad contents
//! only breaks its stream.

use std::sync::OnceLock;

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The header names and values of one block, in order. Values holding several values keep
/// them NUL-separated, as on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderBlock(pub Vec<(String, String)>);

impl HeaderBlock {
    /// The first value of `name` (names are lowercase on the wire).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.split('\0').next().unwrap_or(""))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// The session's zlib stream is broken: nothing more can be read from it.
    #[error("SPDY header block does not inflate: {0}")]
    Compression(String),
    #[error("SPDY header block inflates past the {limit}-byte limit")]
    TooLarge { limit: usize },
    /// The block inflated but its contents break the protocol (affects one stream).
    #[error("malformed SPDY header block: {0}")]
    Format(String),
}

impl HeaderError {
    /// Whether the session can go on (only the stream that carried the block is affected).
    pub fn is_stream_error(&self) -> bool {
        matches!(self, HeaderError::Format(_))
    }
}

/// Most name/value pairs accepted in one block.
const MAX_PAIRS: usize = 1024;

/// The zlib dictionary of SPDY/3 (§2.6.10.1): common header words, each with its 32-bit
/// length in front, then a run of common values.
pub fn dictionary() -> &'static [u8] {
    static DICTIONARY: OnceLock<Vec<u8>> = OnceLock::new();
    DICTIONARY.get_or_init(|| {
        const WORDS: &[&str] = &[
            "options",
            "head",
            "post",
            "put",
            "delete",
            "trace",
            "accept",
            "accept-charset",
            "accept-encoding",
            "accept-language",
            "accept-ranges",
            "age",
            "allow",
            "authorization",
            "cache-control",
            "connection",
            "content-base",
            "content-encoding",
            "content-language",
            "content-length",
            "content-location",
            "content-md5",
            "content-range",
            "content-type",
            "date",
            "etag",
            "expect",
            "expires",
            "from",
            "host",
            "if-match",
            "if-modified-since",
            "if-none-match",
            "if-range",
            "if-unmodified-since",
            "last-modified",
            "location",
            "max-forwards",
            "pragma",
            "proxy-authenticate",
            "proxy-authorization",
            "range",
            "referer",
            "retry-after",
            "server",
            "te",
            "trailer",
            "transfer-encoding",
            "upgrade",
            "user-agent",
            "vary",
            "via",
            "warning",
            "www-authenticate",
            "method",
            "get",
            "status",
            "200 OK",
            "version",
            "HTTP/1.1",
            "url",
            "public",
            "set-cookie",
            "keep-alive",
            "origin",
        ];
        const TAIL: &str = concat!(
            "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505",
            "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request",
            "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented",
            "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
            "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,",
            "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
            "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
        );
        let mut d = Vec::new();
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    })
}

/// The uncompressed form of a block.
pub fn serialize(block: &HeaderBlock) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(block.0.len() as u32).to_be_bytes());
    for (name, value) in &block.0 {
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

fn format(problem: impl Into<String>) -> HeaderError {
    HeaderError::Format(problem.into())
}

fn take<'a>(raw: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], HeaderError> {
    if raw.len() < n {
        return Err(format(format!("{what} runs past the end of the block")));
    }
    let (head, rest) = raw.split_at(n);
    *raw = rest;
    Ok(head)
}

fn take_u32(raw: &mut &[u8], what: &str) -> Result<usize, HeaderError> {
    let b = take(raw, 4, what)?;
    Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
}

/// Parses an uncompressed block, with the checks Go's SPDY framer makes (lowercase names, no
/// repeated name) plus sane bounds.
pub fn parse(mut raw: &[u8]) -> Result<HeaderBlock, HeaderError> {
    let n = take_u32(&mut raw, "the pair count")?;
    if n > MAX_PAIRS {
        return Err(format(format!("{n} name/value pairs (at most {MAX_PAIRS})")));
    }
    let mut pairs: Vec<(String, String)> = Vec::with_capacity(n);
    for i in 0..n {
        let len = take_u32(&mut raw, "a name length")?;
        let name = take(&mut raw, len, "a name")?;
        if name.is_empty() {
            return Err(format(format!("pair {i} has an empty name")));
        }
        let name = std::str::from_utf8(name).map_err(|_| format(format!("pair {i}: the name is not UTF-8")))?;
        if name.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(format(format!("header name {name:?} is not lowercase")));
        }
        let len = take_u32(&mut raw, "a value length")?;
        let value = take(&mut raw, len, "a value")?;
        let value = std::str::from_utf8(value).map_err(|_| format(format!("the value of {name:?} is not UTF-8")))?;
        if pairs.iter().any(|(n, _)| n == name) {
            return Err(format(format!("header {name:?} appears twice")));
        }
        pairs.push((name.to_string(), value.to_string()));
    }
    if !raw.is_empty() {
        return Err(format(format!("{} bytes after the last pair", raw.len())));
    }
    Ok(HeaderBlock(pairs))
}

/// The receiving side's zlib stream.
pub struct Inflater {
    z: Decompress,
    max_len: usize,
}

impl Inflater {
    /// `max_len`: the most bytes one block may inflate to.
    pub fn new(max_len: usize) -> Self {
        Self {
            z: Decompress::new(true),
            max_len,
        }
    }

    /// Inflates one block (the continuation of this session's stream) and parses it.
    pub fn inflate(&mut self, block: &[u8]) -> Result<HeaderBlock, HeaderError> {
        let raw = self.inflate_raw(block)?;
        parse(&raw)
    }

    fn inflate_raw(&mut self, block: &[u8]) -> Result<Vec<u8>, HeaderError> {
        // One byte past the limit, so that a block of exactly `max_len` bytes still ends with
        // room to spare (how completion is told apart from a full buffer).
        let cap = self.max_len.saturating_add(1);
        let mut out = Vec::with_capacity(block.len().saturating_mul(4).clamp(256, cap.max(256)));
        let mut input = block;
        loop {
            if out.len() == out.capacity() {
                if out.len() > self.max_len {
                    return Err(HeaderError::TooLarge { limit: self.max_len });
                }
                // Double, by at least 256 bytes, never past the cap. The step is computed as
                // min(max(len, 256), room): a clamp(256, room) panics when the room left is
                // under 256 bytes, which a peer picks with the length of its block.
                let room = cap - out.len();
                out.reserve_exact(out.len().max(256).min(room));
            }
            let (before_in, before_out) = (self.z.total_in(), self.z.total_out());
            let result = self.z.decompress_vec(input, &mut out, FlushDecompress::Sync);
            let consumed = (self.z.total_in() - before_in) as usize;
            input = &input[consumed..];
            let produced = self.z.total_out() - before_out;
            match result {
                Ok(Status::StreamEnd) => {
                    return Err(HeaderError::Compression(
                        "the zlib stream ended (peers never end it)".into(),
                    ));
                }
                Ok(_) => {
                    if out.len() > self.max_len {
                        return Err(HeaderError::TooLarge { limit: self.max_len });
                    }
                    // Done once the input is used up and the output had room to spare.
                    if input.is_empty() && out.len() < out.capacity() {
                        return Ok(out);
                    }
                    if consumed == 0 && produced == 0 && out.len() < out.capacity() {
                        return Err(HeaderError::Compression("truncated block".into()));
                    }
                }
                Err(e) if e.needs_dictionary().is_some() => {
                    let want = e.needs_dictionary().unwrap_or_default();
                    let have = self
                        .z
                        .set_dictionary(dictionary())
                        .map_err(|e| HeaderError::Compression(format!("setting the SPDY dictionary: {e}")))?;
                    if have != want {
                        return Err(HeaderError::Compression(format!(
                            "the stream asks for dictionary {want:#010x}, not SPDY/3's {have:#010x}"
                        )));
                    }
                }
                Err(e) => return Err(HeaderError::Compression(e.to_string())),
            }
        }
    }
}

/// The sending side's zlib stream.
pub struct Deflater {
    z: Compress,
}

impl Default for Deflater {
    fn default() -> Self {
        Self::new()
    }
}

impl Deflater {
    pub fn new() -> Self {
        // Best compression and the dictionary, as Go's SPDY framer does.
        let mut z = Compress::new(Compression::best(), true);
        z.set_dictionary(dictionary())
            .expect("a fresh zlib stream takes a dictionary");
        Self { z }
    }

    /// Compresses one block, sync-flushed so the peer can inflate it on its own.
    pub fn deflate(&mut self, block: &HeaderBlock) -> Bytes {
        let raw = serialize(block);
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut input = &raw[..];
        loop {
            if out.len() == out.capacity() {
                out.reserve(256);
            }
            let before = self.z.total_in();
            self.z
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .expect("zlib compression of an in-memory buffer cannot fail");
            input = &input[(self.z.total_in() - before) as usize..];
            if input.is_empty() && out.len() < out.capacity() {
                return Bytes::from(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(pairs: &[(&str, &str)]) -> HeaderBlock {
        HeaderBlock(pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect())
    }

    #[test]
    fn the_dictionary_is_spdy3s() {
        let d = dictionary();
        assert_eq!(d.len(), 1423, "the SPDY/3 dictionary is 1423 bytes");
        assert!(d.starts_with(b"\x00\x00\x00\x07options\x00\x00\x00\x04head"));
        assert!(d.ends_with(b",*,enq=0."));
        // Its Adler-32 is the dictionary id zlib streams primed with it carry.
        let mut z = Compress::new(Compression::best(), true);
        assert_eq!(z.set_dictionary(d).unwrap(), 0xe3c6_a7c2);
    }

    #[test]
    fn blocks_round_trip_through_one_session_stream() {
        let mut tx = Deflater::new();
        let mut rx = Inflater::new(1 << 16);
        let blocks = [
            block(&[("streamtype", "error")]),
            block(&[("streamtype", "stdout"), ("port", "8080"), ("requestid", "0")]),
            block(&[]),
            block(&[("multi", "a\0b")]),
        ];
        for b in &blocks {
            let wire = tx.deflate(b);
            assert_eq!(&rx.inflate(&wire).unwrap(), b);
        }
        assert_eq!(blocks[3].get("multi"), Some("a"));
        assert_eq!(blocks[1].get("port"), Some("8080"));
        assert_eq!(blocks[1].get("nope"), None);
    }

    #[test]
    fn a_block_compressed_without_the_dictionary_is_refused() {
        let mut z = Compress::new(Compression::best(), true);
        z.set_dictionary(b"not the spdy dictionary").unwrap();
        let mut out = Vec::with_capacity(256);
        z.compress_vec(&serialize(&block(&[("a", "b")])), &mut out, FlushCompress::Sync)
            .unwrap();
        let err = Inflater::new(1024).inflate(&out).unwrap_err();
        assert!(
            matches!(err, HeaderError::Compression(ref m) if m.contains("dictionary")),
            "{err}"
        );
        assert!(!err.is_stream_error());
    }

    #[test]
    fn garbage_and_bombs_are_session_errors() {
        let err = Inflater::new(1024).inflate(b"\x00\x01garbage").unwrap_err();
        assert!(matches!(err, HeaderError::Compression(_)), "{err}");
        // 1 MiB of one value inflating from a few KiB.
        let mut tx = Deflater::new();
        let big = tx.deflate(&block(&[("x", &"a".repeat(1 << 20))]));
        assert!(big.len() < 8192);
        let err = Inflater::new(64 * 1024).inflate(&big).unwrap_err();
        assert_eq!(err, HeaderError::TooLarge { limit: 64 * 1024 });
    }

    /// xorshift hex digits: text that compresses about 2:1, so its length tunes the block's.
    fn hex_noise(n: usize, seed: u64) -> String {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b"0123456789abcdef"[(x >> 60) as usize])
            })
            .collect()
    }

    /// A header block compressed to `lengths` bytes on the wire that inflates past four times
    /// its length: the inflater's first buffer (4 × L) then fills just under `max_len`, the
    /// growth step the old code computed with `clamp(256, max_len - len)` had min > max, and
    /// the reader task panicked.
    fn block_landing_under_the_limit(lengths: std::ops::RangeInclusive<usize>) -> Bytes {
        let target = *lengths.start();
        let mut pad = target * 2;
        for _ in 0..10_000 {
            let wire = Deflater::new().deflate(&block(&[("a", &"x".repeat(300_000)), ("b", &hex_noise(pad, 7))]));
            if lengths.contains(&wire.len()) {
                return wire;
            }
            // About two hex digits per compressed byte.
            let diff = target as i64 - wire.len() as i64;
            pad = (pad as i64 + diff.clamp(-512, 512) * 2 + if diff == 0 { 1 } else { 0 }).max(1) as usize;
        }
        panic!("no pad length compresses into {lengths:?}");
    }

    #[test]
    fn a_block_landing_just_under_the_limit_is_refused_not_a_panic() {
        for (lengths, max_len) in [(16_321..=16_383, 64 * 1024), (4033..=4086, 16 * 1024)] {
            let wire = block_landing_under_the_limit(lengths.clone());
            assert!(lengths.contains(&wire.len()));
            let outcome = std::panic::catch_unwind(|| Inflater::new(max_len).inflate(&wire));
            let result = outcome.unwrap_or_else(|panic| {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                panic!("a {}-byte block panicked the inflater: {why}", wire.len())
            });
            assert_eq!(result, Err(HeaderError::TooLarge { limit: max_len }));
        }
    }

    #[test]
    fn contents_that_break_the_protocol_are_stream_errors() {
        let raw_pairs = |pairs: &[(&[u8], &[u8])], count: u32| {
            let mut raw = count.to_be_bytes().to_vec();
            for (n, v) in pairs {
                raw.extend_from_slice(&(n.len() as u32).to_be_bytes());
                raw.extend_from_slice(n);
                raw.extend_from_slice(&(v.len() as u32).to_be_bytes());
                raw.extend_from_slice(v);
            }
            raw
        };
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (raw_pairs(&[(b"Upper", b"x")], 1), "not lowercase"),
            (raw_pairs(&[(b"a", b"1"), (b"a", b"2")], 2), "appears twice"),
            (raw_pairs(&[(b"", b"x")], 1), "empty name"),
            (raw_pairs(&[(b"a", b"1")], 2), "past the end"),
            (raw_pairs(&[(b"a", b"\xff")], 1), "not UTF-8"),
            (raw_pairs(&[], 100_000), "at most 1024"),
            (
                [raw_pairs(&[(b"a", b"1")], 1), b"xx".to_vec()].concat(),
                "after the last pair",
            ),
            (vec![0, 0], "pair count"),
        ];
        for (raw, want) in cases {
            let err = parse(&raw).unwrap_err();
            assert!(
                err.is_stream_error() && err.to_string().contains(want),
                "{err} ≠ {want}"
            );
        }
    }
}
