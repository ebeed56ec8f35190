//! The wasmtime engines every policy runs in: component model, pooling allocator (a small pool
//! for the Rust guests, a large one for components that need more, see [`PolicyEngine`]), an
//! epoch clock per pool for deadlines (running only while a decision is in flight), and a cap on
//! concurrent decisions (each pool has a fixed size). The limits live in [`super::limits`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use wasmtime::component::Component;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::clock::{EpochClock, InFlight};
use super::compile_worker::CompileLimits;
pub use super::limits::SandboxLimits;
use super::limits::{InstanceShape, KEEP_RESIDENT_BYTES, PER_DECISION, TABLE_KEEP_RESIDENT_BYTES};
use super::shape::ComponentShape;

/// Which instance pool a component runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolSize {
    /// The small shape ([`PER_DECISION`]) every Rust guest fits: sized for `max-concurrent`.
    Small,
    /// The operator's large shape ([`SandboxLimits::large_shape`]): sized for
    /// `max-concurrent-large`, created at the first component that needs it.
    Large,
}

/// One pooled wasmtime engine: its own instance pool, epoch clock and concurrency cap. A
/// component is compiled for, and only instantiates in, the engine of its pool.
struct Pool {
    engine: Engine,
    shape: InstanceShape,
    permits: Permits,
    clock: EpochClock,
}

impl Pool {
    fn new(limits: &SandboxLimits, shape: InstanceShape, concurrency: u32) -> wasmtime::Result<Self> {
        let mut config = code_settings();
        let mut pool = PoolingAllocationConfig::new();
        let n = concurrency.max(1);
        pool.total_component_instances(n)
            .total_core_instances(n * shape.core_instances)
            .total_memories(n * shape.memories)
            .total_tables(n * shape.tables)
            .max_memories_per_component(shape.memories)
            .max_tables_per_component(shape.tables)
            .max_core_instances_per_component(shape.core_instances)
            .table_elements(shape.table_elements)
            .max_memory_size(limits.memory_bytes)
            // Reset the first pages of a freed memory with memset instead of unmapping them:
            // the next decision's stack and data reuse them without page faults (each
            // instance still starts from a clean image).
            .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
            // Likewise for tables: without it every freed table's pages are given back with
            // madvise, and the next decision page-faults them in again (a TLB shootdown each
            // time). This one setting took the decision p50 from ~12 to ~6.5 µs.
            .table_keep_resident(TABLE_KEEP_RESIDENT_BYTES);
        if shape == PER_DECISION {
            // Reset only the pages the instance wrote (the kernel's PAGEMAP_SCAN, one ioctl)
            // instead of memsetting all it keeps resident: a Rust guest's memory is 128 KiB, of
            // which a decision writes a few pages (stack top, data, the start of its arena), and
            // the memset of the whole was a fifth of a decision. Without the ioctl (an older
            // kernel) wasmtime falls back to the memset. The large pool keeps the reset it was
            // measured with (its heaps are megabytes, scanned page by page; not measured yet).
            pool.pagemap_scan(wasmtime::Enabled::Yes);
        }
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config)?;
        let clock = EpochClock::start(&engine);
        Ok(Pool {
            engine,
            shape,
            permits: Permits::new(n),
            clock,
        })
    }
}

/// The shared engine of all slots.
///
/// Two pools, not one: the Rust guests fit a small shape (8 core instances, 2 memories), and
/// the pool's per-slot reservation and its reset work on every decision follow the shape. Making
/// the one pool large enough for CPython (38 core instances) would make every Rust decision pay
/// for it. On-demand allocation for large components was the other choice; a pool keeps their
/// memories mapped between decisions and resets them from the copy-on-write image, which is
/// what keeps a 12 MiB CPython heap cheap to instantiate, so large components get a pool of
/// their own, smaller in count (`max-concurrent-large`) and created only when a large component
/// is first loaded (a daemon of Rust guests reserves nothing for it).
#[derive(Clone)]
pub struct PolicyEngine {
    small: Arc<Pool>,
    large: Arc<OnceLock<Result<Pool, String>>>,
    limits: SandboxLimits,
    /// The binary that compiles components in a child process ([`super::compile_worker`]),
    /// and its limits; `None` compiles in this process (the authors' tools, tests).
    compile_worker: Option<Arc<(PathBuf, CompileLimits)>>,
}

