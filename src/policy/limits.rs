//! Every limit of the policy sandbox, in one place: the operator's knobs ([`SandboxLimits`],
//! from `VK_POLICY_*` or the config file), the fixed shape of one decision's instance (what the
//! pooling allocator reserves and the store's limiter enforces), the epoch clock, and the bounds
//! of a decision's text fields.

use std::time::Duration;

use serde::Deserialize;

/// Resource limits of one decision the operator may tune.
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
    /// The most one policy component may create per decision: core instances, linear
    /// memories, tables, elements in one table. A component beyond any of them is refused at
    /// load. The defaults admit componentize-py (CPython: 38 core instances) and the QuickJS
    /// and SpiderMonkey JavaScript components, with room to spare.
    #[serde(default = "SandboxLimits::default_core_instances")]
    pub max_core_instances: u32,
    #[serde(default = "SandboxLimits::default_memories")]
    pub max_memories: u32,
    #[serde(default = "SandboxLimits::default_tables")]
    pub max_tables: u32,
    #[serde(default = "SandboxLimits::default_table_elements")]
    pub max_table_elements: u32,
    /// Decisions of large components (beyond the small shape the Rust guests fit,
    /// [`PER_DECISION`]) that may run at once: they have a pool of their own, this size.
    #[serde(default = "SandboxLimits::default_large_concurrency")]
    pub max_concurrent_large: u32,
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
    fn default_core_instances() -> u32 {
        64
    }
    fn default_memories() -> u32 {
        4
    }
    fn default_tables() -> u32 {
        16
    }
    fn default_table_elements() -> u32 {
        65_536
    }
    fn default_large_concurrency() -> u32 {
        4
    }

    /// The shape of one large component's instance: what the large pool reserves per decision.
    pub fn large_shape(&self) -> InstanceShape {
        InstanceShape {
            core_instances: self.max_core_instances,
            memories: self.max_memories,
            tables: self.max_tables,
            table_elements: self.max_table_elements as usize,
        }
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
            max_core_instances: Self::default_core_instances(),
            max_memories: Self::default_memories(),
            max_tables: Self::default_tables(),
            max_table_elements: Self::default_table_elements(),
            max_concurrent_large: Self::default_large_concurrency(),
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

// ---- the epoch clock ---------------------------------------------------------------------

/// How often the epoch advances while a decision is in flight; deadlines are rounded up to
/// whole ticks.
pub const EPOCH_TICK: Duration = Duration::from_millis(1);
/// Ticks the clock keeps running after the last decision ended before it sleeps: a burst of
/// decisions (a restart's reconcile, a CreatePod's three slots) wakes it once, an idle daemon
/// not at all.
pub const EPOCH_LINGER_TICKS: u32 = 50;

// ---- the shape of one decision's instance --------------------------------------------------

/// What one decision may create. The pooling allocator reserves this much per concurrent
/// decision and the store's limiter refuses more. [`PER_DECISION`] is the small shape: a Rust
/// component has a few core instances (its module plus canonical-ABI shims), one or two
/// memories and a few tables; larger components run in a pool of [`SandboxLimits::large_shape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceShape {
    pub core_instances: u32,
    pub memories: u32,
    pub tables: u32,
    /// Elements one table may hold (and grow to).
    pub table_elements: usize,
}

pub const PER_DECISION: InstanceShape = InstanceShape {
    core_instances: 8,
    memories: 2,
    tables: 4,
    table_elements: 10_000,
};

/// Bytes of each freed linear memory kept mapped (the guests' 32 KiB stack, data and arena).
pub const KEEP_RESIDENT_BYTES: usize = 128 << 10;
/// Bytes of each freed table kept mapped (2,048 funcref slots: more than any policy uses).
pub const TABLE_KEEP_RESIDENT_BYTES: usize = 16 << 10;

// ---- bounds of a decision's fields -----------------------------------------------------------

/// Longest `reason` token accepted.
pub const MAX_REASON_LEN: usize = 64;
/// Longest message accepted (the lifecycle message annotation holds at most 4096 bytes).
pub const MAX_MESSAGE_LEN: usize = 4096;
/// Most bytes a guest fixup's argv may hold in all, and its hint (an annotation value).
pub const MAX_ARGV_BYTES: usize = 64 << 10;
pub const MAX_HINT_BYTES: usize = 64 << 10;

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
