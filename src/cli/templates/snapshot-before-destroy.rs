//! A `snapshot-before-destroy` policy: on DeletePod, snapshot every running managed VM to
//! `<vm>:latest`, skip the rest. Replace the rule with yours; the case table beside this crate
//! pins what it decides.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;

#[cfg(target_arch = "wasm32")]
mod wasm_glue;

// PartialEq lets the rules compare variants (`spec.os == GuestOs::Windows`).
wit_bindgen::generate!({ world: "snapshot-before-destroy-policy", path: "wit", additional_derives: [PartialEq] });

use exports::cocoonstack::vk_policy::snapshot_before_destroy::{Decision, Facts, Guest, Outcome, SnapshotTarget};

pub struct Policy;

impl Guest for Policy {
    fn decide(facts: Facts) -> Decision {
        decide(&facts)
    }
}

#[cfg(target_arch = "wasm32")]
export!(Policy);

pub fn decide(facts: &Facts) -> Decision {
    let vm = facts.spec.vm_name.as_str();
    if !facts.spec.managed || vm.is_empty() || !facts.pusher_configured || !facts.vm_running {
        return Decision {
            outcome: Outcome::Skip,
            reason: "nothing-to-save".into(),
            message: format!("vm {vm} is destroyed without a snapshot (unmanaged, unnamed, stopped or no registry)"),
        };
    }
    Decision {
        outcome: Outcome::Snapshot(SnapshotTarget {
            repository: vm.into(),
            tag: "latest".into(),
            base_image: facts.spec.image.clone(),
        }),
        reason: "snapshot".into(),
        message: format!("save vm {vm} and push it to {vm}:latest before destroying it"),
    }
}