impl PolicyEngine {
    pub fn new(limits: SandboxLimits) -> wasmtime::Result<Self> {
        let small = Pool::new(&limits, PER_DECISION, limits.max_concurrent)?;
        Ok(PolicyEngine {
            small: Arc::new(small),
            large: Arc::new(OnceLock::new()),
            limits,
            compile_worker: None,
        })
    }

    fn pool(&self, size: PoolSize) -> wasmtime::Result<&Pool> {
        match size {
            PoolSize::Small => Ok(&self.small),
            PoolSize::Large => self
                .large
                .get_or_init(|| {
                    let limits = self.limits;
                    Pool::new(&limits, limits.large_shape(), limits.max_concurrent_large)
                        .map_err(|e| format!("cannot create the instance pool of large policy components: {e:#}"))
                })
                .as_ref()
                .map_err(|e| wasmtime::Error::msg(e.clone())),
        }
    }

    /// The pool a component of `shape` runs in: the small one when it fits, else the large one;
    /// an error naming the limit and its setting when the slot's limits do not admit it.
    pub(crate) fn place(&self, shape: &ComponentShape) -> Result<PoolSize, String> {
        if let Some(refusal) = shape.exceeds(&self.limits) {
            return Err(refusal);
        }
        Ok(if shape.fits(&PER_DECISION) {
            PoolSize::Small
        } else {
            PoolSize::Large
        })
    }

    /// Compiles components in child processes started from `exe` (this binary): what the
    /// daemon does, so that the compiler never runs, or stays resident, in it.
    pub fn compile_in_worker(mut self, exe: PathBuf, limits: CompileLimits) -> Self {
        self.compile_worker = Some(Arc::new((exe, limits)));
        self
    }

    /// Compiles a component to native code; returns it loaded and as the artifact the compile
    /// cache keeps. In the compile worker when there is one: a worker that cannot run, or whose
    /// artifact this engine refuses, costs a warning and an in-process compile; a component the
    /// worker failed on is an error, since compiling it here would risk the daemon.
    pub(crate) fn compile(&self, component: &[u8], size: PoolSize) -> wasmtime::Result<(Component, Vec<u8>)> {
        use super::compile_worker::{self, WorkerError};
        let engine = &self.pool(size)?.engine;
        if let Some(worker) = &self.compile_worker {
            let (exe, limits) = &**worker;
            match compile_worker::compile(exe, *limits, component) {
                Ok(artifact) => match load_native(engine, &artifact) {
                    Ok(loaded) => {
                        tracing::debug!(
                            component_bytes = component.len(),
                            artifact_bytes = artifact.len(),
                            "policy compiled in a worker process"
                        );
                        return Ok((loaded, artifact));
                    }
                    Err(error) => tracing::warn!(
                        worker = %exe.display(), error = %format!("{error:#}"),
                        "the compile worker's artifact does not load in this engine; compiling in the daemon"
                    ),
                },
                Err(WorkerError::Failed(message)) => return Err(wasmtime::Error::msg(message)),
                Err(WorkerError::Unavailable(why)) => tracing::warn!(
                    worker = %exe.display(), %why,
                    "cannot compile the policy in a worker process; compiling in the daemon"
                ),
            }
        }
        let artifact = engine.precompile_component(component)?;
        let loaded = load_native(engine, &artifact)?;
        Ok((loaded, artifact))
    }

