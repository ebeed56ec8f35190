//! Typed errors of the cocoon runtime client.

use std::time::Duration;

/// Everything a `cocoon` invocation can fail with. Only the `*NotFound` variants are definitive "gone";
/// [`RuntimeError::Command`], [`RuntimeError::Timeout`], I/O and decode errors are inconclusive.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cocoon {verb}: VM {reference:?} not found ({stderr})")]
    VmNotFound {
        verb: String,
        reference: String,
        stderr: String,
    },

    #[error("cocoon {verb}: snapshot {reference:?} not found ({stderr})")]
    SnapshotNotFound {
        verb: String,
        reference: String,
        stderr: String,
    },

    #[error("cocoon {verb}: image {reference:?} not found in any backend ({stderr})")]
    ImageNotFound {
        verb: String,
        reference: String,
        stderr: String,
    },

    /// A name is taken: `already exists` / `already in use by <holder>` / `held by <holder>`.
    #[error("cocoon {verb}: name {name:?} is already taken (holder {holder:?}): {stderr}")]
    NameTaken {
        verb: String,
        name: String,
        holder: Option<String>,
        stderr: String,
    },

    /// cocoon refuses the name itself (`vm name "x" is invalid: must match ...`, `invalid snapshot
    /// name`): the request can never succeed as it is.
    #[error("cocoon {verb}: name {name:?} is invalid: {stderr}")]
    InvalidName { verb: String, name: String, stderr: String },

    /// The snapshot is leased by an active operation (`is in use by an active`); retry later.
    #[error("cocoon {verb}: snapshot {reference:?} is in use by an active operation; retry later ({stderr})")]
    SnapshotInUse {
        verb: String,
        reference: String,
        stderr: String,
    },

    /// `vm exec`: the command in the guest exited with a non-zero status.
    #[error("cocoon vm exec: command exited with status {code}")]
    ExecExit { code: i32 },

    /// Any other failure of the CLI (inconclusive: never treat it as "not found").
    #[error("cocoon {verb} failed (exit {code:?}): {stderr}")]
    Command {
        verb: String,
        code: Option<i32>,
        stderr: String,
    },

    #[error("cocoon {verb} timed out after {after:?}; the process was killed")]
    Timeout { verb: String, after: Duration },

    #[error("cannot start `{bin}` for cocoon {verb}: {source} (check VK_COCOON_BIN and that the binary is executable)")]
    Spawn {
        verb: String,
        bin: String,
        source: std::io::Error,
    },

    #[error("cocoon {verb}: I/O error talking to the process: {source}")]
    Io { verb: String, source: std::io::Error },

    #[error("cocoon {verb}: cannot decode output: {detail} (output starts with {head:?})")]
    Decode { verb: String, detail: String, head: String },

    #[error("cocoon {verb}: empty VM record in JSON payload")]
    EmptyRecord { verb: String },

    #[error("invalid cocoon request: {0}")]
    InvalidRequest(String),
}

impl RuntimeError {
    /// Definitively absent (VM, snapshot or image).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            Self::VmNotFound { .. } | Self::SnapshotNotFound { .. } | Self::ImageNotFound { .. }
        )
    }

    pub fn is_vm_not_found(&self) -> bool {
        matches!(self, Self::VmNotFound { .. })
    }

    pub fn is_snapshot_not_found(&self) -> bool {
        matches!(self, Self::SnapshotNotFound { .. })
    }

    /// The request can never succeed as it is (a retry only repeats it).
    pub fn is_permanent(&self) -> bool {
        matches!(self, Self::InvalidName { .. } | Self::InvalidRequest(_))
    }

    /// Neither success nor a definitive answer: callers should retry or defer.
    pub fn is_inconclusive(&self) -> bool {
        matches!(
            self,
            Self::Command { .. } | Self::Timeout { .. } | Self::Io { .. } | Self::Decode { .. } | Self::Spawn { .. }
        )
    }

    /// The stderr cocoon printed, when the error came from it.
    pub fn stderr(&self) -> Option<&str> {
        match self {
            Self::VmNotFound { stderr, .. }
            | Self::SnapshotNotFound { stderr, .. }
            | Self::ImageNotFound { stderr, .. }
            | Self::NameTaken { stderr, .. }
            | Self::InvalidName { stderr, .. }
            | Self::SnapshotInUse { stderr, .. }
            | Self::Command { stderr, .. } => Some(stderr),
            _ => None,
        }
    }
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
