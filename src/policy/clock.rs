//! The epoch clock behind decision deadlines. wasmtime's epoch interruption needs someone to
//! advance the engine's epoch; a thread doing it every millisecond forever would wake an idle
//! daemon a thousand times a second. This clock ticks only while a decision is in flight (and
//! for [`EPOCH_LINGER_TICKS`] after the last one, so a burst wakes it once), then sleeps on a
//! condition variable until the next decision enters.
//!
//! The hand-off is lock-free on the hot path: a decision bumps `in_flight` and looks at `state`;
//! the clock, before sleeping, publishes `PARKED` and looks at `in_flight`. Both use sequentially
//! consistent operations, so at least one side sees the other: either the clock sees the new
//! decision and keeps ticking, or the decision sees `PARKED` and wakes it under the lock.

use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use wasmtime::{Engine, EngineWeak};

use super::limits::{EPOCH_LINGER_TICKS, EPOCH_TICK};

const RUNNING: u8 = 0;
const PARKED: u8 = 1;
const STOPPING: u8 = 2;

struct Shared {
    in_flight: AtomicUsize,
    state: AtomicU8,
    /// Epoch increments so far (for tests and diagnostics).
    ticks: AtomicU64,
    lock: Mutex<()>,
    wake: Condvar,
}

/// Owns the clock thread; dropping it stops the thread (without waiting for it: an engine
/// dropped mid-tick does not wait out the tick).
pub(crate) struct EpochClock {
    shared: Arc<Shared>,
}

/// A decision in flight: the clock ticks until every guard is dropped.
pub(crate) struct InFlight<'a> {
    shared: &'a Shared,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, SeqCst);
    }
}

impl EpochClock {
    pub(crate) fn start(engine: &Engine) -> Self {
        let shared = Arc::new(Shared {
            in_flight: AtomicUsize::new(0),
            state: AtomicU8::new(RUNNING),
            ticks: AtomicU64::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let (for_thread, weak) = (shared.clone(), engine.weak());
        thread::Builder::new()
            .name("policy-epoch".into())
            .spawn(move || tick(&for_thread, &weak))
            .expect("spawn the policy epoch clock thread");
        EpochClock { shared }
    }

    /// Marks a decision in flight (instantiation included: a component's start function is
    /// guest code too), waking the clock if it sleeps.
    pub(crate) fn enter(&self) -> InFlight<'_> {
        let shared = &*self.shared;
        shared.in_flight.fetch_add(1, SeqCst);
        if shared.state.load(SeqCst) == PARKED {
            let _guard = shared.lock.lock().unwrap_or_else(|p| p.into_inner());
            shared.wake.notify_one();
        }
        InFlight { shared }
    }

    /// The clock is asleep (no decision in flight for a while).
    pub fn is_parked(&self) -> bool {
        self.shared.state.load(SeqCst) == PARKED
    }

    /// Epoch increments so far.
    pub fn ticks(&self) -> u64 {
        self.shared.ticks.load(SeqCst)
    }
}

impl Drop for EpochClock {
    fn drop(&mut self) {
        let _guard = self.shared.lock.lock().unwrap_or_else(|p| p.into_inner());
        self.shared.state.store(STOPPING, SeqCst);
        self.shared.wake.notify_one();
    }
}

fn tick(shared: &Shared, engine: &EngineWeak) {
    let mut idle_ticks = 0u32;
    loop {
        thread::sleep(EPOCH_TICK);
        if shared.state.load(SeqCst) == STOPPING {
            return;
        }
        match engine.upgrade() {
            Some(engine) => engine.increment_epoch(),
            None => return,
        }
        shared.ticks.fetch_add(1, SeqCst);
        if shared.in_flight.load(SeqCst) > 0 {
            idle_ticks = 0;
            continue;
        }
        idle_ticks += 1;
        if idle_ticks < EPOCH_LINGER_TICKS {
            continue;
        }
        let mut guard = shared.lock.lock().unwrap_or_else(|p| p.into_inner());
        if shared.state.compare_exchange(RUNNING, PARKED, SeqCst, SeqCst).is_err() {
            return; // stopping
        }
        while shared.in_flight.load(SeqCst) == 0 {
            guard = shared.wake.wait(guard).unwrap_or_else(|p| p.into_inner());
            if shared.state.load(SeqCst) == STOPPING {
                return;
            }
        }
        shared.state.store(RUNNING, SeqCst);
        idle_ticks = 0;
    }
}
