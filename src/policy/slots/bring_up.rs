//! Slot `bring-up`: how does CreatePod (or a wake) bring the pod's VM up?

use wasmtime::Store;

use super::super::contract::bring_up::{
    CloneFromDirPlan, CloneOptions, ClonePlan, Decision, EvidenceSource, Facts, FoundEvidence, HibernateEvidence,
    Outcome, Plan, Pre, RestorePlan, RunPlan, UnmanagedAdoption, World,
};
use super::super::contract::types::{Backend, EventReason, Holder, Refusal, RefusalKind, RestoreMode};
use super::super::contract::v0_1::bring_up as v0_1;
use super::super::contract::v0_2::bring_up as v0_2;
use super::super::sandbox::Sandbox;
use super::{POLICY_FAILED, PodInput, PolicySlot, Slot, Summary, legacy, world_pre};
use crate::model::RuntimeAnnotations;

use v0_1::exports::cocoonstack::vk_policy::bring_up as old;

pub struct BringUp;

world_pre! {
    Pre<Sandbox> => World,
    v0_1::BringUpPolicyPre<Sandbox> => v0_1::BringUpPolicy,
    v0_2::BringUpPolicyPre<Sandbox> => v0_2::BringUpPolicy,
}

impl PolicySlot for BringUp {
    const SLOT: Slot = Slot::BringUp;
    const NAME: &'static str = "bring-up";
    const FAIL_SAFE_RULE: &'static str = "refuse the bring-up: no VM boots (retried later)";

    type Facts = Facts;
    type Decision = Decision;
    type Pre = Pre<Sandbox>;
    type V0_1Pre = v0_1::BringUpPolicyPre<Sandbox>;
    type V0_2Pre = v0_2::BringUpPolicyPre<Sandbox>;

