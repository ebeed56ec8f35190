//! Slot `snapshot-before-destroy`: on DeletePod, save and push the VM first?

use wasmtime::Store;

use super::super::contract::snapshot_before_destroy::{Decision, Facts, Outcome, Pre, SnapshotTarget, World};
use super::super::contract::v0_1::snapshot as v0_1;
use super::super::contract::v0_2::snapshot as v0_2;
use super::super::sandbox::Sandbox;
use super::{POLICY_FAILED, PodInput, PolicySlot, Slot, Summary, legacy, world_pre};

pub struct SnapshotBeforeDestroy;

world_pre! {
    Pre<Sandbox> => World,
    v0_1::SnapshotBeforeDestroyPolicyPre<Sandbox> => v0_1::SnapshotBeforeDestroyPolicy,
    v0_2::SnapshotBeforeDestroyPolicyPre<Sandbox> => v0_2::SnapshotBeforeDestroyPolicy,
}

impl PolicySlot for SnapshotBeforeDestroy {
    const SLOT: Slot = Slot::SnapshotBeforeDestroy;
    const NAME: &'static str = "snapshot-before-destroy";
    const FAIL_SAFE_RULE: &'static str =
        "preserve state: snapshot and push before destroying, or keep the VM and retry the delete";

    type Facts = Facts;
    type Decision = Decision;
    type Pre = Pre<Sandbox>;
    type V0_1Pre = v0_1::SnapshotBeforeDestroyPolicyPre<Sandbox>;
    type V0_2Pre = v0_2::SnapshotBeforeDestroyPolicyPre<Sandbox>;

    fn default_component() -> &'static [u8] {
        policy_artifacts::defaults::SNAPSHOT_BEFORE_DESTROY
    }

    fn call(world: &World, store: &mut Store<Sandbox>, facts: &Facts) -> wasmtime::Result<Decision> {
        world
            .cocoonstack_vk_policy_snapshot_before_destroy()
            .call_decide(store, facts)
    }

    fn call_v0_1(
        world: &v0_1::SnapshotBeforeDestroyPolicy,
        store: &mut Store<Sandbox>,
        facts: &Facts,
    ) -> wasmtime::Result<Result<Decision, String>> {
        use v0_1::exports::cocoonstack::vk_policy::snapshot_before_destroy as old;
        let old_facts = old::Facts {
            pod: legacy::pod(&facts.pod),
            spec: legacy::spec(&facts.pod, &facts.spec),
            pusher_configured: facts.pusher_configured,
            vm_running: facts.vm_running,
        };
        let d = world
            .cocoonstack_vk_policy_snapshot_before_destroy()
            .call_decide(store, &old_facts)?;
        let outcome = match d.outcome {
            old::Outcome::Snapshot(t) => Outcome::Snapshot(SnapshotTarget {
                repository: t.repository,
                tag: t.tag,
                base_image: t.base_image,
            }),
            old::Outcome::Skip => Outcome::Skip,
        };
        Ok(Ok(Decision {
            outcome,
            reason: d.reason,
            message: d.message,
        }))
    }

    fn call_v0_2(
        world: &v0_2::SnapshotBeforeDestroyPolicy,
        store: &mut Store<Sandbox>,
        facts: &Facts,
    ) -> wasmtime::Result<Result<Decision, String>> {
        let d = world
            .cocoonstack_vk_policy_snapshot_before_destroy()
            .call_decide(store, &legacy::down(facts)?)?;
        Ok(legacy::up(&d))
    }

    /// Preserve state: snapshot to `<vm>:latest` with the pod's image.
    fn fail_safe(facts: &Facts, message: String) -> Decision {
        Decision {
            outcome: Outcome::Snapshot(SnapshotTarget {
                repository: facts.spec.vm_name.clone(),
                tag: vk_policy_support::naming::DEFAULT_SNAPSHOT_TAG.into(),
                base_image: facts.spec.image.clone(),
            }),
            reason: POLICY_FAILED.into(),
            message,
        }
    }

    fn check(decision: &Decision) -> Result<(), String> {
        match &decision.outcome {
            Outcome::Snapshot(target) if target.repository.is_empty() || target.tag.is_empty() => {
                Err("a snapshot decision needs a repository and a tag".into())
            }
            _ => Ok(()),
        }
    }

    fn summary(decision: &Decision) -> Summary<'_> {
        Summary {
            reason: &decision.reason,
            message: &decision.message,
            outcome: match decision.outcome {
                Outcome::Snapshot(_) => "snapshot",
                Outcome::Skip => "skip",
            },
        }
    }

    /// A registry configured and the VM running.
    fn default_facts(pod: PodInput<'_>) -> Facts {
        Facts {
            pod: pod.facts,
            spec: pod.spec,
            pusher_configured: true,
            vm_running: true,
        }
    }
}
