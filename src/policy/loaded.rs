//! A validated policy for one slot, and how a decision runs: a fresh store and instance per
//! decision, a memory limit and an epoch deadline, traps mapped to typed errors, the answer
//! checked before anyone acts on it.

use std::time::Instant;

use wasmtime::Store;

use super::cache::CompileCache;
use super::component::{self, Bound, Origin};
use super::contract::ContractVersion;
use super::engine::{Permit, PolicyEngine, PoolSize};
use super::error::{DecisionError, LoadError};
use super::limits::SandboxLimits;
use super::sandbox::{Sandbox, new_store};
use super::slots::{PolicySlot, Slot, WorldPre, validate};

/// A component validated for slot `S`.
pub struct LoadedPolicy<S: PolicySlot> {
    origin: Origin,
    digest: String,
    version: ContractVersion,
    /// The instance pool its decisions run in.
    size: PoolSize,
    bound: Bound<S>,
}

impl<S: PolicySlot> LoadedPolicy<S> {
    /// Compiles (or loads from `cache`) and validates `bytes` as the policy of `S`.
    pub fn load(
        engine: &PolicyEngine,
        cache: Option<&CompileCache>,
        origin: Origin,
        bytes: &[u8],
    ) -> Result<Self, LoadError> {
        let compiled = component::compile(engine, cache, &origin, bytes)?;
        let (bound, version) = component::bind::<S>(engine, &compiled, &origin)?;
        Ok(LoadedPolicy {
            origin,
            digest: compiled.digest,
            version,
            size: compiled.size,
            bound,
        })
    }

    /// The embedded default policy of `S`.
    pub fn builtin(engine: &PolicyEngine, cache: Option<&CompileCache>) -> Result<Self, LoadError> {
        Self::load(engine, cache, Origin::Builtin(S::SLOT), S::default_component())
    }

    pub fn slot(&self) -> Slot {
        S::SLOT
    }

    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// SHA-256 of the component's bytes.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The contract version the component was built against.
    pub fn version(&self) -> ContractVersion {
        self.version
    }

    /// Whether it runs in the pool of large components (it does not fit the Rust guests' shape).
    pub fn is_large(&self) -> bool {
        self.size == PoolSize::Large
    }

    /// A slot of this component's pool for one instance (waiting while the pool is full).
    fn permit<'e>(&self, engine: &'e PolicyEngine) -> Result<Permit<'e>, DecisionError> {
        engine.acquire(self.size).map_err(|error| DecisionError::Instantiate {
            slot: S::SLOT,
            detail: format!("{error:#}"),
        })
    }

    /// Creates one fresh instance as a decision would and drops it without calling the guest:
    /// what a decision costs before the policy's code runs (the latency bench's "instantiation
    /// alone" row; a large component's memory image and its core instances are set up here).
    pub fn instantiate_only(&self, engine: &PolicyEngine) -> Result<(), DecisionError> {
        let limits = engine.limits();
        let permit = self.permit(engine)?;
        let mut store = new_store(engine, &permit);
        let made = match &self.bound {
            Bound::Current(pre) => pre.instantiate(&mut store).map(drop),
            Bound::V0_1(pre) => pre.instantiate(&mut store).map(drop),
            Bound::V0_2(pre) => pre.instantiate(&mut store).map(drop),
        };
        made.map_err(|error| classify(S::SLOT, &store, &limits, error))
    }

    /// Runs one decision in a fresh instance. Errors are typed; the caller picks the fail-safe.
    pub fn decide(&self, engine: &PolicyEngine, facts: &S::Facts) -> Result<S::Decision, DecisionError> {
        let limits = engine.limits();
        let permit = self.permit(engine)?;
        let mut store = new_store(engine, &permit);
        let started = Instant::now();
        let answer = match &self.bound {
            Bound::Current(pre) => pre
                .instantiate(&mut store)
                .and_then(|world| S::call(&world, &mut store, facts))
                .map(Ok),
            Bound::V0_1(pre) => pre
                .instantiate(&mut store)
                .and_then(|world| S::call_v0_1(&world, &mut store, facts)),
            Bound::V0_2(pre) => pre
                .instantiate(&mut store)
                .and_then(|world| S::call_v0_2(&world, &mut store, facts)),
        };
        let invalid = |detail| DecisionError::InvalidDecision { slot: S::SLOT, detail };
        let answer = answer.map_err(|error| classify(S::SLOT, &store, &limits, error))?;
        // A guest that caught its own failed growth (CPython raises MemoryError, which a policy
        // may catch) answered without the memory it asked for: its answer is not trusted, and
        // the failure is the limit's, as if it had trapped.
        if store.data().memory_exhausted {
            return Err(DecisionError::OutOfMemory {
                slot: S::SLOT,
                limit_bytes: limits.memory_bytes,
            });
        }
        let decision = answer.map_err(invalid)?;
        tracing::trace!(slot = %S::SLOT, elapsed_us = started.elapsed().as_micros() as u64, "policy decided");
        validate::<S>(&decision).map_err(invalid)?;
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
