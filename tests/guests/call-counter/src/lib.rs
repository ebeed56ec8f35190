//! Test guest: counts, in instance state, the decisions this instance has served and reports the
//! count in its message. A host that reused an instance would show a count above one.
#![cfg_attr(target_arch = "wasm32", no_std)]
extern crate alloc;
use core::sync::atomic::{AtomicU32, Ordering};
use vk_policy_support as _;

wit_bindgen::generate!({ world: "cpu-class-admission-policy", path: "../../../wit" });
use exports::cocoonstack::vk_policy::cpu_class_admission::{Decision, Facts, Guest, Verdict};

static SERVED: AtomicU32 = AtomicU32::new(0);

struct Counter;
impl Guest for Counter {
    fn decide(_facts: Facts) -> Decision {
        let served = SERVED.fetch_add(1, Ordering::Relaxed) + 1;
        Decision {
            verdict: Verdict::Admit,
            reason: "counted".into(),
            message: alloc::format!("decision {served} of this instance"),
        }
    }
}
#[cfg(target_arch = "wasm32")]
export!(Counter);
