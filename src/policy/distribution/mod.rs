//! Policies as OCI artifacts: a slot may name `oci://REGISTRY/REPOSITORY@sha256:…` instead of a
//! file. The artifact carries the component and its case table ([`mod@format`]); pulled artifacts are
//! kept by digest ([`store`]) so a node restarts through a registry outage; [`fetch`] decides
//! where bytes come from. Validation and the case table run exactly as for files (`reload`).

pub mod fetch;
pub mod format;
pub mod reference;
pub mod store;

pub use fetch::{Fetched, PolicyFetcher, registry_for};
pub use format::{MAX_LAYER_BYTES, PolicyArtifact};
pub use reference::{Pin, PolicyRef};
pub use store::ArtifactStore;
