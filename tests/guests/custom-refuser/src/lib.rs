//! Test guest: a custom bring-up policy with its own gate. A pod annotated
//! `test.cocoonstack.io/gate: retry-later | permanent | needs-operator` is refused with that
//! refusal kind and a reason token no default policy uses; any other pod is cloned from its
//! image (or adopted when its VM exists). The host must retry exactly as the kind says.
#![cfg_attr(target_arch = "wasm32", no_std)]
extern crate alloc;

use alloc::format;

wit_bindgen::generate!({ world: "bring-up-policy", path: "../../../wit" });
use cocoonstack::vk_policy::types::{EventReason, Refusal, RefusalKind};
use exports::cocoonstack::vk_policy::bring_up::{CloneOptions, ClonePlan, Decision, Facts, Guest, Outcome, Plan};
use vk_policy_support::naming::{local_snapshot_name, parse_ref};

const GATE: &str = "test.cocoonstack.io/gate";

struct Gate;
impl Guest for Gate {
    fn decide(facts: Facts) -> Decision {
        let spec = &facts.spec;
        let gate = facts
            .pod
            .annotations
            .iter()
            .find(|kv| kv.key == GATE)
            .map(|kv| kv.value.as_str());
        let kind = match gate {
            Some("retry-later") => Some(RefusalKind::RetryLater),
            Some("permanent") => Some(RefusalKind::Permanent),
            Some("needs-operator") => Some(RefusalKind::NeedsOperator),
            _ => None,
        };
        if let Some(kind) = kind {
            return Decision {
                outcome: Outcome::Refuse(Refusal {
                    kind,
                    event: EventReason::CreateBringUpFailed,
                }),
                reason: "gate-closed-by-custom-rule".into(),
                message: format!("the custom gate holds vm {} ({GATE} is set)", spec.vm_name),
            };
        }
        if facts.vm_exists_locally {
            return Decision {
                outcome: Outcome::Proceed(Plan::AdoptExisting(spec.vm_name.clone())),
                reason: "custom-adopt".into(),
                message: format!("adopting vm {}", spec.vm_name),
            };
        }
        let (repo, tag) = parse_ref(&spec.image);
        Decision {
            outcome: Outcome::Proceed(Plan::Clone(ClonePlan {
                options: CloneOptions {
                    vm_name: spec.vm_name.clone(),
                    network: spec.network.clone(),
                    no_direct_io: spec.no_direct_io,
                    backend: spec.backend.clone(),
                    restore_mode: Some(facts.node_restore_mode),
                    drop_own_fork_snapshot: true,
                },
                local_snapshot: local_snapshot_name(repo, tag),
                repository: repo.into(),
                tag: tag.into(),
                expected_backend: spec.backend.clone(),
            })),
            reason: "custom-clone".into(),
            message: format!(
                "the custom gate is open: cloning vm {} from {}",
                spec.vm_name, spec.image
            ),
        }
    }
}
#[cfg(target_arch = "wasm32")]
export!(Gate);
