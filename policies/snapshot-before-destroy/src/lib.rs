//! Default `snapshot-before-destroy` policy: before DeletePod destroys a VM, save and push it to
//! `<vm>:latest` unless the pod's snapshot policy says otherwise (`never`; `main-only` for any role
//! but the main agent). Only a running VM is saved, never an unmanaged pod's (its VM is the
//! operator's: `src/provider/DECISIONS.md` row 8) or a macOS guest's (no live snapshot). The role
//! comes from the pod's CocoonSet owner and its exact VM name, in either naming generation (row 9).

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;

// Natively the bindings also derive serde, so the benchmark can hand this crate the host's
// facts (same JSON shape: both sides are generated from the same WIT).
#[cfg(target_arch = "wasm32")]
wit_bindgen::generate!({ world: "snapshot-before-destroy-policy", path: "../../wit", additional_derives: [PartialEq] });
#[cfg(not(target_arch = "wasm32"))]
wit_bindgen::generate!({
    world: "snapshot-before-destroy-policy",
    path: "../../wit",
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});

use cocoonstack::vk_policy::types::{GuestOs, SnapshotPolicy};
pub use exports::cocoonstack::vk_policy::snapshot_before_destroy::{Decision, Facts, Outcome, SnapshotTarget};
use vk_policy_support::naming::DEFAULT_SNAPSHOT_TAG;
use vk_policy_support::role::{Role, role_for_pod};

pub struct Policy;

impl exports::cocoonstack::vk_policy::snapshot_before_destroy::Guest for Policy {
    fn decide(facts: Facts) -> Decision {
        decide(&facts)
    }
}

// Component exports exist only in the wasm build (export names contain `:`, which native
// linkers reject); natively the crate is a plain library for tests and benchmarks.
#[cfg(target_arch = "wasm32")]
export!(Policy);

/// The snapshot table, first matching row wins.
pub fn decide(facts: &Facts) -> Decision {
    let spec = &facts.spec;
    let vm = spec.vm_name.as_str();
    if !spec.managed {
        return skip(
            "unmanaged",
            format!("vm {vm} is not managed by vk-cocoon: its state is the operator's"),
        );
    }
    if spec.os == GuestOs::Macos {
        return skip("macos", format!("vm {vm} is a macOS guest: it has no live snapshot"));
    }
    if vm.is_empty() {
        return skip("no-vm-name", String::from("the pod names no VM: nothing to snapshot"));
    }
    match &spec.snapshot_policy {
        SnapshotPolicy::Never => return skip("policy-never", format!("snapshot policy of vm {vm} is never")),
        SnapshotPolicy::MainOnly => {
            let owner = cocoonset_owner(facts);
            let role = role_for_pod(&facts.pod.namespace, owner, vm);
            if role != Role::Main {
                return skip(
                    "not-main-agent",
                    format!(
                        "snapshot policy of vm {vm} is main-only and its role is {}",
                        role.as_str()
                    ),
                );
            }
        }
        // An unknown policy preserves state, as `always` does (cocoon-common's rule).
        SnapshotPolicy::Always | SnapshotPolicy::Unknown(_) => {}
    }
    if !facts.pusher_configured {
        return skip(
            "no-registry",
            format!("no registry is configured: vm {vm} is destroyed without a snapshot"),
        );
    }
    if !facts.vm_running {
        return skip(
            "vm-not-running",
            format!("vm {vm} is not running: there is no live state to save"),
        );
    }
    Decision {
        outcome: Outcome::Snapshot(SnapshotTarget {
            repository: vm.into(),
            tag: DEFAULT_SNAPSHOT_TAG.into(),
            base_image: spec.image.clone(),
        }),
        reason: "snapshot".into(),
        message: format!("save vm {vm} and push it to {vm}:{DEFAULT_SNAPSHOT_TAG} before destroying it"),
    }
}

/// Name of the pod's first `CocoonSet` owner, "" when it has none.
fn cocoonset_owner(facts: &Facts) -> &str {
    facts
        .pod
        .owner_references
        .iter()
        .find(|owner| owner.kind == "CocoonSet")
        .map_or("", |owner| owner.name.as_str())
}

