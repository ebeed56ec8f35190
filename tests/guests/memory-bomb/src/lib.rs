//! Hostile test guest: allocates (and touches) memory until something stops it. The host's
//! per-decision memory limit must.
#![cfg_attr(target_arch = "wasm32", no_std)]
extern crate alloc;
use vk_policy_support as _;

wit_bindgen::generate!({ world: "resource-translation-policy", path: "../../../wit" });
use exports::cocoonstack::vk_policy::resource_translation::{Decision, Facts, Guest};

struct Bomb;
impl Guest for Bomb {
    fn decide(_facts: Facts) -> Decision {
        let mut hoard = alloc::vec::Vec::new();
        loop {
            let chunk = alloc::vec![0xA5u8; 1 << 20];
            hoard.push(core::hint::black_box(chunk));
        }
    }
}
#[cfg(target_arch = "wasm32")]
export!(Bomb);
