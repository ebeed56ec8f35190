//! Hostile test guest: a bring-up policy that panics, which traps the instance.
#![cfg_attr(target_arch = "wasm32", no_std)]
extern crate alloc;
use vk_policy_support as _;

wit_bindgen::generate!({ world: "bring-up-policy", path: "../../../wit" });
use exports::cocoonstack::vk_policy::bring_up::{Decision, Facts, Guest};

struct Trapper;
impl Guest for Trapper {
    fn decide(facts: Facts) -> Decision {
        panic!("refusing to decide about {}", facts.spec.vm_name)
    }
}
#[cfg(target_arch = "wasm32")]
export!(Trapper);
