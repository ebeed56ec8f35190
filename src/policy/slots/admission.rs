//! Slot `cpu-class-admission`: may the pod's VM run (or resume) on this node's CPU class?

use wasmtime::Store;

use super::super::contract::cpu_class_admission::{AdmissionContext, Decision, Facts, Pre, Verdict, World};
use super::super::contract::types::{EventReason, Refusal, RefusalKind};
use super::super::contract::v0_1::admission as v0_1;
use super::super::contract::v0_2::admission as v0_2;
use super::super::sandbox::Sandbox;
use super::{POLICY_FAILED, PodInput, PolicySlot, Slot, Summary, legacy, world_pre};

use v0_1::exports::cocoonstack::vk_policy::cpu_class_admission as old;

pub struct CpuClassAdmission;

world_pre! {
    Pre<Sandbox> => World,
    v0_1::CpuClassAdmissionPolicyPre<Sandbox> => v0_1::CpuClassAdmissionPolicy,
    v0_2::CpuClassAdmissionPolicyPre<Sandbox> => v0_2::CpuClassAdmissionPolicy,
}

impl PolicySlot for CpuClassAdmission {
    const SLOT: Slot = Slot::CpuClassAdmission;
    const NAME: &'static str = "cpu-class-admission";
    const FAIL_SAFE_RULE: &'static str = "reject the pod, retried later (at startup: the node does not register)";

    type Facts = Facts;
    type Decision = Decision;
    type Pre = Pre<Sandbox>;
    type V0_1Pre = v0_1::CpuClassAdmissionPolicyPre<Sandbox>;
    type V0_2Pre = v0_2::CpuClassAdmissionPolicyPre<Sandbox>;

    fn default_component() -> &'static [u8] {
        policy_artifacts::defaults::CPU_CLASS_ADMISSION
    }

    fn call(world: &World, store: &mut Store<Sandbox>, facts: &Facts) -> wasmtime::Result<Decision> {
        world
            .cocoonstack_vk_policy_cpu_class_admission()
            .call_decide(store, facts)
    }

    /// A 0.1.0 rejection was final (a CPU-class mismatch) unless it said `policy-failed`.
    fn call_v0_1(
        world: &v0_1::CpuClassAdmissionPolicy,
        store: &mut Store<Sandbox>,
        facts: &Facts,
    ) -> wasmtime::Result<Result<Decision, String>> {
        let old_facts = old::Facts {
            pod: legacy::pod(&facts.pod),
            context: match facts.context {
                AdmissionContext::Create => old::AdmissionContext::Create,
                AdmissionContext::Update => old::AdmissionContext::Update,
                AdmissionContext::StartupReconcile => old::AdmissionContext::StartupReconcile,
            },
            node_name: facts.node_name.clone(),
            node_class: facts.node_class.clone(),
        };
        let d = world
            .cocoonstack_vk_policy_cpu_class_admission()
            .call_decide(store, &old_facts)?;
        let verdict = match d.verdict {
            old::Verdict::Admit => Verdict::Admit,
            old::Verdict::Reject => Verdict::Reject(Refusal {
                kind: legacy::kind_of(&d.reason),
                event: EventReason::SnapshotCpuClassMismatch,
            }),
        };
        Ok(Ok(Decision {
            verdict,
            reason: d.reason,
            message: d.message,
        }))
    }

    fn call_v0_2(
        world: &v0_2::CpuClassAdmissionPolicy,
        store: &mut Store<Sandbox>,
        facts: &Facts,
    ) -> wasmtime::Result<Result<Decision, String>> {
        let d = world
            .cocoonstack_vk_policy_cpu_class_admission()
            .call_decide(store, &legacy::down(facts)?)?;
        Ok(legacy::up(&d))
    }

    fn fail_safe(_facts: &Facts, message: String) -> Decision {
        Decision {
            verdict: Verdict::Reject(Refusal {
                kind: RefusalKind::RetryLater,
                event: EventReason::CpuClassAdmissionPolicyFailed,
            }),
            reason: POLICY_FAILED.into(),
            message,
        }
    }

    fn check(_decision: &Decision) -> Result<(), String> {
        Ok(())
    }

    fn summary(decision: &Decision) -> Summary<'_> {
        Summary {
            reason: &decision.reason,
            message: &decision.message,
            outcome: match decision.verdict {
                Verdict::Admit => "admit",
                Verdict::Reject(_) => "reject",
            },
        }
    }

    /// CreatePod on node `node`, which is unclassified.
    fn default_facts(pod: PodInput<'_>) -> Facts {
        Facts {
            pod: pod.facts,
            context: AdmissionContext::Create,
            node_name: "node".into(),
            node_class: String::new(),
        }
    }
}
