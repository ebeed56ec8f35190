//! Cloud images for mode=run (contracts B.4, behaviour §4b "ensure run image" / §6.4): classify the
//! artifact; a cloud image's disk layers, sorted by title, are streamed verified and concatenated into
//! `cocoon image import <repo:tag>`. A snapshot artifact is refused ("use mode=clone").

use super::client::Registry;
use super::errors::RegistryError;
use super::media::{self, ArtifactKind};
use super::pull::{is_import_stopped, receiver_stream, send};
use crate::runtime::CocoonRuntime;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;

/// Outcome of [`Registry::ensure_cloud_image`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudImage {
    /// The image is available locally under `local_name` (`repo:tag`): imported now, or already present.
    Imported { local_name: String },
    /// Not a cloud image (container image, index, unknown, or no such tag): use `cocoon image pull <ref>`.
    NotACloudImage,
}

impl Registry {
    /// Ensures the cloud image `reference` (`repo[:tag]`, registry-relative) is imported. Registry errors
    /// come back as errors (the behaviour spec's caller falls back to `cocoon image pull` on them).
    pub async fn ensure_cloud_image(
        &self,
        runtime: &dyn CocoonRuntime,
        reference: &str,
        force: bool,
    ) -> Result<CloudImage, RegistryError> {
        if reference.is_empty() {
            return Err(RegistryError::InvalidRequest("empty image reference".into()));
        }
        let (repo, tag) = media::parse_ref(reference);
        let artifact = format!("{repo}:{tag}");
        let Some(f) = self.fetch_manifest(&repo, &tag).await? else {
            tracing::info!(%artifact, "no such tag in the registry; not a cloud image");
            return Ok(CloudImage::NotACloudImage);
        };
        match f.manifest.kind() {
            ArtifactKind::CloudImage => {}
            k if k.is_snapshot() => return Err(RegistryError::SnapshotArtifact { artifact }),
            k => {
                tracing::info!(%artifact, kind = k.name(), "not a cloud image");
                return Ok(CloudImage::NotACloudImage);
            }
        }
        let local_name = artifact.clone();
        if !force && runtime.image_inspect(&local_name).await.is_ok() {
            tracing::debug!(%artifact, "cloud image already present");
            return Ok(CloudImage::Imported { local_name });
        }
        let mut disks = Vec::new();
        for l in &f.manifest.layers {
            let title = l
                .annotations
                .get(media::ANN_TITLE)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| RegistryError::InvalidArtifact {
                    artifact: artifact.clone(),
                    detail: format!("layer {} has no {} annotation", l.digest, media::ANN_TITLE),
                })?;
            if !media::is_cloud_disk_layer(&l.media_type) {
                return Err(RegistryError::UnsupportedMediaType {
                    artifact: artifact.clone(),
                    title: title.clone(),
                    media_type: l.media_type.clone(),
                });
            }
            if l.size < 0 {
                return Err(RegistryError::InvalidArtifact {
                    artifact: artifact.clone(),
                    detail: format!("layer {title:?} has a negative size"),
                });
            }
            disks.push((title.clone(), l.digest.clone(), l.size as u64));
        }
        if disks.is_empty() {
            return Err(RegistryError::InvalidArtifact {
                artifact,
                detail: "the cloud image has no disk layers".into(),
            });
        }
        disks.sort_by(|a, b| a.0.cmp(&b.0));
        let total: u64 = disks.iter().map(|d| d.2).sum();
        tracing::info!(%artifact, layers = disks.len(), bytes = total, "importing cloud image");

        let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(4);
        let producer = async {
            let r: Result<u64, RegistryError> = async {
                let mut n = 0u64;
                for (title, digest, size) in &disks {
                    let mut s = std::pin::pin!(self.blob_stream(&repo, &tag, digest, *size, title).await?);
                    while let Some(chunk) = s.next().await {
                        n += send(&tx, chunk?).await?;
                    }
                }
                Ok(n)
            }
            .await;
            if let Err(e) = &r {
                let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
            }
            drop(tx);
            r
        };
        let import = async {
            let mut input = tokio_util::io::StreamReader::new(receiver_stream(rx));
            runtime.image_import(&local_name, &mut input).await
        };
        let (produced, imported) = tokio::join!(producer, import);
        match (produced, imported) {
            (Ok(n), Ok(())) => {
                tracing::info!(%artifact, bytes = n, "cloud image imported");
                Ok(CloudImage::Imported { local_name })
            }
            (Err(e), _) if !is_import_stopped(&e) => Err(e),
            (_, Err(e)) => Err(RegistryError::runtime(
                &artifact,
                &format!("image import {local_name}"),
                &e,
            )),
            (Err(e), Ok(())) => Err(e),
        }
    }
}
