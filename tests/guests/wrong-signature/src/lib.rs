//! Hostile test guest: exports `cpu-class-admission` with a `decide` of the wrong type.
#![cfg_attr(target_arch = "wasm32", no_std)]
extern crate alloc;
use vk_policy_support as _;

wit_bindgen::generate!({ world: "wrong-signature", path: "wit" });
use exports::cocoonstack::vk_policy::cpu_class_admission::Guest;

struct Wrong;
impl Guest for Wrong {
    fn decide(input: u32) -> u32 {
        input.wrapping_add(1)
    }
}
#[cfg(target_arch = "wasm32")]
export!(Wrong);
