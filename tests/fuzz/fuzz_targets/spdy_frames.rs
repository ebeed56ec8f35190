//! Fuzzes the SPDY/3.1 frame decoder and header inflater of the kubelet API's streaming
//! endpoints with arbitrary peer bytes; the property is `spdy_codec::check::check` (no panic, the
//! same frames however the bytes are split into reads, every frame re-encodes to itself).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| spdy_codec::check::check(data));
