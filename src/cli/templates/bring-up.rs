//! A `bring-up` policy: adopt a VM that already runs here, boot `mode=run` pods from their
//! image, and refuse the rest for the operator to see. Replace the rules with yours (the
//! default policy's source is in the vk-cocoon repository, `policies/bring-up`); the case
//! table beside this crate pins what it decides.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;

#[cfg(target_arch = "wasm32")]
mod wasm_glue;

// PartialEq lets the rules compare variants (`spec.os == GuestOs::Windows`).
wit_bindgen::generate!({ world: "bring-up-policy", path: "wit", additional_derives: [PartialEq] });

use cocoonstack::vk_policy::types::{BootMode, EventReason, GuestOs, Refusal, RefusalKind};
use exports::cocoonstack::vk_policy::bring_up::{Decision, Facts, Guest, Outcome, Plan, RunPlan};

pub struct Policy;

impl Guest for Policy {
    fn decide(facts: Facts) -> Decision {
        decide(&facts)
    }
}

#[cfg(target_arch = "wasm32")]
export!(Policy);

pub fn decide(facts: &Facts) -> Decision {
    let spec = &facts.spec;
    let vm = spec.vm_name.as_str();
    if facts.vm_exists_locally {
        return Decision {
            outcome: Outcome::Proceed(Plan::AdoptExisting(vm.into())),
            reason: "adopt-existing".into(),
            message: format!("vm {vm} already exists on this node: adopting it"),
        };
    }
    if spec.managed && spec.mode == BootMode::Run && !spec.image.is_empty() {
        return Decision {
            outcome: Outcome::Proceed(Plan::Run(RunPlan {
                vm_name: vm.into(),
                image: spec.image.clone(),
                force_pull: spec.force_pull,
                network: spec.network.clone(),
                backend: spec.backend.clone(),
                windows: spec.os == GuestOs::Windows,
                no_direct_io: spec.no_direct_io,
            })),
            reason: "run".into(),
            message: format!("booting vm {vm} from image {}", spec.image),
        };
    }
    // `kind` decides the retry: Permanent = the pod must change; NeedsOperator = something
    // outside the pod (re-checked slowly); RetryLater = it may clear by itself (backoff).
    Decision {
        outcome: Outcome::Refuse(Refusal {
            kind: RefusalKind::Permanent,
            event: EventReason::CreateBringUpFailed,
        }),
        reason: "not-a-run-pod".into(),
        message: format!("this policy only boots managed mode=run pods with an image; vm {vm} is not one"),
    }
}
