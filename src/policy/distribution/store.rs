//! Pulled policy artifacts on disk, by digest: `sha256/<hex>/manifest.json` (the manifest bytes as
//! the registry served them) and `blobs/<hex>` (its layers). Reading an entry re-verifies every
//! digest, so a damaged entry is pulled again rather than served. `tags/` remembers what a tag
//! last resolved to (only used when tags are allowed and the registry cannot be reached).

use std::fs;
use std::path::{Path, PathBuf};

use crate::host::fs::write_atomically;
use crate::registry::manifest::{parse_manifest, sha256_digest};
use crate::registry::{ArtifactLayer, PulledArtifact};

/// The artifact directory.
#[derive(Debug, Clone)]
pub struct ArtifactStore {
    dir: PathBuf,
}

fn hex_of(digest: &str) -> Option<&str> {
    digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl ArtifactStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ArtifactStore { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The stored artifact `digest`, if present and intact.
    pub fn get(&self, digest: &str) -> Option<PulledArtifact> {
        let hex = hex_of(digest)?;
        let manifest_path = self.dir.join("sha256").join(hex).join("manifest.json");
        let manifest_bytes = fs::read(&manifest_path).ok()?;
        let damaged = |what: &str| {
            tracing::warn!(path = %manifest_path.display(), what, "stored policy artifact is damaged; pulling it again");
        };
        if sha256_digest(&manifest_bytes) != digest {
            damaged("manifest digest");
            return None;
        }
        let Ok(crate::registry::manifest::OciManifest::Image(manifest)) = parse_manifest(&manifest_bytes) else {
            damaged("manifest JSON");
            return None;
        };
        let mut layers = Vec::new();
        for layer in &manifest.layers {
            let bytes = hex_of(&layer.digest).and_then(|h| fs::read(self.dir.join("blobs").join(h)).ok());
            match bytes {
                Some(bytes) if sha256_digest(&bytes) == layer.digest => layers.push(ArtifactLayer {
                    media_type: layer.media_type.clone(),
                    bytes,
                    annotations: layer.annotations.clone().unwrap_or_default().into_iter().collect(),
                }),
                _ => {
                    damaged("layer");
                    return None;
                }
            }
        }
        Some(PulledArtifact {
            digest: digest.to_string(),
            manifest_bytes,
            manifest,
            layers,
        })
    }

    /// Stores a verified artifact (blobs first, the manifest last: an entry whose manifest exists
    /// is complete).
    pub fn put(&self, artifact: &PulledArtifact) -> std::io::Result<()> {
        let hex = hex_of(&artifact.digest)
            .ok_or_else(|| std::io::Error::other(format!("not a sha256 digest: {}", artifact.digest)))?;
        for layer in &artifact.layers {
            let digest = sha256_digest(&layer.bytes);
            let blob_hex = hex_of(&digest).expect("sha256_digest's form");
            store_file(&self.dir.join("blobs").join(blob_hex), &layer.bytes)?;
        }
        store_file(
            &self.dir.join("sha256").join(hex).join("manifest.json"),
            &artifact.manifest_bytes,
        )
    }

    fn tag_path(&self, reference: &str) -> PathBuf {
        self.dir
            .join("tags")
            .join(sha256_digest(reference.as_bytes()).trim_start_matches("sha256:"))
    }

    /// Remembers that the tag reference `reference` resolved to `digest`.
    pub fn remember_tag(&self, reference: &str, digest: &str) -> std::io::Result<()> {
        store_file(&self.tag_path(reference), format!("{digest}\n{reference}\n").as_bytes())
    }

    /// What `reference` last resolved to.
    pub fn last_tag(&self, reference: &str) -> Option<String> {
        let text = fs::read_to_string(self.tag_path(reference)).ok()?;
        let digest = text.lines().next()?.trim().to_string();
        hex_of(&digest).is_some().then_some(digest)
    }
}

/// Writes one file of the store, its directory created when missing.
fn store_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    write_atomically(path, bytes, 0o600)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::ArtifactUpload;
    use std::collections::BTreeMap;

    fn artifact() -> PulledArtifact {
        let upload = ArtifactUpload {
            artifact_type: "t".into(),
            config_media_type: "c".into(),
            config: b"{}".to_vec(),
            layers: vec![ArtifactLayer {
                media_type: "application/wasm".into(),
                bytes: b"\0asm-component".to_vec(),
                annotations: BTreeMap::new(),
            }],
            annotations: BTreeMap::new(),
        };
        let manifest_bytes = upload.manifest_bytes();
        let Ok(crate::registry::manifest::OciManifest::Image(manifest)) = parse_manifest(&manifest_bytes) else {
            panic!("a manifest")
        };
        PulledArtifact {
            digest: sha256_digest(&manifest_bytes),
            manifest_bytes,
            manifest,
            layers: upload.layers,
        }
    }

    #[test]
    fn entries_round_trip_and_damage_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(dir.path());
        let a = artifact();
        assert!(store.get(&a.digest).is_none());
        store.put(&a).unwrap();
        let back = store.get(&a.digest).expect("stored");
        assert_eq!(back.layers[0].bytes, a.layers[0].bytes);
        // A damaged blob is not served.
        let blob = sha256_digest(&a.layers[0].bytes);
        fs::write(dir.path().join("blobs").join(&blob[7..]), b"tampered").unwrap();
        assert!(store.get(&a.digest).is_none());
    }

    #[test]
    fn tags_remember_their_last_digest() {
        let dir = tempfile::tempdir().unwrap();
        let store = ArtifactStore::new(dir.path());
        let digest = format!("sha256:{}", "a".repeat(64));
        assert_eq!(store.last_tag("oci://h/r:v1"), None);
        store.remember_tag("oci://h/r:v1", &digest).unwrap();
        assert_eq!(store.last_tag("oci://h/r:v1"), Some(digest));
        assert_eq!(store.last_tag("oci://h/r:v2"), None);
    }
}
