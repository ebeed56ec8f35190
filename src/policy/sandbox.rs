//! The per-decision store state: resource accounting that lets the host tell "the policy ran
//! out of memory" apart from any other trap, even when the guest caught the failed growth.

use wasmtime::{ResourceLimiter, Store};

use super::engine::{Permit, PolicyEngine};
use super::limits::InstanceShape;

/// State of one decision's `Store`.
pub struct Sandbox {
    memory_limit: usize,
    /// The shape of the pool the decision runs in: the limiter refuses more than it reserves.
    shape: InstanceShape,
    /// Set when the guest asked for more memory than its limit.
    pub(crate) memory_exhausted: bool,
}

impl Sandbox {
    pub fn new(memory_limit: usize, shape: InstanceShape) -> Self {
        Sandbox {
            memory_limit,
            shape,
            memory_exhausted: false,
        }
    }
}

impl ResourceLimiter for Sandbox {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            // Refuse the growth (memory.grow returns -1); a guest that cannot cope traps, one
            // that catches it (CPython's MemoryError, a Rust guest checking memory.grow) may
            // answer normally: either way the host reports the limit (see `loaded`).
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
        Ok(desired <= self.shape.table_elements)
    }

    // The same shape the pool reserves per decision (see `limits`).
    fn instances(&self) -> usize {
        self.shape.core_instances as usize
    }

    fn tables(&self) -> usize {
        self.shape.tables as usize
    }

    fn memories(&self) -> usize {
        self.shape.memories as usize
    }
}

/// A fresh store for one decision (or load-time check) in the pool `permit` holds a slot of:
/// the memory limiter and the epoch deadline of the engine's limits are armed.
pub(crate) fn new_store(engine: &PolicyEngine, permit: &Permit<'_>) -> Store<Sandbox> {
    let limits = engine.limits();
    let mut store = Store::new(permit.engine, Sandbox::new(limits.memory_bytes, permit.shape));
    store.limiter(|sandbox| sandbox);
    store.set_epoch_deadline(limits.deadline_ticks());
    store.epoch_deadline_trap();
    store
}
