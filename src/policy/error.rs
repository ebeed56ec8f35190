//! Typed errors of the policy engine.

use std::path::PathBuf;
use std::time::Duration;

use super::slots::Slot;

/// Why a component cannot serve a slot. Raised at load, before any decision runs.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read policy component {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },

    #[error("{origin} is not a valid WebAssembly component: {detail}")]
    Corrupt { origin: String, detail: String },

    #[error("{origin} is too large for the policy sandbox: {detail}")]
    TooLarge { origin: String, detail: String },

    #[error(
        "{origin} imports {imports:?}, but the policy contract grants none beyond its types-only `types` interface; build the policy without WASI (a #![no_std] guest, see README \"Writing a policy\")"
    )]
    ForbiddenImports { origin: String, imports: Vec<String> },

    #[error(
        "{origin} does not implement slot {slot}: it must export {expected} (world {world} of wit/vk-policy.wit), but exports {found:?}"
    )]
    WrongWorld {
        origin: String,
        slot: Slot,
        expected: String,
        world: String,
        found: Vec<String>,
    },

    #[error(
        "{origin} implements slot {slot} of contract {found}, which this daemon does not speak; it speaks versions {spoken}: rebuild the policy against one of them (wit/vk-policy.wit is the newest)"
    )]
    UnsupportedVersion {
        origin: String,
        slot: Slot,
        found: String,
        spoken: String,
    },

    #[error("{origin} exports {expected} with the wrong types for slot {slot}: {detail}")]
    ExportMismatch {
        origin: String,
        slot: Slot,
        expected: String,
        detail: String,
    },

    #[error("{origin} failed its test table {table}: {failed} of {total} cases failed (first: {first})")]
    CasesFailed {
        origin: String,
        table: PathBuf,
        failed: usize,
        total: usize,
        first: String,
    },

    #[error("{origin}: {detail}")]
    Table { origin: String, detail: String },

    #[error("cannot fetch policy {reference}: {detail}")]
    Fetch { reference: String, detail: String },

    #[error("{origin} is for slot {found}, not {slot}: point the slot at an artifact pushed for it")]
    WrongSlot { origin: String, slot: Slot, found: Slot },
}

impl LoadError {
    /// Short label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            LoadError::Read { .. } => "read",
            LoadError::Corrupt { .. } => "corrupt",
            LoadError::TooLarge { .. } => "too_large",
            LoadError::ForbiddenImports { .. } => "forbidden_imports",
            LoadError::WrongWorld { .. } => "wrong_world",
            LoadError::UnsupportedVersion { .. } => "unsupported_version",
            LoadError::ExportMismatch { .. } => "export_mismatch",
            LoadError::CasesFailed { .. } | LoadError::Table { .. } => "cases_failed",
            LoadError::Fetch { .. } => "fetch",
            LoadError::WrongSlot { .. } => "wrong_slot",
        }
    }
}

/// Why one decision did not produce a usable answer. The caller substitutes the slot's
/// fail-safe decision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecisionError {
    #[error("policy {slot} ran past its {limit:?} deadline and was stopped")]
    Timeout { slot: Slot, limit: Duration },

    #[error("policy {slot} tried to use more than its {limit_bytes}-byte memory limit")]
    OutOfMemory { slot: Slot, limit_bytes: usize },

    #[error("policy {slot} trapped: {trap}")]
    Trap { slot: Slot, trap: String },

    #[error("policy {slot} answered an invalid decision: {detail}")]
    InvalidDecision { slot: Slot, detail: String },

    #[error("policy {slot} could not be instantiated: {detail}")]
    Instantiate { slot: Slot, detail: String },
}

impl DecisionError {
    /// Short label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            DecisionError::Timeout { .. } => "timeout",
            DecisionError::OutOfMemory { .. } => "out_of_memory",
            DecisionError::Trap { .. } => "trap",
            DecisionError::InvalidDecision { .. } => "invalid_decision",
            DecisionError::Instantiate { .. } => "instantiate",
        }
    }
}
