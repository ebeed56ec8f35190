//! Default `cpu-class-admission` policy: a pod that pins a snapshot CPU
//! class through its node selector runs only on a node of exactly that class, so a memory
//! snapshot never resumes on a foreign guest CPU ABI. Terminal pods are exempt (they have no VM
//! to resume, and must not wedge node registration).

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;

// Natively the bindings also derive serde, so the benchmark can hand this crate the host's
// facts (same JSON shape: both sides are generated from the same WIT).
#[cfg(target_arch = "wasm32")]
wit_bindgen::generate!({ world: "cpu-class-admission-policy", path: "../../wit", additional_derives: [PartialEq] });
#[cfg(not(target_arch = "wasm32"))]
wit_bindgen::generate!({
    world: "cpu-class-admission-policy",
    path: "../../wit",
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});

use cocoonstack::vk_policy::types::{EventReason, PodPhase, Refusal, RefusalKind};
pub use exports::cocoonstack::vk_policy::cpu_class_admission::{AdmissionContext, Decision, Facts, Verdict};
use vk_policy_support::lookup;

/// Node-selector key through which the operator pins a pod's snapshot CPU class.
pub const CPU_CLASS_SELECTOR: &str = "cocoonstack.io/snapshot-cpu-class";

pub struct Policy;

impl exports::cocoonstack::vk_policy::cpu_class_admission::Guest for Policy {
    fn decide(facts: Facts) -> Decision {
        decide(&facts)
    }
}

// Component exports exist only in the wasm build (export names contain `:`, which native
// linkers reject); natively the crate is a plain library for tests and benchmarks.
#[cfg(target_arch = "wasm32")]
export!(Policy);

/// The admission table, first matching row wins.
pub fn decide(facts: &Facts) -> Decision {
    let pod = &facts.pod;
    if let PodPhase::Succeeded | PodPhase::Failed = pod.phase {
        let phase = if pod.phase == PodPhase::Succeeded {
            "Succeeded"
        } else {
            "Failed"
        };
        return admit(
            "terminal-pod",
            format!("pod {}/{} is {phase}: no VM to resume", pod.namespace, pod.name),
        );
    }
    let selectors = pod.node_selector.iter().map(|kv| (kv.key.as_str(), kv.value.as_str()));
    let required = lookup(selectors, CPU_CLASS_SELECTOR).unwrap_or("");
    if required.is_empty() {
        return admit(
            "unclassified-pod",
            format!("pod {}/{} pins no snapshot CPU class", pod.namespace, pod.name),
        );
    }
    let who = format!(
        "pod {}/{} requires snapshot compatibility class \"{}\"",
        pod.namespace, pod.name, required
    );
    if facts.node_class.is_empty() {
        // The node can be classified (VK_SNAPSHOT_CPU_CLASS): the pod waits for the operator.
        return reject(
            RefusalKind::NeedsOperator,
            "node-unclassified",
            format!(
                "{who} but node {} is unclassified; set VK_SNAPSHOT_CPU_CLASS on the node if it provides that class",
                facts.node_name
            ),
        );
    }
    if facts.node_class != required {
        return reject(
            RefusalKind::Permanent,
            "class-mismatch",
            format!("{who} but node {} provides \"{}\"", facts.node_name, facts.node_class),
        );
    }
    admit("class-match", format!("{who} and node {} provides it", facts.node_name))
}

fn admit(reason: &str, message: String) -> Decision {
    Decision {
        verdict: Verdict::Admit,
        reason: reason.into(),
        message,
    }
}

fn reject(kind: RefusalKind, reason: &str, message: String) -> Decision {
    Decision {
        verdict: Verdict::Reject(Refusal {
            kind,
            event: EventReason::SnapshotCpuClassMismatch,
        }),
        reason: reason.into(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cocoonstack::vk_policy::types::{KeyValue, PodFacts};

    fn facts(phase: PodPhase, required: &str, node_class: &str) -> Facts {
        let node_selector = if required.is_empty() {
            vec![]
        } else {
            vec![KeyValue {
                key: CPU_CLASS_SELECTOR.into(),
                value: required.into(),
            }]
        };
        Facts {
            pod: PodFacts {
                namespace: "ns".into(),
                name: "p".into(),
                uid: "u".into(),
                phase,
                annotations: vec![],
                labels: vec![],
                node_selector,
                owner_references: vec![],
            },
            context: AdmissionContext::Create,
            node_name: "n1".into(),
            node_class: node_class.into(),
        }
    }

    #[test]
    fn every_row_of_the_table() {
        let reject = |kind| {
            Verdict::Reject(Refusal {
                kind,
                event: EventReason::SnapshotCpuClassMismatch,
            })
        };
        let rows = [
            (PodPhase::Succeeded, "x", "", Verdict::Admit, "terminal-pod"),
            (PodPhase::Failed, "x", "y", Verdict::Admit, "terminal-pod"),
            (PodPhase::Running, "", "y", Verdict::Admit, "unclassified-pod"),
            (PodPhase::Pending, "", "", Verdict::Admit, "unclassified-pod"),
            (
                PodPhase::Running,
                "x",
                "",
                reject(RefusalKind::NeedsOperator),
                "node-unclassified",
            ),
            (
                PodPhase::Unset,
                "x",
                "y",
                reject(RefusalKind::Permanent),
                "class-mismatch",
            ),
            (PodPhase::Running, "x", "x", Verdict::Admit, "class-match"),
        ];
        for (phase, required, node, verdict, reason) in rows {
            let d = decide(&facts(phase, required, node));
            assert_eq!(
                (&d.verdict, d.reason.as_str()),
                (&verdict, reason),
                "{phase:?} {required} {node}"
            );
        }
    }

    #[test]
    fn rejections_name_the_pod_and_the_classes() {
        let d = decide(&facts(PodPhase::Running, "x", "y"));
        assert_eq!(
            d.message,
            "pod ns/p requires snapshot compatibility class \"x\" but node n1 provides \"y\""
        );
        let d = decide(&facts(PodPhase::Running, "x", ""));
        assert!(
            d.message
                .starts_with("pod ns/p requires snapshot compatibility class \"x\" but node n1 is unclassified"),
            "{}",
            d.message
        );
    }
}
