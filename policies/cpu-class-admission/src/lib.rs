//! Default `cpu-class-admission` policy (behaviour spec §4c): a pod that pins a snapshot CPU
//! class through its node selector runs only on a node of exactly that class, so a memory
//! snapshot never resumes on a foreign guest CPU ABI. Terminal pods are exempt (they have no VM
//! to resume, and must not wedge node registration).

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;

wit_bindgen::generate!({ world: "cpu-class-admission-policy", path: "../../wit" });

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
    if pod.phase == "Succeeded" || pod.phase == "Failed" {
        return admit(
            "terminal-pod",
            format!("pod {}/{} is {}: no VM to resume", pod.namespace, pod.name, pod.phase),
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
        return reject(
            "node-unclassified",
            format!("{who} but node {} is unclassified", facts.node_name),
        );
    }
    if facts.node_class != required {
        return reject(
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

fn reject(reason: &str, message: String) -> Decision {
    Decision {
        verdict: Verdict::Reject,
        reason: reason.into(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cocoonstack::vk_policy::types::{KeyValue, PodFacts};

    fn facts(phase: &str, required: &str, node_class: &str) -> Facts {
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
                phase: phase.into(),
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
        let rows = [
            ("Succeeded", "x", "", Verdict::Admit, "terminal-pod"),
            ("Failed", "x", "y", Verdict::Admit, "terminal-pod"),
            ("Running", "", "y", Verdict::Admit, "unclassified-pod"),
            ("Pending", "", "", Verdict::Admit, "unclassified-pod"),
            ("Running", "x", "", Verdict::Reject, "node-unclassified"),
            ("", "x", "y", Verdict::Reject, "class-mismatch"),
            ("Running", "x", "x", Verdict::Admit, "class-match"),
        ];
        for (phase, required, node, verdict, reason) in rows {
            let d = decide(&facts(phase, required, node));
            assert_eq!(
                (d.verdict, d.reason.as_str()),
                (verdict, reason),
                "{phase} {required} {node}"
            );
        }
    }

    #[test]
    fn rejections_name_the_pod_and_the_classes() {
        let d = decide(&facts("Running", "x", "y"));
        assert_eq!(
            d.message,
            "pod ns/p requires snapshot compatibility class \"x\" but node n1 provides \"y\""
        );
        let d = decide(&facts("Running", "x", ""));
        assert_eq!(
            d.message,
            "pod ns/p requires snapshot compatibility class \"x\" but node n1 is unclassified"
        );
    }
}
