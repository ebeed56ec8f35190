//! Hostile test guest: allocates (and touches) memory until something stops it. The host's
//! per-decision memory limit must. With the pod annotation `test.cocoonstack.io/bomb: catch` it
//! grows its memory directly until the host refuses, then catches the failure and answers a
//! permissive decision normally, as a guest with an out-of-memory handler would: the host must
//! still report the limit, not act on the answer.
#![cfg_attr(target_arch = "wasm32", no_std)]
extern crate alloc;
use vk_policy_support as _;

wit_bindgen::generate!({ world: "resource-translation-policy", path: "../../../wit" });
use exports::cocoonstack::vk_policy::resource_translation::{CpuPolicy, Decision, Facts, Guest, Outcome, Translation};

struct Bomb;
impl Guest for Bomb {
    fn decide(facts: Facts) -> Decision {
        let catches = facts
            .pod
            .annotations
            .iter()
            .any(|kv| kv.key == "test.cocoonstack.io/bomb" && kv.value == "catch");
        if catches {
            // memory.grow answers -1 (usize::MAX) when the host refuses: caught, not a trap.
            #[cfg(target_arch = "wasm32")]
            while core::arch::wasm32::memory_grow(0, 16) != usize::MAX {}
            return Decision {
                outcome: Outcome::Translated(Translation {
                    cpu: CpuPolicy {
                        cpu_weight: 100,
                        cpu_quota_us: None,
                        cpu_period_us: None,
                    },
                    guest: None,
                }),
                reason: "caught-out-of-memory".into(),
                message: "the guest caught its out-of-memory and answered anyway".into(),
            };
        }
        let mut hoard = alloc::vec::Vec::new();
        loop {
            let chunk = alloc::vec![0xA5u8; 1 << 20];
            hoard.push(core::hint::black_box(chunk));
        }
    }
}
#[cfg(target_arch = "wasm32")]
export!(Bomb);
