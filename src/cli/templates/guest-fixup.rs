//! A `guest-fixup` policy: nothing runs in a cloned guest, it goes straight to waiting for its
//! lease. Replace the rule with yours (`Outcome::Run` with an argv for `cocoon vm exec`; the
//! default policy's source is in the vk-cocoon repository, `policies/guest-fixup`); the case
//! table beside this crate pins what it decides.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;

#[cfg(target_arch = "wasm32")]
mod wasm_glue;

// PartialEq lets the rules compare variants (`spec.os == GuestOs::Windows`).
wit_bindgen::generate!({ world: "guest-fixup-policy", path: "wit", additional_derives: [PartialEq] });

use exports::cocoonstack::vk_policy::guest_fixup::{Decision, Facts, Guest, Outcome};

pub struct Policy;

impl Guest for Policy {
    fn decide(facts: Facts) -> Decision {
        decide(&facts)
    }
}

#[cfg(target_arch = "wasm32")]
export!(Policy);

pub fn decide(facts: &Facts) -> Decision {
    Decision {
        outcome: Outcome::None,
        reason: "not-needed".into(),
        message: format!("vm {} needs no guest fixup", facts.spec.vm_name),
    }
}
