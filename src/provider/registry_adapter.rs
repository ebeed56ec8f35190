//! `SnapshotRegistry` over the OCI registry client of `crate::registry` (issue 4): a thin mapping to the
//! provider's types; errors pass through typed.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncWrite};

use super::ports::{Artifact, SnapshotMeta, SnapshotRegistry};
use crate::registry::{
    CloudImageSource, ManifestLookup, Progress, PullReport, PushLabels, PushReport, Registry, RegistryError,
    SnapshotSource,
};

#[async_trait]
impl SnapshotRegistry for Registry {
    async fn manifest(&self, repo: &str, tag: &str) -> Result<Option<Artifact>, RegistryError> {
        match Registry::manifest(self, repo, tag).await? {
            ManifestLookup::Absent => Ok(None),
            ManifestLookup::Found(a) => Ok(Some(Artifact {
                digest: a.digest,
                artifact_type: a.artifact_type.unwrap_or_default(),
                annotations: a.annotations,
            })),
        }
    }

    async fn snapshot_meta(&self, repo: &str, tag: &str) -> Result<Option<SnapshotMeta>, RegistryError> {
        Ok(Registry::snapshot_config(self, repo, tag).await?.map(|c| SnapshotMeta {
            snapshot_id: c.snapshot_id,
            image: c.image,
            hypervisor: c.hypervisor,
        }))
    }

    async fn snapshot_content(
        &self,
        repo: &str,
        tag: &str,
    ) -> Result<Option<crate::registry::content::SnapshotContent>, RegistryError> {
        Registry::snapshot_content(self, repo, tag).await
    }

    async fn push_snapshot(
        &self,
        export: Box<dyn AsyncRead + Send + Unpin>,
        repo: &str,
        tag: &str,
        labels: PushLabels<'_>,
        progress: Arc<Progress>,
    ) -> Result<PushReport, RegistryError> {
        Registry::push_snapshot(self, export, repo, tag, labels, progress).await
    }

    async fn open_snapshot(&self, repo: &str, tag: &str) -> Result<SnapshotSource, RegistryError> {
        Registry::open_snapshot(self, repo, tag).await
    }

    async fn write_snapshot(
        &self,
        src: &SnapshotSource,
        local_name: &str,
        sink: &mut (dyn AsyncWrite + Send + Unpin),
        progress: &Progress,
    ) -> Result<PullReport, RegistryError> {
        Registry::write_snapshot(self, src, local_name, sink, progress).await
    }

    async fn open_cloud_image(&self, reference: &str) -> Result<Option<CloudImageSource>, RegistryError> {
        Registry::open_cloud_image(self, reference).await
    }

    async fn write_cloud_image(
        &self,
        src: &CloudImageSource,
        sink: &mut (dyn AsyncWrite + Send + Unpin),
        progress: &Progress,
    ) -> Result<u64, RegistryError> {
        Registry::write_cloud_image(self, src, sink, progress).await
    }

    async fn delete_manifest(&self, repo: &str, tag: &str) -> Result<(), RegistryError> {
        Registry::delete_manifest(self, repo, tag).await
    }
}
