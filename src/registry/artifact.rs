//! Small generic OCI artifacts held in memory (policy components and their case tables): push a
//! manifest with an artifact type, a config blob and a few layers; pull one by digest with the
//! manifest and every blob verified against its digest and bounded in size, and the layer count
//! bounded before the first blob is fetched.

use super::client::Registry;
use super::distribution::Access;
use super::errors::RegistryError;
use super::manifest::{self, OciImageManifest, OciManifest};
use super::media;
use oci_client::manifest::OciDescriptor;
use std::collections::BTreeMap;

/// The most layers an artifact held in memory may have (a policy has a component and its case
/// table): with each layer bounded too, what a pull holds is bounded before anything is fetched.
pub const MAX_ARTIFACT_LAYERS: usize = 8;

/// One in-memory layer of an artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactLayer {
    pub media_type: String,
    pub bytes: Vec<u8>,
    pub annotations: BTreeMap<String, String>,
}

/// What [`Registry::push_artifact`] writes.
#[derive(Debug, Clone)]
pub struct ArtifactUpload {
    pub artifact_type: String,
    pub config_media_type: String,
    pub config: Vec<u8>,
    pub layers: Vec<ArtifactLayer>,
    pub annotations: BTreeMap<String, String>,
}

/// An artifact read by digest: the manifest bytes exactly as the registry stored them (their
/// SHA-256 is `digest`) and every layer, each checked against its descriptor.
#[derive(Debug, Clone)]
pub struct PulledArtifact {
    pub digest: String,
    pub manifest_bytes: Vec<u8>,
    pub manifest: OciImageManifest,
    pub layers: Vec<ArtifactLayer>,
}

impl ArtifactUpload {
    /// The manifest of this upload (what the registry stores under the returned digest).
    pub fn manifest_bytes(&self) -> Vec<u8> {
        let descriptor = |media_type: &str, bytes: &[u8], annotations: &BTreeMap<String, String>| OciDescriptor {
            media_type: media_type.to_string(),
            digest: manifest::sha256_digest(bytes),
            size: bytes.len() as i64,
            annotations: (!annotations.is_empty()).then(|| annotations.clone().into_iter().collect()),
            ..Default::default()
        };
        let m = OciImageManifest {
            schema_version: 2,
            media_type: Some(media::OCI_MANIFEST.to_string()),
            artifact_type: Some(self.artifact_type.clone()),
            config: descriptor(&self.config_media_type, &self.config, &BTreeMap::new()),
            layers: self
                .layers
                .iter()
                .map(|l| descriptor(&l.media_type, &l.bytes, &l.annotations))
                .collect(),
            subject: None,
            annotations: Some(self.annotations.clone().into_iter().collect()),
        };
        serde_json::to_vec(&m).expect("JSON of a manifest")
    }
}

impl Registry {
    /// Uploads the blobs an upload needs (skipping those present) and writes its manifest under
    /// `tag`. Returns the manifest digest.
    pub async fn push_artifact(&self, repo: &str, tag: &str, upload: &ArtifactUpload) -> Result<String, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let blobs = std::iter::once(&upload.config).chain(upload.layers.iter().map(|l| &l.bytes));
        for bytes in blobs {
            let digest = manifest::sha256_digest(bytes);
            if !self.blob_exists(repo, tag, &digest, "a blob", Access::Push).await? {
                self.put_blob(repo, tag, &digest, bytes.clone().into(), "a blob")
                    .await?;
            }
        }
        let body = upload.manifest_bytes();
        let digest = manifest::sha256_digest(&body);
        self.put_manifest(repo, tag, body, media::OCI_MANIFEST).await?;
        tracing::info!(%artifact, %digest, layers = upload.layers.len(), "artifact pushed");
        Ok(digest)
    }

    /// The digest `repo:tag` names now; `None` when the tag is absent.
    pub async fn resolve_tag(&self, repo: &str, tag: &str) -> Result<Option<String>, RegistryError> {
        Ok(match self.manifest(repo, tag).await? {
            super::ManifestLookup::Absent => None,
            super::ManifestLookup::Found(info) => Some(info.digest),
        })
    }

    /// Reads the image manifest `repo@digest` and all its layers, each at most `max_layer_bytes`.
    /// `None`: the registry does not have that manifest. A manifest or blob whose bytes do not hash
    /// to their digest is [`RegistryError::Corrupt`].
    pub async fn pull_artifact(
        &self,
        repo: &str,
        digest: &str,
        max_layer_bytes: u64,
    ) -> Result<Option<PulledArtifact>, RegistryError> {
        let artifact = format!("{repo}@{digest}");
        let Some(got) = self.get_manifest(repo, digest).await? else {
            return Ok(None);
        };
        let raw = got.bytes;
        let computed = manifest::sha256_digest(&raw);
        if computed != digest {
            return Err(RegistryError::Corrupt {
                artifact,
                digest: digest.to_string(),
                what: "manifest".into(),
                detail: format!("its bytes hash to {computed}"),
                cause: None,
            });
        }
        let manifest = match manifest::parse_manifest(&raw) {
            Ok(OciManifest::Image(m)) => m,
            Ok(OciManifest::ImageIndex(_)) => {
                return Err(RegistryError::InvalidArtifact {
                    artifact,
                    detail: "it is an image index, not an artifact manifest".into(),
                    cause: None,
                });
            }
            Err(e) => {
                return Err(RegistryError::InvalidArtifact {
                    artifact,
                    detail: e.to_string(),
                    cause: Some(super::errors::Cause::new(e)),
                });
            }
        };
        // Every layer is checked before the first is fetched: nothing is downloaded for an artifact
        // that would be refused anyway.
        if manifest.layers.len() > MAX_ARTIFACT_LAYERS {
            return Err(RegistryError::InvalidArtifact {
                artifact,
                detail: format!(
                    "it has {} layers (at most {MAX_ARTIFACT_LAYERS} are read); push the artifact with its component and case table only",
                    manifest.layers.len()
                ),
                cause: None,
            });
        }
        if let Some((i, layer)) =
            (manifest.layers.iter().enumerate()).find(|(_, l)| l.size < 0 || l.size as u64 > max_layer_bytes)
        {
            return Err(RegistryError::InvalidArtifact {
                artifact,
                detail: format!("layer {i} is {} bytes (at most {max_layer_bytes} are read)", layer.size),
                cause: None,
            });
        }
        let mut layers = Vec::with_capacity(manifest.layers.len());
        for (i, layer) in manifest.layers.iter().enumerate() {
            let what = format!("layer {i} ({})", layer.media_type);
            let bytes = self
                .fetch_small_blob(repo, digest, &layer.digest, layer.size as u64, &what)
                .await?;
            layers.push(ArtifactLayer {
                media_type: layer.media_type.clone(),
                bytes,
                annotations: layer.annotations.clone().unwrap_or_default().into_iter().collect(),
            });
        }
        Ok(Some(PulledArtifact {
            digest: digest.to_string(),
            manifest_bytes: raw.to_vec(),
            manifest,
            layers,
        }))
    }
}
