//! Snapshots and cloud images over a real OCI registry (issue 4; contracts B, behaviour §6).
//!
//! - [`config`]: `OCI_REGISTRY` parsing, scheme rule; unset = registry-less mode.
//! - [`media`]: media types and artifact classification (pure).
//! - [`manifest`]: manifest/index parsing, the camelCase config blob, the pull plan, the v1 manifest (pure).
//! - [`tarfmt`]: cocoon's A.6 tar headers on top of the `tar` crate (pure).
//! - [`client`]: [`Registry`] — manifest reads with a typed outcome, config blobs, verified blob streams,
//!   delete with the delete-by-digest fallback.
//! - [`push`], [`pull`], [`cloud_image`]: the three transfers.

pub mod client;
pub mod cloud_image;
pub mod config;
pub mod errors;
pub mod manifest;
pub mod media;
pub mod pull;
pub mod push;
pub mod tarfmt;

pub use client::{ArtifactInfo, ManifestLookup, Registry};
pub use cloud_image::CloudImage;
pub use config::RegistryConfig;
pub use errors::{ConfigError, RegistryError};
pub use manifest::{FileInfo, SnapshotConfig};
pub use pull::PullReport;
pub use push::PushReport;

/// Compile-time check: the provider runs these from spawned tasks, so their futures must be `Send`.
#[allow(dead_code)]
fn futures_are_send(r: &Registry, rt: &dyn crate::runtime::CocoonRuntime) {
    fn send<T: Send>(_: &T) {}
    send(&r.pull_snapshot(rt, "", "", ""));
    send(&r.push_snapshot(rt, "", "", "", ""));
    send(&r.ensure_cloud_image(rt, "", false));
    send(&r.delete_manifest("", ""));
    send(&r.manifest("", ""));
    send(&r.snapshot_config("", ""));
    fn sync<T: Send + Sync>() {}
    sync::<Registry>();
}
