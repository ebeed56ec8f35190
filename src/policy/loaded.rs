//! A validated policy for one slot, and how a decision runs: a fresh store and instance per
//! decision, a memory limit and an epoch deadline, traps mapped to typed errors.

use std::time::Instant;

use wasmtime::Store;

use super::cache::CompileCache;
use super::component::{self, Origin, SlotPre};
use super::decision::SlotDecision;
use super::engine::{PolicyEngine, SandboxLimits};
use super::error::{DecisionError, LoadError};
use super::facts::SlotFacts;
use super::sandbox::{Sandbox, new_store};
use super::slot::Slot;

/// A component validated for a slot.
pub struct LoadedPolicy {
    slot: Slot,
    origin: Origin,
    digest: String,
    pre: SlotPre,
}

impl LoadedPolicy {
    /// Compiles (or loads from `cache`) and validates `bytes` as the policy of `slot`.
    pub fn load(
        engine: &PolicyEngine,
        cache: Option<&CompileCache>,
        slot: Slot,
        origin: Origin,
        bytes: &[u8],
    ) -> Result<Self, LoadError> {
        let (pre, digest) = component::load(engine, cache, slot, &origin, bytes)?;
        Ok(LoadedPolicy {
            slot,
            origin,
            digest,
            pre,
        })
    }

    /// The embedded default policy of `slot`.
    pub fn builtin(engine: &PolicyEngine, cache: Option<&CompileCache>, slot: Slot) -> Result<Self, LoadError> {
        Self::load(engine, cache, slot, Origin::Builtin(slot), slot.default_component())
    }

    pub fn slot(&self) -> Slot {
        self.slot
    }

    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// SHA-256 of the component's bytes.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// Runs one decision in a fresh instance. Errors are typed; the caller picks the fail-safe.
    pub fn decide(&self, engine: &PolicyEngine, facts: &SlotFacts) -> Result<SlotDecision, DecisionError> {
        let slot = self.slot;
        assert_eq!(
            facts.slot(),
            slot,
            "facts for slot {} handed to the {slot} policy",
            facts.slot()
        );
        let limits = engine.limits();
        let _permit = engine.acquire();
        let mut store = new_store(engine);

        let started = Instant::now();
        let answer = match (&self.pre, facts) {
            (SlotPre::SnapshotBeforeDestroy(pre), SlotFacts::SnapshotBeforeDestroy(f)) => pre
                .instantiate(&mut store)
                .and_then(|p| {
                    p.cocoonstack_vk_policy_snapshot_before_destroy()
                        .call_decide(&mut store, &f.to_wit())
                })
                .map(SlotDecision::from),
            (SlotPre::BringUp(pre), SlotFacts::BringUp(f)) => pre
                .instantiate(&mut store)
                .and_then(|p| p.cocoonstack_vk_policy_bring_up().call_decide(&mut store, &f.to_wit()))
                .map(SlotDecision::from),
            (SlotPre::CpuClassAdmission(pre), SlotFacts::CpuClassAdmission(f)) => pre
                .instantiate(&mut store)
                .and_then(|p| {
                    p.cocoonstack_vk_policy_cpu_class_admission()
                        .call_decide(&mut store, &f.to_wit())
                })
                .map(SlotDecision::from),
            (SlotPre::ResourceTranslation(pre), SlotFacts::ResourceTranslation(f)) => pre
                .instantiate(&mut store)
                .and_then(|p| {
                    p.cocoonstack_vk_policy_resource_translation()
                        .call_decide(&mut store, &f.to_wit())
                })
                .map(SlotDecision::from),
            (SlotPre::GuestFixup(pre), SlotFacts::GuestFixup(f)) => pre
                .instantiate(&mut store)
                .and_then(|p| {
                    p.cocoonstack_vk_policy_guest_fixup()
                        .call_decide(&mut store, &f.to_wit())
                })
                .map(SlotDecision::from),
            _ => unreachable!("a SlotPre always matches its slot's facts (checked above)"),
        };
        let decision = answer.map_err(|error| classify(slot, &store, &limits, error))?;
        tracing::trace!(%slot, elapsed_us = started.elapsed().as_micros() as u64, "policy decided");
        decision
            .validate()
            .map_err(|detail| DecisionError::InvalidDecision { slot, detail })?;
        Ok(decision)
    }
}

/// Maps a wasmtime error to what happened, from the typed trap and the store's accounting.
fn classify(slot: Slot, store: &Store<Sandbox>, limits: &SandboxLimits, error: wasmtime::Error) -> DecisionError {
    if store.data().memory_exhausted {
        return DecisionError::OutOfMemory {
            slot,
            limit_bytes: limits.memory_bytes,
        };
    }
    match error.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => DecisionError::Timeout {
            slot,
            limit: limits.timeout,
        },
        Some(trap) => DecisionError::Trap {
            slot,
            trap: trap.to_string(),
        },
        None => DecisionError::Instantiate {
            slot,
            detail: format!("{error:#}"),
        },
    }
}
