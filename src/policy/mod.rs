//! The policy engine: every decision vk-cocoon takes about a pod's VM runs as a sandboxed
//! WebAssembly component behind the WIT contract in `wit/vk-policy.wit`.
//!
//! - [`slot`]: the decision slots and their fail-safe rules.
//! - [`facts`] / [`decision`]: plain Rust inputs and outputs, converted to and from WIT.
//! - [`engine`] and [`limits`]: the wasmtime engine (pooling allocator, an epoch clock that runs
//!   only while a decision is in flight, concurrency cap) and every limit of the sandbox.
//! - [`LoadedPolicy`]: a component validated for a slot; one fresh instance per decision.
//! - [`Policies`]: the live set, swapped atomically on reload.
//! - [`cases`]: YAML case tables, run inside the sandbox (`vk-cocoon policy test`).
//! - [`config`] / [`reload`]: operator configuration and hot reload of policy files.

mod bindings;
pub mod cache;
pub mod cases;
mod clock;
mod component;
pub mod config;
pub mod decision;
pub mod engine;
pub mod error;
pub mod facts;
pub mod input;
pub mod limits;
mod loaded;
pub mod metrics;
pub mod reload;
mod sandbox;
mod set;
pub mod slot;

pub use cache::CompileCache;
pub use component::{Origin, implemented_slots};
pub use decision::{Decision, SlotDecision};
pub use engine::{PolicyEngine, SandboxLimits};
pub use error::{DecisionError, LoadError};
pub use facts::SlotFacts;
pub use loaded::LoadedPolicy;
pub use metrics::PolicyMetrics;
pub use set::Policies;
pub use slot::Slot;
