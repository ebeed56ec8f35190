//! The per-decision store state: resource accounting that lets the host tell "the policy ran
//! out of memory" apart from any other trap, even when the guest caught the failed growth; and
//! the decision's deadline, counted in the CPU time of the thread that runs it.

use std::time::{Duration, Instant};

use wasmtime::{ResourceLimiter, Store, UpdateDeadline};

use super::engine::{Permit, PolicyEngine};
use super::limits::{EPOCH_TICK, InstanceShape};

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
/// the memory limiter and the deadline of the engine's limits are armed. Call the guest on the
/// thread that made the store: the deadline counts that thread's CPU time.
pub(crate) fn new_store(engine: &PolicyEngine, permit: &Permit<'_>) -> Store<Sandbox> {
    let limits = engine.limits();
    let mut store = Store::new(permit.engine, Sandbox::new(limits.memory_bytes, permit.shape));
    store.limiter(|sandbox| sandbox);
    // The first epoch tick only starts the CPU clock (see `CpuDeadline`); the budget is counted
    // from there.
    store.set_epoch_deadline(1);
    let mut deadline = CpuDeadline::start(limits.timeout, limits.deadline_ticks());
    store.epoch_deadline_callback(move |_| Ok(deadline.at_epoch()));
    store
}

/// How long past its deadline a starved decision may wait for a core before it is stopped all
/// the same: a multiple of the deadline, and never less than [`MIN_WALL_CAP`].
const WALL_CAP_FACTOR: u32 = 20;
const MIN_WALL_CAP: Duration = Duration::from_secs(2);

/// A decision's deadline in the CPU time of the thread that runs it, not in wall time: on a
/// loaded host the epoch clock keeps ticking while the thread waits for a core, and a sound
/// policy would miss a wall-clock deadline it never had the CPU to meet. The epoch deadline
/// fires as before; it stops the guest only once the thread has used its budget (or waited past
/// the wall cap, or runs on another thread than the one that started the count), and otherwise
/// extends the deadline by what is left.
///
/// The thread's CPU clock is a system call (the vDSO does not serve per-thread CPU clocks), and
/// a decision takes microseconds: reading it at every store's creation cost a few percent of
/// each decision. So the count starts at the first epoch tick the decision sees (at most one
/// tick after it started; almost every decision has ended before): the CPU used before that is
/// not counted, so a sound policy is never stopped before it used its whole budget, and a loop
/// runs at most one tick of CPU past it.
struct CpuDeadline {
    budget: Duration,
    budget_ticks: u64,
    /// Set at the first epoch tick: the thread and its CPU time then (`None` without a
    /// per-thread clock).
    counting: Option<(std::thread::ThreadId, Option<Duration>)>,
    wall_at_start: Instant,
    wall_cap: Duration,
}

impl CpuDeadline {
    fn start(budget: Duration, budget_ticks: u64) -> Self {
        CpuDeadline {
            budget,
            budget_ticks,
            counting: None,
            wall_at_start: Instant::now(),
            wall_cap: (budget * WALL_CAP_FACTOR).max(MIN_WALL_CAP),
        }
    }

    /// Called when the epoch deadline is reached (on the thread running the guest).
    fn at_epoch(&mut self) -> UpdateDeadline {
        let Some((thread, cpu_at_start)) = self.counting else {
            self.counting = Some((std::thread::current().id(), crate::host::cpu::thread_cpu_time()));
            return UpdateDeadline::Continue(self.budget_ticks);
        };
        let used = match (cpu_at_start, crate::host::cpu::thread_cpu_time()) {
            (Some(start), Some(now)) if std::thread::current().id() == thread => now.saturating_sub(start),
            // No per-thread clock, or another thread: wall time is all there is.
            _ => self.wall_at_start.elapsed(),
        };
        if used >= self.budget || self.wall_at_start.elapsed() >= self.wall_cap {
            return UpdateDeadline::Interrupt;
        }
        let left = self.budget - used;
        let ticks = left.as_micros().div_ceil(EPOCH_TICK.as_micros()).max(1);
        UpdateDeadline::Continue(u64::try_from(ticks).unwrap_or(u64::MAX))
    }
}
