//! Slot `resource-translation`: pod resources to cocoon's cgroup and guest flags.

use wasmtime::Store;

use super::super::contract::resource_translation::{
    BootPath, CpuPolicy, Decision, Facts, GuestResources, Outcome, Pre, Translation, World,
};
use super::super::contract::types::{EventReason, KeyValue, Refusal, RefusalKind};
use super::super::contract::v0_1::translation as v0_1;
use super::super::contract::v0_1::types as old_types;
use super::super::contract::v0_2::translation as v0_2;
use super::super::sandbox::Sandbox;
use super::{POLICY_FAILED, PodInput, PolicySlot, Slot, Summary, legacy, world_pre};

use v0_1::exports::cocoonstack::vk_policy::resource_translation as old;

pub struct ResourceTranslation;

world_pre! {
    Pre<Sandbox> => World,
    v0_1::ResourceTranslationPolicyPre<Sandbox> => v0_1::ResourceTranslationPolicy,
    v0_2::ResourceTranslationPolicyPre<Sandbox> => v0_2::ResourceTranslationPolicy,
}

fn old_pairs(list: &[KeyValue]) -> Vec<old_types::KeyValue> {
    list.iter()
        .map(|kv| old_types::KeyValue {
            key: kv.key.clone(),
            value: kv.value.clone(),
        })
        .collect()
}

impl PolicySlot for ResourceTranslation {
    const SLOT: Slot = Slot::ResourceTranslation;
    const NAME: &'static str = "resource-translation";
    const FAIL_SAFE_RULE: &'static str = "refuse the bring-up rather than boot with guessed limits (retried later)";

    type Facts = Facts;
    type Decision = Decision;
    type Pre = Pre<Sandbox>;
    type V0_1Pre = v0_1::ResourceTranslationPolicyPre<Sandbox>;
    type V0_2Pre = v0_2::ResourceTranslationPolicyPre<Sandbox>;

    fn default_component() -> &'static [u8] {
        policy_artifacts::defaults::RESOURCE_TRANSLATION
    }

    fn call(world: &World, store: &mut Store<Sandbox>, facts: &Facts) -> wasmtime::Result<Decision> {
        world
            .cocoonstack_vk_policy_resource_translation()
            .call_decide(store, facts)
    }

    fn call_v0_1(
        world: &v0_1::ResourceTranslationPolicy,
        store: &mut Store<Sandbox>,
        facts: &Facts,
    ) -> wasmtime::Result<Result<Decision, String>> {
        let old_facts = old::Facts {
            pod: legacy::pod(&facts.pod),
            spec: legacy::spec(&facts.pod, &facts.spec),
            path: match facts.path {
                BootPath::Clone => old::BootPath::Clone,
                BootPath::Run => old::BootPath::Run,
            },
            resources: facts.resources.as_ref().map(|r| old::ContainerResources {
                requests: old_pairs(&r.requests),
                limits: old_pairs(&r.limits),
            }),
        };
        let d = world
            .cocoonstack_vk_policy_resource_translation()
            .call_decide(store, &old_facts)?;
        let outcome = match d.outcome {
            old::Outcome::Translated(t) => Outcome::Translated(Translation {
                cpu: CpuPolicy {
                    cpu_weight: t.cpu.cpu_weight,
                    cpu_quota_us: t.cpu.cpu_quota_us,
                    cpu_period_us: t.cpu.cpu_period_us,
                },
                guest: t.guest.map(|g| GuestResources {
                    vcpus: g.vcpus,
                    memory_bytes: g.memory_bytes,
                    storage_bytes: g.storage_bytes,
                }),
            }),
            old::Outcome::Refuse => Outcome::Refuse(Refusal {
                kind: legacy::kind_of(&d.reason),
                event: EventReason::ResourceTranslationRefused,
            }),
        };
        Ok(Ok(Decision {
            outcome,
            reason: d.reason,
            message: d.message,
        }))
    }

    fn call_v0_2(
        world: &v0_2::ResourceTranslationPolicy,
        store: &mut Store<Sandbox>,
        facts: &Facts,
    ) -> wasmtime::Result<Result<Decision, String>> {
        let d = world
            .cocoonstack_vk_policy_resource_translation()
            .call_decide(store, &legacy::down(facts)?)?;
        Ok(legacy::up(&d))
    }

    fn fail_safe(_facts: &Facts, message: String) -> Decision {
        Decision {
            outcome: Outcome::Refuse(Refusal {
                kind: RefusalKind::RetryLater,
                event: EventReason::ResourceTranslationPolicyFailed,
            }),
            reason: POLICY_FAILED.into(),
            message,
        }
    }

    /// cocoon passes the knobs to cgroup v2: they must be values it accepts.
    fn check(decision: &Decision) -> Result<(), String> {
        let Outcome::Translated(t) = &decision.outcome else {
            return Ok(());
        };
        let cpu = &t.cpu;
        if !(1..=10_000).contains(&cpu.cpu_weight) {
            return Err(format!(
                "cpu-weight {} is outside cgroup v2's 1..=10000",
                cpu.cpu_weight
            ));
        }
        match (cpu.cpu_quota_us, cpu.cpu_period_us) {
            (None, None) => Ok(()),
            (Some(quota), Some(period)) if quota >= 1_000 && (1_000..=1_000_000).contains(&period) => Ok(()),
            (quota, period) => Err(format!(
                "cpu quota {quota:?} / period {period:?} must be set together, quota ≥ 1000 µs, period 1000..=1000000 µs"
            )),
        }
    }

    fn summary(decision: &Decision) -> Summary<'_> {
        Summary {
            reason: &decision.reason,
            message: &decision.message,
            outcome: match decision.outcome {
                Outcome::Translated(_) => "translated",
                Outcome::Refuse(_) => "refuse",
            },
        }
    }

    /// The clone path; the first container's resources from the pod.
    fn default_facts(pod: PodInput<'_>) -> Facts {
        Facts {
            resources: crate::model::first_container_resources(pod.pod),
            pod: pod.facts,
            spec: pod.spec,
            path: BootPath::Clone,
        }
    }
}
