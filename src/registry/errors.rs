//! Typed registry errors. Every message names the artifact (`repo:tag`), what failed and what to do.

/// Errors of `OCI_REGISTRY` / `SNAPSHOT_*` configuration.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("OCI_REGISTRY={value:?} is invalid: {reason}; expected host[:port][/prefix], e.g. localhost:5000/cocoon")]
    Invalid { value: String, reason: String },
    #[error("{name}={value:?} is invalid: {reason}")]
    Setting {
        name: &'static str,
        value: String,
        reason: String,
    },
}

/// The error a [`RegistryError`] comes from (a connection's, a file's, a task's), kept as its
/// `source`: the message already says it in words (`detail`), the chain keeps the error itself.
/// Other typed errors that must stay `Clone` keep their sources with it too (the lease file's,
/// the serial console's, a snapshot plan's).
/// Behind an `Arc` because a `RegistryError` is `Clone`; two causes are equal when they read the same.
#[derive(Debug, Clone)]
pub struct Cause(std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>);

impl Cause {
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(error))
    }
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Cause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl PartialEq for Cause {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

impl Eq for Cause {}

/// Errors of registry operations. `Clone` so that concurrent pulls of one snapshot can share one outcome.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    /// The registry could not be reached or gave no definite answer (5xx, timeout, connection reset).
    /// Retry later; nothing was decided.
    #[error(
        "registry unavailable while {op} {artifact}: {detail}; check that the registry at {registry} is up and reachable, then retry"
    )]
    Unavailable {
        op: String,
        artifact: String,
        registry: String,
        detail: String,
        #[source]
        cause: Option<Cause>,
    },
    /// The registry refused the credentials or their rights (401 / 403, also after the token exchange).
    #[error(
        "registry {registry} refused {op} {artifact}: {detail}; check the credentials for {registry} in the docker config (DOCKER_CONFIG or ~/.docker/config.json) and their rights on the repository"
    )]
    Denied {
        op: String,
        artifact: String,
        registry: String,
        detail: String,
        #[source]
        cause: Option<Cause>,
    },
    /// The tag (or a blob it names) does not exist.
    #[error("{artifact} not found in the registry {registry}{detail}; push it first or fix the reference")]
    NotFound {
        artifact: String,
        registry: String,
        detail: String,
    },
    /// A blob's bytes do not match the digest or size of its descriptor.
    #[error(
        "{artifact}: blob {digest} ({what}) is corrupt: {detail}; the registry copy is damaged — re-push the snapshot"
    )]
    Corrupt {
        artifact: String,
        digest: String,
        what: String,
        detail: String,
        #[source]
        cause: Option<Cause>,
    },
    /// The manifest or config is malformed or uses something this daemon cannot read.
    #[error("{artifact}: invalid artifact: {detail}")]
    InvalidArtifact {
        artifact: String,
        detail: String,
        #[source]
        cause: Option<Cause>,
    },
    /// A layer media type outside the allowlist.
    #[error(
        "{artifact}: layer {title:?} has unsupported media type {media_type:?}; this daemon reads only cocoonstack snapshot layers (v1/v2) — re-push the snapshot with a supported cocoon version"
    )]
    UnsupportedMediaType {
        artifact: String,
        title: String,
        media_type: String,
    },
    /// mode=run was given a snapshot artifact.
    #[error("image {artifact} is a snapshot artifact; use mode=clone instead of mode=run")]
    SnapshotArtifact { artifact: String },
    /// The artifact is not what the operation expects (e.g. pulling a cloud image as a snapshot).
    #[error("{artifact} is a {kind} artifact, not a {expected}; use the matching mode for this image")]
    WrongKind {
        artifact: String,
        kind: String,
        expected: String,
    },
    /// Reading the snapshot stream handed to a push failed, or it is not a cocoon export.
    #[error("{artifact}: reading the snapshot stream failed: {detail}; nothing was tagged — retry the push")]
    Source {
        artifact: String,
        detail: String,
        #[source]
        cause: Option<Cause>,
    },
    /// The writer a pull streams into stopped accepting bytes (the importer quit; its own error says why).
    #[error("{artifact}: the import stopped reading: {detail}")]
    Sink {
        artifact: String,
        detail: String,
        #[source]
        cause: Option<Cause>,
    },
    /// Local I/O of a transfer failed.
    #[error("{artifact}: {step} failed: {detail}")]
    Io {
        artifact: String,
        step: String,
        detail: String,
        #[source]
        cause: Option<Cause>,
    },
    /// A bad argument (reference syntax etc.).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// A repository name or a tag outside the distribution grammar: refused before it reaches a URL
    /// (where `..` would take the request out of `OCI_REGISTRY`'s prefix).
    #[error(
        "{what} {name:?} is not a valid OCI {what}: {reason}; fix the image reference or the name it was made from"
    )]
    InvalidName {
        what: &'static str,
        name: String,
        reason: String,
    },
    /// The registry asked for credentials at a token realm the node does not send them to.
    #[error(
        "registry {registry} sent {op} {artifact} to the token realm {realm}, which {reason}; the node sends its registry credentials only to the registry's own host, over HTTPS unless the registry itself is plain HTTP — if {realm} is the registry's genuine token service, list its host in OCI_REGISTRY_TOKEN_REALMS"
    )]
    UntrustedRealm {
        op: String,
        artifact: String,
        registry: String,
        realm: String,
        reason: String,
    },
}

impl RegistryError {
    /// True when the registry could not give an authoritative answer (retry later; never treat as absent).
    pub fn is_unavailable(&self) -> bool {
        matches!(self, RegistryError::Unavailable { .. })
    }

    /// True when the artifact itself (or the name asked for) is wrong: retrying the same transfer
    /// cannot succeed until someone re-pushes the artifact or fixes the reference.
    pub fn is_bad_artifact(&self) -> bool {
        matches!(
            self,
            RegistryError::Corrupt { .. }
                | RegistryError::InvalidArtifact { .. }
                | RegistryError::UnsupportedMediaType { .. }
                | RegistryError::WrongKind { .. }
                | RegistryError::SnapshotArtifact { .. }
                | RegistryError::InvalidName { .. }
        )
    }
}
