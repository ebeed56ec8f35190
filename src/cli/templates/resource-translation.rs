//! A `resource-translation` policy: every VM gets cgroup v2's default CPU weight (100) and no
//! CPU quota; on the run path cocoon's own defaults size the guest. Replace the rule with yours
//! (the default policy converts the pod's requests and limits as the kubelet does); the case
//! table beside this crate pins what it decides.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

#[cfg(target_arch = "wasm32")]
mod wasm_glue;

// PartialEq lets the rules compare variants (`spec.os == GuestOs::Windows`).
wit_bindgen::generate!({ world: "resource-translation-policy", path: "wit", additional_derives: [PartialEq] });

use exports::cocoonstack::vk_policy::resource_translation::{
    BootPath, CpuPolicy, Decision, Facts, Guest, GuestResources, Outcome, Translation,
};

pub struct Policy;

impl Guest for Policy {
    fn decide(facts: Facts) -> Decision {
        decide(&facts)
    }
}

#[cfg(target_arch = "wasm32")]
export!(Policy);

pub fn decide(facts: &Facts) -> Decision {
    let guest = match facts.path {
        BootPath::Clone => None,
        BootPath::Run => Some(GuestResources {
            vcpus: None,
            memory_bytes: None,
            storage_bytes: None,
        }),
    };
    Decision {
        outcome: Outcome::Translated(Translation {
            cpu: CpuPolicy {
                cpu_weight: 100,
                cpu_quota_us: None,
                cpu_period_us: None,
            },
            guest,
        }),
        reason: "fixed-weight".into(),
        message: "cpu-weight 100, no quota".into(),
    }
}
