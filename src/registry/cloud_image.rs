//! Cloud images for mode=run (cocoonstack's os-image artifact, imported with `cocoon image
//! import`): [`Registry::open_cloud_image`] classifies the artifact (a snapshot is refused: "use
//! mode=clone"), and [`Registry::write_cloud_image`] streams its disk layers, sorted by title,
//! verified and concatenated.

use super::client::Registry;
use super::errors::RegistryError;
use super::manifest::{self, OciManifest};
use super::media::{self, ArtifactKind};
use super::progress::Progress;
use super::pull::TarOut;
use futures::StreamExt;
use tokio::io::AsyncWrite;

/// A cloud image resolved for an import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudImageSource {
    pub repo: String,
    pub tag: String,
    /// The name `cocoon image import` gets (`repo:tag`).
    pub local_name: String,
    /// (title, digest, size), sorted by title.
    disks: Vec<(String, String, u64)>,
}

impl CloudImageSource {
    pub fn total_bytes(&self) -> u64 {
        self.disks.iter().map(|d| d.2).sum()
    }
}

impl Registry {
    /// Resolves `reference` (`repo[:tag]`, registry-relative). `None`: not a cloud image (container image,
    /// index, unknown, or no such tag) — use `cocoon image pull <ref>`. A snapshot is an error.
    pub async fn open_cloud_image(&self, reference: &str) -> Result<Option<CloudImageSource>, RegistryError> {
        if reference.is_empty() {
            return Err(RegistryError::InvalidRequest("empty image reference".into()));
        }
        let (repo, tag) = media::parse_ref(reference);
        let artifact = format!("{repo}:{tag}");
        let Some(f) = self.fetch_manifest(&repo, &tag).await? else {
            tracing::info!(%artifact, "no such tag in the registry; not a cloud image");
            return Ok(None);
        };
        let m = match (manifest::kind(&f.manifest), f.manifest) {
            (ArtifactKind::CloudImage, OciManifest::Image(m)) => m,
            (k, _) if k.is_snapshot() => return Err(RegistryError::SnapshotArtifact { artifact }),
            (k, _) => {
                tracing::info!(%artifact, kind = k.name(), "not a cloud image");
                return Ok(None);
            }
        };
        let mut disks = Vec::new();
        for l in &m.layers {
            let title = manifest::title(l).ok_or_else(|| RegistryError::InvalidArtifact {
                artifact: artifact.clone(),
                detail: format!("layer {} has no {} annotation", l.digest, media::ANN_TITLE),
                cause: None,
            })?;
            if !media::is_cloud_disk_layer(&l.media_type) {
                return Err(RegistryError::UnsupportedMediaType {
                    artifact: artifact.clone(),
                    title: title.to_string(),
                    media_type: l.media_type.clone(),
                });
            }
            if l.size < 0 {
                return Err(RegistryError::InvalidArtifact {
                    artifact: artifact.clone(),
                    detail: format!("layer {title:?} has a negative size"),
                    cause: None,
                });
            }
            disks.push((title.to_string(), l.digest.clone(), l.size as u64));
        }
        if disks.is_empty() {
            return Err(RegistryError::InvalidArtifact {
                artifact,
                detail: "the cloud image has no disk layers".into(),
                cause: None,
            });
        }
        disks.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(Some(CloudImageSource {
            local_name: artifact,
            repo,
            tag,
            disks,
        }))
    }

    /// Streams the disk layers of `src` into `sink`; returns the bytes written. On an error the caller
    /// must discard what was written.
    pub async fn write_cloud_image(
        &self,
        src: &CloudImageSource,
        sink: &mut (dyn AsyncWrite + Send + Unpin),
        progress: &Progress,
    ) -> Result<u64, RegistryError> {
        progress.set_total(src.total_bytes());
        tracing::info!(artifact = %src.local_name, layers = src.disks.len(), bytes = src.total_bytes(), "importing cloud image");
        let mut out = TarOut {
            sink,
            artifact: &src.local_name,
            sent: 0,
        };
        for (title, digest, size) in &src.disks {
            let mut s = std::pin::pin!(self.blob_stream(&src.repo, &src.tag, digest, *size, title).await?);
            while let Some(chunk) = s.next().await {
                let chunk = chunk?;
                out.write(&chunk).await?;
                progress.advance(chunk.len() as u64);
            }
        }
        out.flush().await?;
        Ok(out.sent)
    }
}
