//! The policy components, built for `wasm32-wasip2` by this crate's build script.
//!
//! [`defaults`] holds the five default policies the daemon embeds. With the `hostile` feature,
//! [`hostile`] holds the guests the test suite uses to prove the sandbox: they are never part of
//! a daemon build.

include!(concat!(env!("OUT_DIR"), "/artifacts.rs"));
