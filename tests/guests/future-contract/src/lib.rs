//! Test guest: exports `cpu-class-admission@0.9.0`, a version the daemon does not speak.
#![cfg_attr(target_arch = "wasm32", no_std)]
extern crate alloc;
use vk_policy_support as _;

wit_bindgen::generate!({ world: "future-contract", path: "wit" });
use exports::cocoonstack::vk_policy::cpu_class_admission::{Facts, Guest};

struct Future;
impl Guest for Future {
    fn decide(facts: Facts) -> bool {
        !facts.node_name.is_empty()
    }
}
#[cfg(target_arch = "wasm32")]
export!(Future);
