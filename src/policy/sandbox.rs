//! The per-decision store state: resource accounting that lets the host tell "the policy ran
//! out of memory" apart from any other trap.

use wasmtime::{ResourceLimiter, Store};

use super::engine::PolicyEngine;
use super::limits::PER_DECISION;

/// State of one decision's `Store`.
pub struct Sandbox {
    memory_limit: usize,
    /// Set when the guest asked for more memory than its limit.
    pub(crate) memory_exhausted: bool,
}

impl Sandbox {
    pub fn new(memory_limit: usize) -> Self {
        Sandbox {
            memory_limit,
            memory_exhausted: false,
        }
    }
}

impl ResourceLimiter for Sandbox {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            // Refuse the growth (memory.grow returns -1); a guest that cannot cope traps,
            // and the host reports the limit rather than a bare trap.
            self.memory_exhausted = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.memory_exhausted = true;
        Ok(())
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= PER_DECISION.table_elements)
    }

    // The same shape the pool reserves per decision (see `limits`).
    fn instances(&self) -> usize {
        PER_DECISION.core_instances as usize
    }

    fn tables(&self) -> usize {
        PER_DECISION.tables as usize
    }

    fn memories(&self) -> usize {
        PER_DECISION.memories as usize
    }
}

/// A fresh store for one decision (or load-time check): the memory limiter and the epoch
/// deadline of the engine's limits are armed.
pub(crate) fn new_store(engine: &PolicyEngine) -> Store<Sandbox> {
    let limits = engine.limits();
    let mut store = Store::new(engine.wasmtime(), Sandbox::new(limits.memory_bytes));
    store.limiter(|sandbox| sandbox);
    store.set_epoch_deadline(limits.deadline_ticks());
    store.epoch_deadline_trap();
    store
}
