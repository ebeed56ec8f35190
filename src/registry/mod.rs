//! Snapshots and cloud images over a real OCI registry (issue 4) — a pure OCI
//! adapter: it reads snapshot exports from readers and writes import streams into writers; running cocoon
//! is the caller's job (`provider::transfer`).
//!
//! - [`config`]: `OCI_REGISTRY` parsing, scheme rule; unset = registry-less mode.
//! - [`media`]: media types and artifact classification (pure).
//! - [`manifest`]: oci-client's manifest/index types, the camelCase config blob, the pull plan, the
//!   snapshot manifest a push writes (pure).
//! - [`tarfmt`]: cocoon's export/import tar headers on top of the `tar` crate (pure).
//! - [`client`]: [`Registry`] — manifest reads with a typed outcome, config blobs, verified blob streams.
//! - `distribution`: the distribution API requests (manifests, blobs), each answer held to its shape
//!   (`answer`: read whole to a limit, within a deadline; `names`: the name grammar);
//!   `auth`: every request authorized, the registry's token challenge answered where credentials may go.
//! - [`push`] (with `push_reader`, the export side, `chunk_compressor`, v2 chunks compressed one per
//!   core, and `upload`, blob uploads), [`pull`] (with `prefetch`: its
//!   blobs fetched in parallel ahead of the tar writer, within the pull budget),
//!   [`cloud_image`], `delete`: the transfers; [`progress`]: their byte counts.
//! - [`content`]: what a snapshot's files must be (sizes, sparse maps, blob digests), to check a copy
//!   obtained elsewhere (the peer tier) against.
//! - [`artifact`]: small in-memory artifacts (policy components) pushed and pulled by digest.

mod answer;
pub mod artifact;
mod auth;
mod chunk_compressor;
pub mod client;
pub mod cloud_image;
pub mod config;
pub mod content;
mod delete;
mod distribution;
pub mod errors;
pub mod manifest;
pub mod media;
mod names;
mod prefetch;
pub mod progress;
pub mod pull;
pub mod push;
mod push_reader;
pub mod tarfmt;
mod upload;

pub use artifact::{ArtifactLayer, ArtifactUpload, PulledArtifact};
pub use client::{ArtifactInfo, ManifestLookup, Registry};
pub use cloud_image::CloudImageSource;
pub use config::{RegistryConfig, TransferSettings};
pub use errors::{ConfigError, RegistryError};
pub use manifest::{FileInfo, SnapshotConfig};
pub use oci_client::secrets::RegistryAuth;
pub use progress::Progress;
pub use pull::{PullReport, SnapshotSource};
pub use push::{PushLabels, PushReport};

/// Compile-time check: the provider runs these from spawned tasks, so their futures must be `Send`.
#[allow(dead_code)]
fn futures_are_send(r: &Registry, src: &SnapshotSource, img: &CloudImageSource, p: &std::sync::Arc<Progress>) {
    fn send<T: Send>(_: &T) {}
    let export: Box<dyn tokio::io::AsyncRead + Send + Unpin> = Box::new(tokio::io::empty());
    let mut sink = tokio::io::sink();
    send(&r.push_snapshot(export, "", "", "", p.clone()));
    send(&r.open_snapshot("", ""));
    send(&r.write_snapshot(src, "", &mut sink, p));
    let mut sink = tokio::io::sink();
    send(&r.open_cloud_image(""));
    send(&r.write_cloud_image(img, &mut sink, p));
    send(&r.delete_manifest("", ""));
    send(&r.manifest("", ""));
    send(&r.snapshot_config("", ""));
    fn sync<T: Send + Sync>() {}
    sync::<Registry>();
}
