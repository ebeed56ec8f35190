//! Fuzzes the SPDY/3.1 frame decoder and header inflater of the kubelet API's streaming
//! endpoints with arbitrary peer bytes; the property is `codec::check::check` (no panic, the
//! same frames however the bytes are split into reads, every frame re-encodes to itself).
#![no_main]

#[allow(dead_code, unused_imports)]
#[path = "../../../src/kubelet_api/streaming/spdy/codec/mod.rs"]
mod codec;

libfuzzer_sys::fuzz_target!(|data: &[u8]| codec::check::check(data));