    fn default_component() -> &'static [u8] {
        policy_artifacts::defaults::BRING_UP
    }

    fn call(world: &World, store: &mut Store<Sandbox>, facts: &Facts) -> wasmtime::Result<Decision> {
        world.cocoonstack_vk_policy_bring_up().call_decide(store, facts)
    }

    fn call_v0_1(
        world: &v0_1::BringUpPolicy,
        store: &mut Store<Sandbox>,
        facts: &Facts,
    ) -> wasmtime::Result<Result<Decision, String>> {
        let d = world
            .cocoonstack_vk_policy_bring_up()
            .call_decide(store, &facts_down(facts))?;
        Ok(Ok(within_namespace(facts, decision_up(d))))
    }

    fn call_v0_2(
        world: &v0_2::BringUpPolicy,
        store: &mut Store<Sandbox>,
        facts: &Facts,
    ) -> wasmtime::Result<Result<Decision, String>> {
        let d = world
            .cocoonstack_vk_policy_bring_up()
            .call_decide(store, &legacy::down(facts)?)?;
        Ok(legacy::up(&d).map(|d| within_namespace(facts, d)))
    }

    fn fail_safe(_facts: &Facts, message: String) -> Decision {
        Decision {
            outcome: Outcome::Refuse(Refusal {
                kind: RefusalKind::RetryLater,
                event: EventReason::BringUpPolicyFailed,
            }),
            reason: POLICY_FAILED.into(),
            message,
        }
    }

    /// The host must be able to execute the plan: every backend it names is one it can boot.
    fn check(decision: &Decision) -> Result<(), String> {
        let backends: Vec<&Backend> = match &decision.outcome {
            Outcome::Refuse(_) => vec![],
            Outcome::Proceed(plan) => match plan {
                Plan::AdoptExisting(_) | Plan::AdoptUnmanaged(_) => vec![],
                Plan::RestoreFromHibernate(p) => vec![&p.options.backend],
                Plan::CloneFromDir(p) => vec![&p.options.backend],
                Plan::Fork(p) => vec![&p.options.backend],
                Plan::Clone(p) => vec![&p.options.backend, &p.expected_backend],
                Plan::Run(p) => vec![&p.backend],
            },
        };
        match backends.into_iter().find(|b| matches!(b, Backend::Unknown(_))) {
            Some(Backend::Unknown(raw)) => Err(format!(
                "the plan names backend {raw:?}, which this node cannot boot (cloud-hypervisor or firecracker)"
            )),
            _ => Ok(()),
        }
    }

    fn summary(decision: &Decision) -> Summary<'_> {
        Summary {
            reason: &decision.reason,
            message: &decision.message,
            outcome: match &decision.outcome {
                Outcome::Refuse(_) => "refuse",
                Outcome::Proceed(plan) => match plan {
                    Plan::AdoptExisting(_) => "adopt-existing",
                    Plan::AdoptUnmanaged(_) => "adopt-unmanaged",
                    Plan::RestoreFromHibernate(_) => "restore-from-hibernate",
                    Plan::CloneFromDir(_) => "clone-from-dir",
                    Plan::Fork(_) => "fork",
                    Plan::Clone(_) => "clone",
                    Plan::Run(_) => "run",
                },
            },
        }
    }

    /// `recorded-owner` of found evidence (0.3.0).
    fn fill_added_fields(facts: &mut serde_json::Value) {
        if let Some(found) = facts.pointer_mut("/evidence/Found").and_then(|f| f.as_object_mut()) {
            found
                .entry("recorded-owner")
                .or_insert_with(|| serde_json::Value::String(String::new()));
        }
    }

    /// No local VM, no hibernate evidence, a registry, no local snapshots, restore mode `mmap`,
    /// the pre-assigned runtime from the pod's annotations.
    fn default_facts(pod: PodInput<'_>) -> Facts {
        let preassigned = RuntimeAnnotations::of_pod(pod.pod);
        Facts {
            pod: pod.facts,
            spec: pod.spec,
            vm_exists_locally: false,
            evidence: HibernateEvidence::None,
            registry_configured: true,
            local_snapshots: vec![],
            node_restore_mode: RestoreMode::Mmap,
            preassigned_vm_id: preassigned.vm_id,
            preassigned_ip: preassigned.ip,
            preassigned_vnc_port: preassigned.vnc_port,
            previous_holder: None,
            fork_source_holder: None,
            image_holder: None,
            preassigned_holder: None,
        }
    }
}

/// The holder a plan reaches across namespaces, if any: the VM it adopts, forks, clones from,
/// restores, or the unmanaged VM it takes over.
fn foreign_holder(facts: &Facts, plan: &Plan) -> Option<String> {
    let namespace = facts.pod.namespace.as_str();
    let foreign = |holder: &Option<Holder>| {
        holder
            .as_ref()
            .filter(|h| h.namespace != namespace)
            .map(|h| format!("{}/{}", h.namespace, h.pod))
    };
    let recorded = || match &facts.evidence {
        HibernateEvidence::Found(found) => Some(found.recorded_owner.as_str())
            .filter(|owner| !owner.is_empty() && owner.split('/').next() != Some(namespace))
            .map(str::to_string),
        _ => None,
    };
    let source = match plan {
        Plan::AdoptUnmanaged(_) => foreign(&facts.preassigned_holder),
        Plan::Fork(_) => foreign(&facts.fork_source_holder),
        Plan::Clone(_) => foreign(&facts.image_holder),
        Plan::RestoreFromHibernate(_) => recorded(),
        Plan::AdoptExisting(_) | Plan::CloneFromDir(_) | Plan::Run(_) => None,
    };
    source.or_else(|| foreign(&facts.previous_holder))
}

