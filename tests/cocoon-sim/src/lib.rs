//! cocoon-sim: a simulator of the `cocoon` CLI for vk-cocoon's tests.
//!
//! The binary `cocoon-sim` answers the same argv as `cocoon` (verbs, flags, JSON records; see
//! `README.md`) with the same JSON, error texts and exit codes. All state lives under
//! `COCOON_SIM_ROOT` and every read-modify-write happens under an exclusive file lock, so
//! concurrent invocations are safe.
//!
//! Tests drive it through [`Sim`] (fault injection, out-of-band VM flips, the exec and call logs).
//! The control file format is documented in `tests/cocoon-sim/README.md`.

pub mod cli;
pub mod control;
pub mod events;
pub mod helper;
pub mod image;
pub mod macos;
pub mod model;
pub mod snapshot;
pub mod store;
pub mod subnet;
pub mod tarfmt;
pub mod util;
pub mod vm;
pub mod vmm;

pub use control::{Control, ExecRule, Fault, FaultAction, Settings};
pub use helper::{CallRecord, EndRecord, ExecRecord, Flip, Sim};