fn skip(reason: &str, message: String) -> Decision {
    Decision {
        outcome: Outcome::Skip,
        reason: reason.into(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cocoonstack::vk_policy::types::{
        Backend, BootMode, OwnerReference, PodFacts, PodPhase, ReadinessProbe, VmSpec,
    };
    use vk_policy_support::role::vm_name_for_deployment;

    fn facts(policy: SnapshotPolicy, vm_name: &str, owner: Option<&str>) -> Facts {
        let owner_references = owner
            .map(|name| OwnerReference {
                api_version: "cocoonset.cocoonstack.io/v1".into(),
                kind: "CocoonSet".into(),
                name: name.into(),
                uid: "o".into(),
                controller: true,
            })
            .into_iter()
            .collect();
        Facts {
            pod: PodFacts {
                namespace: "ns".into(),
                name: "p".into(),
                uid: "u".into(),
                phase: PodPhase::Running,
                annotations: vec![],
                labels: vec![],
                node_selector: vec![],
                owner_references,
            },
            spec: VmSpec {
                vm_name: vm_name.into(),
                image: "base:v1".into(),
                mode: BootMode::Clone,
                os: GuestOs::Linux,
                storage: String::new(),
                network: String::new(),
                snapshot_policy: policy,
                fork_from: String::new(),
                clone_from_dir: String::new(),
                managed: true,
                force_pull: false,
                no_direct_io: false,
                conn_type: String::new(),
                backend: Backend::Unspecified,
                probe: ReadinessProbe::Icmp,
                restore_from_hibernate: false,
                hibernate: false,
                keep_snapshot_on_delete: false,
            },
            pusher_configured: true,
            vm_running: true,
        }
    }

    fn reason(f: &Facts) -> String {
        decide(f).reason
    }

    #[test]
    fn policy_table() {
        let main = vm_name_for_deployment("ns", "demo", 0);
        let sub = vm_name_for_deployment("ns", "demo", 1);
        assert_eq!(
            reason(&facts(SnapshotPolicy::Never, &main, Some("demo"))),
            "policy-never"
        );
        assert_eq!(
            reason(&facts(SnapshotPolicy::MainOnly, &main, Some("demo"))),
            "snapshot"
        );
        assert_eq!(
            reason(&facts(SnapshotPolicy::MainOnly, &sub, Some("demo"))),
            "not-main-agent"
        );
        assert_eq!(
            reason(&facts(SnapshotPolicy::MainOnly, "toolbox-0", None)),
            "not-main-agent"
        );
        for policy in [SnapshotPolicy::Always, SnapshotPolicy::Unknown("sometimes".into())] {
            assert_eq!(
                reason(&facts(policy.clone(), "toolbox-0", None)),
                "snapshot",
                "{policy:?}"
            );
        }
    }

    #[test]
    fn snapshot_goes_to_latest_with_the_base_image() {
        let d = decide(&facts(SnapshotPolicy::Always, "vm1", None));
        let Outcome::Snapshot(target) = d.outcome else {
            panic!("expected a snapshot")
        };
        assert_eq!(
            (
                target.repository.as_str(),
                target.tag.as_str(),
                target.base_image.as_str()
            ),
            ("vm1", "latest", "base:v1")
        );
    }

    #[test]
    fn no_registry_stopped_vm_unmanaged_and_macos_skip() {
        let mut f = facts(SnapshotPolicy::Always, "vm1", None);
        f.pusher_configured = false;
        assert_eq!(reason(&f), "no-registry");
        let mut f = facts(SnapshotPolicy::Always, "vm1", None);
        f.vm_running = false;
        assert_eq!(reason(&f), "vm-not-running");
        let mut f = facts(SnapshotPolicy::Always, "vm1", None);
        f.spec.managed = false;
        assert_eq!(reason(&f), "unmanaged");
        let mut f = facts(SnapshotPolicy::Always, "vm1", None);
        f.spec.os = GuestOs::Macos;
        assert_eq!(reason(&f), "macos");
    }
}
