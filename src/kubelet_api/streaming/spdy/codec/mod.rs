//! The SPDY/3.1 wire format, pure and synchronous: [`frame`] (frame header, control frames,
//! DATA, an incremental decoder with limits) and [`headers`] (the zlib-compressed header blocks
//! with the SPDY/3 dictionary). No I/O, no tokio: the session ([`super::session`]) drives it, and
//! the fuzz target (`tests/fuzz`) compiles these files on their own (they use only `bytes`,
//! `flate2` and `thiserror`), with [`check`] as the property both it and the corpus replay test
//! assert.

pub mod check;
pub mod frame;
pub mod headers;

pub use frame::{Decoder, Frame, FrameError, Limits, Setting};
pub use headers::{Deflater, HeaderBlock, HeaderError, Inflater};
