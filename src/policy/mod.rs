//! The policy engine: every decision vk-cocoon takes about a pod's VM runs as a sandboxed
//! WebAssembly component behind the WIT contract in `wit/vk-policy.wit`.
//!
//! - [`contract`]: the contract's types (bindgen of the WIT, current and 0.1.0 versions).
//! - [`slots`]: one [`PolicySlot`] per decision slot — facts, decision, pre-instance, call,
//!   fail-safe, validation, the 0.1.0 adapter; everything below is generic over it.
//! - [`engine`] and [`limits`]: the wasmtime engine (pooling allocator, an epoch clock that runs
//!   only while a decision is in flight, concurrency cap) and every limit in one place;
//!   [`compile_worker`]: the daemon compiles components in a child process.
//! - [`shape`]: what one instance of a component creates, read from its bytes at load: it picks
//!   the instance pool (small for the Rust guests, large for CPython or QuickJS) or refuses it.
//! - [`LoadedPolicy`]: a component validated for a slot; one fresh instance per decision.
//! - [`Policies`]: the live set, swapped atomically on reload.
//! - [`cases`] / [`input`]: YAML case tables and decision inputs, run inside the sandbox.
//! - [`config`] / [`reload`]: operator configuration and hot reload of policy files and of
//!   the configuration itself; [`distribution`]: components as OCI artifacts, by digest.
//! - [`decision_log`]: `VK_DECISION_LOG`, one JSON line per decision (replayed by `policy eval`).
//! - [`status`]: what serves each slot and how the last reloads went (shown on the Node).

pub mod cache;
pub mod cases;
mod clock;
pub mod compile_worker;
mod component;
pub mod config;
pub mod contract;
pub mod decision_log;
pub mod distribution;
pub mod engine;
pub mod error;
pub mod input;
pub mod limits;
mod loaded;
pub mod metrics;
pub mod reload;
pub(crate) mod sandbox;
mod set;
pub mod shape;
pub mod slots;
pub mod status;

pub use cache::CompileCache;
pub use component::Origin;
pub use contract::ContractVersion;
pub use engine::{PolicyEngine, SandboxLimits};
pub use error::{DecisionError, LoadError};
pub use loaded::LoadedPolicy;
pub use metrics::PolicyMetrics;
pub use set::Policies;
pub use slots::{PolicySlot, Slot, SlotVisitor, with_slot};

/// The contract interfaces a component exports (`(interface, version)`), whatever their
/// version: what `policy check` reports before validating a slot.
pub fn contract_exports(
    engine: &PolicyEngine,
    cache: Option<&CompileCache>,
    origin: &Origin,
    bytes: &[u8],
) -> Result<Vec<(String, String)>, LoadError> {
    let compiled = component::compile(engine, cache, origin, bytes)?;
    Ok(component::contract_exports(&compiled.component))
}