/// A component built before contract 0.3.0 could not see who holds the VM names its plan
/// touches, so it cannot have meant to cross namespaces: its plan is kept to the pod's own
/// namespace, as the default policy's is. (A custom 0.3.0 policy decides for itself.)
fn within_namespace(facts: &Facts, decision: Decision) -> Decision {
    let Outcome::Proceed(plan) = &decision.outcome else {
        return decision;
    };
    match foreign_holder(facts, plan) {
        None => decision,
        Some(holder) => Decision {
            outcome: Outcome::Refuse(Refusal {
                kind: RefusalKind::Permanent,
                event: EventReason::VmOwnedByAnotherPod,
            }),
            reason: "vm-owned-by-another-pod".into(),
            message: format!(
                "vm {}: the plan ({}) reaches a VM held by pod {holder} of another namespace, which a policy built before contract 0.3.0 cannot allow; rebuild the policy against 0.3.0 to decide this",
                facts.spec.vm_name, decision.reason
            ),
        },
    }
}

fn restore_mode_text(mode: RestoreMode) -> &'static str {
    match mode {
        RestoreMode::Copy => "copy",
        RestoreMode::Ondemand => "ondemand",
        RestoreMode::Mmap => "mmap",
    }
}

fn facts_down(facts: &Facts) -> old::Facts {
    let evidence = match &facts.evidence {
        HibernateEvidence::NotChecked => old::HibernateEvidence::NotChecked,
        HibernateEvidence::None => old::HibernateEvidence::None,
        HibernateEvidence::Found(FoundEvidence {
            source, recorded_image, ..
        }) => old::HibernateEvidence::Found(old::FoundEvidence {
            source: match source {
                EvidenceSource::Registry => "registry".into(),
                EvidenceSource::LocalSnapshot => "local-snapshot".into(),
            },
            recorded_image: recorded_image.clone(),
        }),
        HibernateEvidence::Unavailable(error) => old::HibernateEvidence::Unavailable(error.clone()),
    };
    old::Facts {
        pod: legacy::pod(&facts.pod),
        spec: legacy::spec(&facts.pod, &facts.spec),
        vm_exists_locally: facts.vm_exists_locally,
        evidence,
        registry_configured: facts.registry_configured,
        local_snapshots: facts
            .local_snapshots
            .iter()
            .map(|s| old::LocalSnapshot {
                name: s.name.clone(),
                id: s.id.clone(),
                image: s.image.clone(),
                image_digest: s.image_digest.clone(),
                hypervisor: legacy::backend_text(&s.hypervisor),
            })
            .collect(),
        node_restore_mode: restore_mode_text(facts.node_restore_mode).into(),
        preassigned_vm_id: facts.preassigned_vm_id.clone(),
        preassigned_ip: facts.preassigned_ip.clone(),
        preassigned_vnc_port: facts.preassigned_vnc_port.clone(),
    }
}

fn options_up(o: old::CloneOptions) -> CloneOptions {
    CloneOptions {
        vm_name: o.vm_name,
        network: o.network,
        no_direct_io: o.no_direct_io,
        backend: legacy::backend(&o.backend),
        restore_mode: crate::model::vm_spec::restore_mode(&o.restore_mode),
        drop_own_fork_snapshot: o.drop_own_fork_snapshot,
    }
}

