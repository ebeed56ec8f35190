//! Hostile test guest: never returns from `decide`. The host's epoch deadline must stop it.
#![cfg_attr(target_arch = "wasm32", no_std)]
extern crate alloc;
use vk_policy_support as _;

wit_bindgen::generate!({ world: "cpu-class-admission-policy", path: "../../../wit" });
use exports::cocoonstack::vk_policy::cpu_class_admission::{Decision, Facts, Guest};

struct Spin;
impl Guest for Spin {
    fn decide(_facts: Facts) -> Decision {
        let mut counter: u64 = 0;
        loop {
            counter = core::hint::black_box(counter.wrapping_add(1));
        }
    }
}
#[cfg(target_arch = "wasm32")]
export!(Spin);