    /// Loads an artifact of the daemon's compile cache into the engine of the pool of `size`.
    /// The cache keeps only what this daemon compiled: its directory is refused when another
    /// user could write it, each entry's SHA-256 is checked on read, and its key carries the
    /// engine's compatibility settings (`policy/cache.rs`).
    pub(crate) fn load_cached(&self, artifact: &[u8], size: PoolSize) -> wasmtime::Result<Component> {
        load_native(&self.pool(size)?.engine, artifact)
    }

    /// The engine of the small pool (the Rust guests').
    pub fn wasmtime(&self) -> &Engine {
        &self.small.engine
    }

    pub fn limits(&self) -> SandboxLimits {
        self.limits
    }

    /// Waits for a free instance slot and starts the epoch clock; the guard gives both back
    /// when dropped.
    pub(crate) fn acquire(&self, size: PoolSize) -> wasmtime::Result<Permit<'_>> {
        let pool = self.pool(size)?;
        let slot = pool.permits.acquire();
        Ok(Permit {
            engine: &pool.engine,
            shape: pool.shape,
            _clock: pool.clock.enter(),
            _slot: slot,
        })
    }

    /// The small pool's epoch clock is asleep: no decision is in flight and none ended recently.
    pub fn clock_parked(&self) -> bool {
        self.small.clock.is_parked()
    }

    /// The small pool's epoch ticks so far (the clock's wake-ups).
    pub fn clock_ticks(&self) -> u64 {
        self.small.clock.ticks()
    }

    /// Whether the pool of large components exists (it is created at the first one loaded).
    pub fn has_large_pool(&self) -> bool {
        self.large.get().is_some_and(|pool| pool.is_ok())
    }

    /// A key identifying compiled artifacts this engine can load: same wasmtime build and
    /// same compilation settings.
    pub fn compatibility_key(&self) -> String {
        use std::hash::{Hash, Hasher};
        // DefaultHasher with its fixed keys is deterministic for one build of the binary, and
        // the key also names the wasmtime version, so a stale entry is never loaded.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        // Both pools share the code settings (`code_settings`), so one key covers both.
        self.small.engine.precompile_compatibility_hash().hash(&mut hasher);
        format!("wasmtime-48.0.8-{:016x}", hasher.finish())
    }
}

/// The settings that shape compiled code. The instance allocator is not one of them, so the
/// compile worker's engine, built from these alone, compiles code the daemon's pooled engine
/// loads (a test checks it).
fn code_settings() -> Config {
    let mut config = Config::new();
    config.wasm_component_model(true);
    config.epoch_interruption(true);
    config.memory_init_cow(true);
    config
}

/// Loads native code into `engine`: the only place the crate runs machine code it did not link.
///
/// wasmtime cannot check that an artifact's code is what its compiler would emit (that is why
/// its loader is `unsafe`), so every artifact must be this daemon's own work. The three sources
/// that reach here are: this engine's `precompile_component`, the compile worker (this same
/// executable, run as a child, its output read from its stdout), and the compile cache, which
/// holds only those two's output (see [`PolicyEngine::load_cached`]). wasmtime still checks the
/// artifact's header against the engine's settings and refuses a mismatch.
#[allow(unsafe_code)]
fn load_native(engine: &Engine, artifact: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: the artifact is the daemon's own compiler output, as stated above.
    unsafe { Component::deserialize(engine, artifact) }
}

/// An engine that only compiles: the daemon's code settings, no instance pool (which reserves
/// address space for every pooled memory), so the compile worker can run under an
/// address-space limit.
pub(crate) fn compiling_engine() -> wasmtime::Result<Engine> {
    Engine::new(&code_settings())
}

/// A counting semaphore over the instance pool: instantiating past the pool's size fails, so
/// callers wait for a slot instead. Taking and giving back a slot is one atomic operation while
/// the pool has room (every decision does both); the lock and the condition variable are only
/// for callers that have to wait, and a returned slot wakes someone only when someone waits.
struct Permits {
    free: AtomicU32,
    /// Callers waiting (or about to wait) for a slot; changed under `lock`.
    waiting: AtomicU32,
    lock: Mutex<()>,
    returned: Condvar,
}