/// A 0.1.0 decision in 0.2.0 terms. The restore plan's `fresh-nic` is dropped: the NIC of a
/// cloud-hypervisor Windows guest is a host invariant now, and it always was at hibernate time.
fn decision_up(d: old::Decision) -> Decision {
    let outcome = match d.outcome {
        old::Outcome::Refuse => Outcome::Refuse(legacy::bring_up_refusal(&d.reason)),
        old::Outcome::Proceed(plan) => Outcome::Proceed(match plan {
            old::Plan::AdoptExisting(vm) => Plan::AdoptExisting(vm),
            old::Plan::AdoptUnmanaged(a) => Plan::AdoptUnmanaged(UnmanagedAdoption {
                vm_id: a.vm_id,
                ip: a.ip,
                vnc_port: a.vnc_port,
            }),
            old::Plan::RestoreFromHibernate(r) => Plan::RestoreFromHibernate(RestorePlan {
                options: options_up(r.options),
                derived: r.derived,
            }),
            old::Plan::CloneFromDir(c) => Plan::CloneFromDir(CloneFromDirPlan {
                options: options_up(c.options),
                dir: c.dir,
            }),
            old::Plan::Fork(f) => Plan::Fork(super::super::contract::bring_up::ForkPlan {
                options: options_up(f.options),
                source_vm: f.source_vm,
                fork_snapshot: f.fork_snapshot,
            }),
            old::Plan::Clone(c) => Plan::Clone(ClonePlan {
                options: options_up(c.options),
                local_snapshot: c.local_snapshot,
                repository: c.repository,
                tag: c.tag,
                expected_backend: legacy::backend(&c.expected_backend),
            }),
            old::Plan::Run(r) => Plan::Run(RunPlan {
                vm_name: r.vm_name,
                image: r.image,
                force_pull: r.force_pull,
                network: r.network,
                backend: legacy::backend(&r.backend),
                windows: r.windows,
                no_direct_io: r.no_direct_io,
            }),
        }),
    };
    Decision {
        outcome,
        reason: d.reason,
        message: d.message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(reason: &str) -> Refusal {
        let d = decision_up(old::Decision {
            outcome: old::Outcome::Refuse,
            reason: reason.into(),
            message: String::new(),
        });
        match d.outcome {
            Outcome::Refuse(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_0_1_refusal_keeps_the_retry_and_event_the_0_1_host_gave_its_reason() {
        let retried = Refusal {
            kind: RefusalKind::RetryLater,
            event: EventReason::HibernateEvidenceUnavailable,
        };
        assert_eq!(refused("hibernate-evidence-unavailable"), retried);
        assert_eq!(refused("hibernate-evidence-not-checked"), retried);
        assert_eq!(refused("snapshot-unavailable").kind, RefusalKind::RetryLater);
        assert_eq!(
            refused("image-conflict"),
            Refusal {
                kind: RefusalKind::Permanent,
                event: EventReason::HibernateImageConflict
            }
        );
        assert_eq!(refused("backend-mismatch").event, EventReason::SnapshotBackendMismatch);
        assert_eq!(
            refused("my-own-token"),
            Refusal {
                kind: RefusalKind::Permanent,
                event: EventReason::CreateBringUpFailed
            }
        );
    }

    #[test]
    fn a_0_1_plan_decodes_its_strings_with_the_current_rules() {
        let options = old::CloneOptions {
            vm_name: "vm1".into(),
            network: String::new(),
            no_direct_io: false,
            backend: "Firecracker".into(),
            restore_mode: "fast".into(),
            drop_own_fork_snapshot: true,
        };
        let d = decision_up(old::Decision {
            outcome: old::Outcome::Proceed(old::Plan::Clone(old::ClonePlan {
                options,
                local_snapshot: "snap".into(),
                repository: "snap".into(),
                tag: "latest".into(),
                expected_backend: String::new(),
            })),
            reason: "clone".into(),
            message: String::new(),
        });
        let Outcome::Proceed(Plan::Clone(plan)) = &d.outcome else {
            panic!("{d:?}")
        };
        assert_eq!(plan.options.backend, Backend::Firecracker);
        assert_eq!(
            plan.options.restore_mode, None,
            "an unknown mode omits the flag, as 0.1.0 did"
        );
        assert_eq!(plan.expected_backend, Backend::Unspecified);
        assert_eq!(BringUp::check(&d), Ok(()));
    }

    #[test]
    fn a_plan_with_a_backend_the_node_cannot_boot_is_invalid() {
        let d = Decision {
            outcome: Outcome::Proceed(Plan::Run(RunPlan {
                vm_name: "vm1".into(),
                image: "img".into(),
                force_pull: false,
                network: String::new(),
                backend: Backend::Unknown("qemu".into()),
                windows: false,
                no_direct_io: false,
            })),
            reason: "run".into(),
            message: String::new(),
        };
        assert!(BringUp::check(&d).unwrap_err().contains("\"qemu\""));
    }
}
