//! Pure manifest logic on oci-client's manifest, index and descriptor types. This file owns parsing
//! (manifest or index), classification and index resolution; the camelCase snapshot config blob is in
//! `config`, the pull plan (which blobs make which tar entry, validated against the allowlist) in
//! `plan`, and the snapshot manifest a push writes in `write`. The public paths stay
//! `registry::manifest::*` (re-exported below).

use super::media::{self, ArtifactKind};
pub use oci_client::manifest::{ImageIndexEntry, OciDescriptor, OciImageIndex, OciImageManifest, OciManifest};
use serde_json::Value;
use std::collections::BTreeMap;

mod config;
mod plan;
mod write;

pub use config::{FileInfo, SnapshotConfig};
pub use plan::{BlobPart, FilePlan, PlanError, snapshot_plan};
pub use write::{PushedLayer, sha256_digest, snapshot_manifest};

/// The biggest config blob we read (a snapshot's config is a few KiB of JSON).
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;
/// The biggest manifest we accept.
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// Why a manifest document cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest is {bytes} bytes, more than the {max} allowed")]
    TooBig { bytes: usize, max: usize },
    #[error("manifest is not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("unsupported manifest schemaVersion {0}")]
    SchemaVersion(i64),
    #[error("image index is malformed: {0}")]
    MalformedIndex(#[source] serde_json::Error),
    #[error("manifest is malformed: {0}")]
    Malformed(#[source] serde_json::Error),
}

/// Parses a manifest or an index. Which one is decided by the media type (or, without one, by the
/// presence of `manifests` without `config`), so a malformed document gets the error of its own kind.
pub fn parse_manifest(bytes: &[u8]) -> Result<OciManifest, ManifestError> {
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(ManifestError::TooBig {
            bytes: bytes.len(),
            max: MAX_MANIFEST_BYTES,
        });
    }
    let v: Value = serde_json::from_slice(bytes).map_err(ManifestError::NotJson)?;
    let version = v.get("schemaVersion").and_then(Value::as_i64).unwrap_or(0);
    if version != 2 {
        return Err(ManifestError::SchemaVersion(version));
    }
    let media_type = v.get("mediaType").and_then(Value::as_str);
    let is_index = matches!(media_type, Some(media::OCI_INDEX) | Some(media::DOCKER_MANIFEST_LIST))
        || (media_type.is_none() && v.get("manifests").is_some() && v.get("config").is_none());
    if is_index {
        serde_json::from_value(v)
            .map(OciManifest::ImageIndex)
            .map_err(ManifestError::MalformedIndex)
    } else {
        serde_json::from_value(v)
            .map(OciManifest::Image)
            .map_err(ManifestError::Malformed)
    }
}

/// What an artifact is (an index is always an image index).
pub fn kind(m: &OciManifest) -> ArtifactKind {
    match m {
        OciManifest::ImageIndex(_) => ArtifactKind::ImageIndex,
        OciManifest::Image(m) => image_kind(m),
    }
}

pub fn image_kind(m: &OciImageManifest) -> ArtifactKind {
    media::classify(
        m.media_type.as_deref(),
        m.artifact_type.as_deref(),
        Some(m.config.media_type.as_str()),
    )
}

pub fn artifact_type(m: &OciManifest) -> Option<&str> {
    match m {
        OciManifest::Image(m) => m.artifact_type.as_deref(),
        OciManifest::ImageIndex(i) => i.artifact_type.as_deref(),
    }
}

pub fn annotations(m: &OciManifest) -> BTreeMap<String, String> {
    match m {
        OciManifest::Image(m) => m.annotations.clone(),
        OciManifest::ImageIndex(i) => i.annotations.clone(),
    }
    .unwrap_or_default()
}

/// The `org.opencontainers.image.title` of a layer, when set and non-empty.
pub fn title(d: &OciDescriptor) -> Option<&str> {
    d.annotations
        .as_ref()
        .and_then(|a| a.get(media::ANN_TITLE))
        .map(String::as_str)
        .filter(|t| !t.is_empty())
}

fn annotation<'a>(d: &'a OciDescriptor, key: &str) -> Option<&'a str> {
    d.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

/// The child of an index to use: `linux/amd64`, else the first whose architecture is not `unknown`.
pub fn resolve_index(index: &OciImageIndex) -> Option<&ImageIndexEntry> {
    let arch = |d: &ImageIndexEntry| d.platform.as_ref().map(|p| p.architecture.to_string());
    let os = |d: &ImageIndexEntry| d.platform.as_ref().map(|p| p.os.to_string());
    index
        .manifests
        .iter()
        .find(|d| os(d).as_deref() == Some("linux") && arch(d).as_deref() == Some("amd64"))
        .or_else(|| {
            index
                .manifests
                .iter()
                .find(|d| arch(d).as_deref().unwrap_or_default() != "unknown")
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn index_resolution() {
        let idx = parse_manifest(
            &serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": [
                {"mediaType": media::OCI_MANIFEST, "digest": "sha256:arm", "size": 1, "platform": {"os": "linux", "architecture": "arm64"}},
                {"mediaType": media::OCI_MANIFEST, "digest": "sha256:amd", "size": 1, "platform": {"os": "linux", "architecture": "amd64"}},
            ]}))
            .unwrap(),
        )
        .unwrap();
        assert_eq!(kind(&idx), ArtifactKind::ImageIndex);
        let OciManifest::ImageIndex(idx) = idx else {
            panic!("not an index")
        };
        assert_eq!(resolve_index(&idx).unwrap().digest, "sha256:amd");
        let idx2 = parse_manifest(
            &serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": [
                {"mediaType": media::OCI_MANIFEST, "digest": "sha256:att", "size": 1, "platform": {"os": "unknown", "architecture": "unknown"}},
                {"mediaType": media::OCI_MANIFEST, "digest": "sha256:arm", "size": 1, "platform": {"os": "linux", "architecture": "arm64"}},
            ]}))
            .unwrap(),
        )
        .unwrap();
        let OciManifest::ImageIndex(idx2) = idx2 else {
            panic!("not an index")
        };
        assert_eq!(resolve_index(&idx2).unwrap().digest, "sha256:arm");
        // A document without a media type is an index when it lists manifests and has no config.
        let bare = parse_manifest(br#"{"schemaVersion":2,"manifests":[]}"#).unwrap();
        assert_eq!(kind(&bare), ArtifactKind::ImageIndex);
        assert!(
            parse_manifest(br#"{"schemaVersion":1}"#)
                .unwrap_err()
                .to_string()
                .contains("schemaVersion 1")
        );
        assert!(
            parse_manifest(br#"{"schemaVersion":2,"config":{}}"#)
                .unwrap_err()
                .to_string()
                .contains("malformed")
        );
    }
}
