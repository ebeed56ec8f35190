//! A `cpu-class-admission` policy: a pod pinning a snapshot CPU class
//! (`cocoonstack.io/snapshot-cpu-class` in its node selector) runs only on a node of that
//! class. Replace the rule with yours; the case table beside this crate pins what it decides.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;

#[cfg(target_arch = "wasm32")]
mod wasm_glue;

// PartialEq lets the rules compare variants (`spec.os == GuestOs::Windows`).
wit_bindgen::generate!({ world: "cpu-class-admission-policy", path: "wit", additional_derives: [PartialEq] });

use cocoonstack::vk_policy::types::{EventReason, Refusal, RefusalKind};
use exports::cocoonstack::vk_policy::cpu_class_admission::{Decision, Facts, Guest, Verdict};

pub struct Policy;

impl Guest for Policy {
    fn decide(facts: Facts) -> Decision {
        decide(&facts)
    }
}

#[cfg(target_arch = "wasm32")]
export!(Policy);

pub fn decide(facts: &Facts) -> Decision {
    let pod = &facts.pod;
    let pinned = pod
        .node_selector
        .iter()
        .find(|kv| kv.key == "cocoonstack.io/snapshot-cpu-class")
        .map(|kv| kv.value.as_str())
        .unwrap_or("");
    if pinned.is_empty() || pinned == facts.node_class {
        return Decision {
            verdict: Verdict::Admit,
            reason: "admitted".into(),
            message: format!("pod {}/{} may run on node {}", pod.namespace, pod.name, facts.node_name),
        };
    }
    Decision {
        verdict: Verdict::Reject(Refusal {
            kind: RefusalKind::Permanent,
            event: EventReason::SnapshotCpuClassMismatch,
        }),
        reason: "class-mismatch".into(),
        message: format!(
            "pod {}/{} requires CPU class {pinned:?} but node {} provides {:?}",
            pod.namespace, pod.name, facts.node_name, facts.node_class
        ),
    }
}
