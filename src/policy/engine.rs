//! The wasmtime engine every policy runs in: component model, pooling allocator, an epoch
//! ticker for deadlines, and a cap on concurrent decisions (the pool has a fixed size).

use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use serde::Deserialize;
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// How often the epoch advances; deadlines are rounded up to whole ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);

/// Resource limits of one decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SandboxLimits {
    /// Linear memory a policy instance may use.
    #[serde(default = "SandboxLimits::default_memory_bytes")]
    pub memory_bytes: usize,
    /// Wall-clock budget of one decision.
    #[serde(default = "SandboxLimits::default_timeout", with = "millis")]
    pub timeout: Duration,
    /// Decisions that may run at once (the instance pool is sized from it).
    #[serde(default = "SandboxLimits::default_concurrency")]
    pub max_concurrent: u32,
}

impl SandboxLimits {
    fn default_memory_bytes() -> usize {
        32 << 20
    }
    fn default_timeout() -> Duration {
        Duration::from_millis(100)
    }
    fn default_concurrency() -> u32 {
        32
    }

    /// Epoch ticks that cover the timeout (at least one whole tick more than asked).
    pub fn deadline_ticks(&self) -> u64 {
        let ticks = self.timeout.as_micros().div_ceil(EPOCH_TICK.as_micros());
        u64::try_from(ticks).unwrap_or(u64::MAX).saturating_add(1)
    }
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            memory_bytes: Self::default_memory_bytes(),
            timeout: Self::default_timeout(),
            max_concurrent: Self::default_concurrency(),
        }
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// Instances, memories and tables each decision may create (a component has a few core
/// instances: its module plus canonical-ABI shims).
const CORE_INSTANCES_PER_DECISION: u32 = 8;
const TABLES_PER_DECISION: u32 = 4;
const MEMORIES_PER_DECISION: u32 = 2;
const TABLE_ELEMENTS: usize = 10_000;
/// Bytes of each freed linear memory kept mapped (the guests' 32 KiB stack, data and arena).
const KEEP_RESIDENT_BYTES: usize = 128 << 10;
/// Bytes of each freed table kept mapped (2,048 funcref slots: more than any policy uses).
const TABLE_KEEP_RESIDENT_BYTES: usize = 16 << 10;

/// The shared engine of all slots.
#[derive(Clone)]
pub struct PolicyEngine {
    engine: Engine,
    limits: SandboxLimits,
    permits: Arc<Permits>,
}

impl PolicyEngine {
    pub fn new(limits: SandboxLimits) -> wasmtime::Result<Self> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        config.memory_init_cow(true);
        let mut pool = PoolingAllocationConfig::new();
        let n = limits.max_concurrent.max(1);
        pool.total_component_instances(n)
            .total_core_instances(n * CORE_INSTANCES_PER_DECISION)
            .total_memories(n * MEMORIES_PER_DECISION)
            .total_tables(n * TABLES_PER_DECISION)
            .max_memories_per_component(MEMORIES_PER_DECISION)
            .max_tables_per_component(TABLES_PER_DECISION)
            .max_core_instances_per_component(CORE_INSTANCES_PER_DECISION)
            .table_elements(TABLE_ELEMENTS)
            .max_memory_size(limits.memory_bytes)
            // Reset the first pages of a freed memory with memset instead of unmapping them:
            // the next decision's stack and data reuse them without page faults (each
            // instance still starts from a clean image).
            .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
            // Likewise for tables: without it every freed table's pages are given back with
            // madvise, and the next decision page-faults them in again (a TLB shootdown each
            // time). This one setting took the decision p50 from ~12 to ~6.5 µs.
            .table_keep_resident(TABLE_KEEP_RESIDENT_BYTES);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config)?;
        start_epoch_ticker(&engine);
        Ok(PolicyEngine {
            engine,
            limits,
            permits: Arc::new(Permits::new(n)),
        })
    }

    pub fn wasmtime(&self) -> &Engine {
        &self.engine
    }

    pub fn limits(&self) -> SandboxLimits {
        self.limits
    }

    /// Waits for a free instance slot; the guard gives it back when dropped.
    pub(crate) fn acquire(&self) -> Permit<'_> {
        self.permits.acquire()
    }

    /// A key identifying compiled artifacts this engine can load: same wasmtime build and
    /// same compilation settings.
    pub fn compatibility_key(&self) -> String {
        use std::hash::{Hash, Hasher};
        // DefaultHasher with its fixed keys is deterministic for one build of the binary, and
        // the key also names the wasmtime version, so a stale entry is never loaded.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut hasher);
        format!("wasmtime-48.0.8-{:016x}", hasher.finish())
    }
}

/// Advances the epoch every tick while the engine lives; the thread holds only a weak
/// reference, so it ends with the engine.
fn start_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    thread::Builder::new()
        .name("policy-epoch".into())
        .spawn(move || {
            loop {
                thread::sleep(EPOCH_TICK);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        })
        .expect("spawn the policy epoch ticker thread");
}

/// A counting semaphore over the instance pool: instantiating past the pool's size fails, so
/// callers wait for a slot instead.
struct Permits {
    free: Mutex<u32>,
    returned: Condvar,
}

impl Permits {
    fn new(n: u32) -> Self {
        Permits {
            free: Mutex::new(n),
            returned: Condvar::new(),
        }
    }

    fn acquire(&self) -> Permit<'_> {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        while *free == 0 {
            free = self.returned.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
        Permit { permits: self }
    }
}

pub(crate) struct Permit<'a> {
    permits: &'a Permits,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        let mut free = self.permits.free.lock().unwrap_or_else(|p| p.into_inner());
        *free += 1;
        self.permits.returned.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_round_up_to_whole_ticks() {
        let limits = SandboxLimits {
            timeout: Duration::from_micros(2500),
            ..SandboxLimits::default()
        };
        assert_eq!(limits.deadline_ticks(), 4);
        let limits = SandboxLimits {
            timeout: Duration::from_millis(100),
            ..SandboxLimits::default()
        };
        assert_eq!(limits.deadline_ticks(), 101);
    }

    #[test]
    fn limits_parse_from_yaml_with_defaults() {
        let limits: SandboxLimits = serde_yaml_ng::from_str("timeout: 20\nmemory-bytes: 1048576").unwrap();
        assert_eq!(limits.timeout, Duration::from_millis(20));
        assert_eq!(limits.memory_bytes, 1 << 20);
        assert_eq!(limits.max_concurrent, 32);
    }
}
