//! The live policies of all slots. Each slot holds its current policy behind an atomic pointer:
//! a reload swaps it without pausing decisions, and a decision in flight finishes on the
//! policy it started with.

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use tracing::{info, warn};

use super::cache::CompileCache;
use super::decision::{
    BringUpOutcome, Decision, FixupOutcome, SlotDecision, SnapshotOutcome, TranslationOutcome, Verdict,
};
use super::engine::PolicyEngine;
use super::error::{DecisionError, LoadError};
use super::facts::{AdmissionFacts, BringUpFacts, GuestFixupFacts, SlotFacts, SnapshotFacts, TranslationFacts};
use super::loaded::LoadedPolicy;
use super::metrics::PolicyMetrics;
use super::slot::Slot;

/// Every slot's current policy, and the engine they run on.
pub struct Policies {
    engine: PolicyEngine,
    cache: Option<CompileCache>,
    slots: [ArcSwap<LoadedPolicy>; Slot::ALL.len()],
    metrics: PolicyMetrics,
}

fn index(slot: Slot) -> usize {
    Slot::ALL
        .iter()
        .position(|s| *s == slot)
        .expect("every slot is in Slot::ALL")
}

impl Policies {
    /// Every slot on its built-in default.
    pub fn with_defaults(
        engine: PolicyEngine,
        cache: Option<CompileCache>,
        metrics: PolicyMetrics,
    ) -> Result<Self, LoadError> {
        let load = |slot| LoadedPolicy::builtin(&engine, cache.as_ref(), slot).map(ArcSwap::from_pointee);
        let slots = [
            load(Slot::ALL[0])?,
            load(Slot::ALL[1])?,
            load(Slot::ALL[2])?,
            load(Slot::ALL[3])?,
            load(Slot::ALL[4])?,
        ];
        for slot in Slot::ALL {
            metrics.set_active(slot, slots[index(slot)].load().digest());
        }
        Ok(Policies {
            engine,
            cache,
            slots,
            metrics,
        })
    }

    pub fn engine(&self) -> &PolicyEngine {
        &self.engine
    }

    pub fn cache(&self) -> Option<&CompileCache> {
        self.cache.as_ref()
    }

    pub fn metrics(&self) -> &PolicyMetrics {
        &self.metrics
    }

    /// The policy currently serving `slot`.
    pub fn current(&self, slot: Slot) -> Arc<LoadedPolicy> {
        self.slots[index(slot)].load_full()
    }

    /// Makes `policy` serve its slot from the next decision on; returns the one it replaces.
    pub fn install(&self, policy: LoadedPolicy) -> Arc<LoadedPolicy> {
        let slot = policy.slot();
        info!(%slot, origin = %policy.origin(), digest = policy.digest(), "policy installed");
        self.metrics.set_active(slot, policy.digest());
        self.slots[index(slot)].swap(Arc::new(policy))
    }

    /// Runs a decision on the slot's current policy. A failed policy yields the slot's
    /// fail-safe decision (never a permissive one), logged and counted.
    pub fn decide(&self, facts: &SlotFacts) -> SlotDecision {
        let slot = facts.slot();
        let policy = self.current(slot);
        let started = Instant::now();
        let mut result = policy.decide(&self.engine, facts);
        if let Err(DecisionError::Timeout { .. }) = result {
            // The deadline is wall-clock time: on a starved host a sound policy can miss it.
            // Decisions are pure, so one retry on a fresh instance is safe; a policy that
            // really loops costs two deadlines and then fails safe.
            warn!(%slot, origin = %policy.origin(), "policy missed its deadline; retrying once");
            self.metrics.count_failure(slot, "timeout_retried");
            result = policy.decide(&self.engine, facts);
        }
        self.metrics.observe_latency(slot, started.elapsed());
        match result {
            Ok(decision) => {
                self.metrics.count_decision(slot, decision.reason());
                decision
            }
            Err(error) => {
                warn!(%slot, origin = %policy.origin(), %error, rule = slot.fail_safe_rule(), "policy failed; taking the fail-safe decision");
                self.metrics.count_failure(slot, error.metric_label());
                let decision = SlotDecision::fail_safe(facts, &error.to_string());
                self.metrics.count_decision(slot, decision.reason());
                decision
            }
        }
    }

    pub fn snapshot_before_destroy(&self, facts: SnapshotFacts) -> Decision<SnapshotOutcome> {
        match self.decide(&SlotFacts::SnapshotBeforeDestroy(facts)) {
            SlotDecision::SnapshotBeforeDestroy(d) => d,
            other => unreachable!("snapshot-before-destroy answered as {}", other.slot()),
        }
    }

    pub fn bring_up(&self, facts: BringUpFacts) -> Decision<BringUpOutcome> {
        match self.decide(&SlotFacts::BringUp(facts)) {
            SlotDecision::BringUp(d) => d,
            other => unreachable!("bring-up answered as {}", other.slot()),
        }
    }

    pub fn cpu_class_admission(&self, facts: AdmissionFacts) -> Decision<Verdict> {
        match self.decide(&SlotFacts::CpuClassAdmission(facts)) {
            SlotDecision::CpuClassAdmission(d) => d,
            other => unreachable!("cpu-class-admission answered as {}", other.slot()),
        }
    }

    pub fn resource_translation(&self, facts: TranslationFacts) -> Decision<TranslationOutcome> {
        match self.decide(&SlotFacts::ResourceTranslation(facts)) {
            SlotDecision::ResourceTranslation(d) => d,
            other => unreachable!("resource-translation answered as {}", other.slot()),
        }
    }

    pub fn guest_fixup(&self, facts: GuestFixupFacts) -> Decision<FixupOutcome> {
        match self.decide(&SlotFacts::GuestFixup(facts)) {
            SlotDecision::GuestFixup(d) => d,
            other => unreachable!("guest-fixup answered as {}", other.slot()),
        }
    }
}
