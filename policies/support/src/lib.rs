//! Shared helpers for the default vk-cocoon policy guests.
//!
//! Everything here is pure and `no_std` (with `alloc`), so the same code runs inside the
//! WASI-free policy components and under a native `cargo test`. On `wasm32` the crate also
//! supplies the runtime glue a `no_std` component needs: a global allocator (a bump allocator,
//! since each instance serves one decision), a panic handler that traps (the host maps the trap
//! to a fail-safe decision), and the C memory routines and `cabi_realloc` export.

#![cfg_attr(not(test), no_std)]

extern crate alloc;

pub mod naming;
pub mod path;
pub mod quantity;
pub mod role;

#[cfg(target_arch = "wasm32")]
mod wasm_glue;

/// The value of `key` in a list of metadata pairs, if present.
pub fn lookup<'a, I>(pairs: I, key: &str) -> Option<&'a str>
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    pairs.into_iter().find(|(k, _)| *k == key).map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_finds_the_first_matching_key() {
        let pairs = [("a", "1"), ("b", "2"), ("a", "3")];
        assert_eq!(lookup(pairs.iter().copied(), "a"), Some("1"));
        assert_eq!(lookup(pairs.iter().copied(), "c"), None);
    }
}