impl Permits {
    fn new(n: u32) -> Self {
        Permits {
            free: AtomicU32::new(n),
            waiting: AtomicU32::new(0),
            lock: Mutex::new(()),
            returned: Condvar::new(),
        }
    }

    /// Takes a slot if one is free.
    fn try_take(&self) -> bool {
        self.free
            .fetch_update(SeqCst, SeqCst, |free| free.checked_sub(1))
            .is_ok()
    }

    fn acquire(&self) -> PoolSlot<'_> {
        if !self.try_take() {
            // A waiter announces itself under the lock before looking again, and a returner
            // adds its slot before looking for waiters (both sequentially consistent): either the
            // waiter sees the slot, or the returner sees the waiter and wakes it under the lock,
            // which the waiter holds until it sleeps.
            let mut guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.waiting.fetch_add(1, SeqCst);
            while !self.try_take() {
                guard = self.returned.wait(guard).unwrap_or_else(|p| p.into_inner());
            }
            self.waiting.fetch_sub(1, SeqCst);
        }
        PoolSlot { permits: self }
    }
}

struct PoolSlot<'a> {
    permits: &'a Permits,
}

impl Drop for PoolSlot<'_> {
    fn drop(&mut self) {
        let permits = self.permits;
        permits.free.fetch_add(1, SeqCst);
        if permits.waiting.load(SeqCst) > 0 {
            let _guard = permits.lock.lock().unwrap_or_else(|p| p.into_inner());
            permits.returned.notify_one();
        }
    }
}

/// One decision's hold on the engine: a pool slot and a running epoch clock, and the engine
/// and shape of that pool (for the decision's store).
pub(crate) struct Permit<'a> {
    pub(crate) engine: &'a Engine,
    pub(crate) shape: InstanceShape,
    _clock: InFlight<'a>,
    _slot: PoolSlot<'a>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::yield_now();
        }
    }

    #[test]
    fn code_compiled_without_the_pool_loads_in_every_daemon_engine() {
        use crate::policy::slots::{CpuClassAdmission, PolicySlot};
        let artifact = compiling_engine()
            .unwrap()
            .precompile_component(CpuClassAdmission::default_component())
            .unwrap();
        let small = SandboxLimits {
            memory_bytes: 1 << 20,
            timeout: std::time::Duration::from_millis(5),
            max_concurrent: 1,
            ..SandboxLimits::default()
        };
        for limits in [SandboxLimits::default(), small] {
            let engine = PolicyEngine::new(limits).unwrap();
            engine
                .load_cached(&artifact, PoolSize::Small)
                .unwrap_or_else(|e| panic!("{limits:?}: {e:#}"));
        }
    }

    #[test]
    fn the_epoch_clock_ticks_only_while_a_decision_is_in_flight() {
        let engine = PolicyEngine::new(SandboxLimits::default()).unwrap();
        wait_for("the idle clock to park", || engine.clock_parked());
        let parked_at = engine.clock_ticks();
        {
            let _permit = engine.acquire(PoolSize::Small).unwrap();
            assert!(!engine.clock_parked() || engine.clock_ticks() == parked_at);
            wait_for("a tick while in flight", || engine.clock_ticks() > parked_at + 2);
        }
        wait_for("the clock to park again", || engine.clock_parked());
        let ticks = engine.clock_ticks();
        // Asleep means asleep: no tick over twenty tick periods.
        std::thread::sleep(super::super::limits::EPOCH_TICK * 20);
        assert_eq!(engine.clock_ticks(), ticks, "a parked clock does not tick");
        assert!(
            ticks - parked_at >= u64::from(super::super::limits::EPOCH_LINGER_TICKS),
            "it lingers after the last decision: {} ticks",
            ticks - parked_at
        );
    }
}
