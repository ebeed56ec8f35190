//! `SnapshotRegistry` over the OCI registry client of `crate::registry` (issue 4).

use async_trait::async_trait;

use super::ports::{Artifact, CloudImageResult, RegistryFailure, SnapshotMeta, SnapshotRegistry};
use crate::registry::{CloudImage, ManifestLookup, Registry, RegistryError};
use crate::runtime::CocoonRuntime;

fn failure(e: RegistryError) -> RegistryFailure {
    RegistryFailure {
        unavailable: e.is_unavailable(),
        message: e.to_string(),
    }
}

#[async_trait]
impl SnapshotRegistry for Registry {
    async fn manifest(&self, repo: &str, tag: &str) -> Result<Option<Artifact>, RegistryFailure> {
        match Registry::manifest(self, repo, tag).await.map_err(failure)? {
            ManifestLookup::Absent => Ok(None),
            ManifestLookup::Found(a) => Ok(Some(Artifact {
                digest: a.digest,
                artifact_type: a.artifact_type.unwrap_or_default(),
                annotations: a.annotations,
            })),
        }
    }

    async fn snapshot_meta(&self, repo: &str, tag: &str) -> Result<Option<SnapshotMeta>, RegistryFailure> {
        Ok(Registry::snapshot_config(self, repo, tag)
            .await
            .map_err(failure)?
            .map(|c| SnapshotMeta {
                snapshot_id: c.snapshot_id,
                image: c.image,
                hypervisor: c.hypervisor,
            }))
    }

    async fn push_snapshot(
        &self,
        runtime: &dyn CocoonRuntime,
        local: &str,
        repo: &str,
        tag: &str,
        base_image: &str,
    ) -> Result<(), RegistryFailure> {
        Registry::push_snapshot(self, runtime, local, repo, tag, base_image)
            .await
            .map(|_| ())
            .map_err(failure)
    }

    async fn pull_snapshot(
        &self,
        runtime: &dyn CocoonRuntime,
        repo: &str,
        tag: &str,
        local: &str,
    ) -> Result<(), RegistryFailure> {
        Registry::pull_snapshot(self, runtime, repo, tag, local)
            .await
            .map(|_| ())
            .map_err(failure)
    }

    async fn ensure_cloud_image(
        &self,
        runtime: &dyn CocoonRuntime,
        reference: &str,
        force: bool,
    ) -> Result<CloudImageResult, RegistryFailure> {
        match Registry::ensure_cloud_image(self, runtime, reference, force)
            .await
            .map_err(failure)?
        {
            CloudImage::Imported { local_name } => Ok(CloudImageResult::Imported(local_name)),
            CloudImage::NotACloudImage => Ok(CloudImageResult::NotACloudImage),
        }
    }

    async fn delete_manifest(&self, repo: &str, tag: &str) -> Result<(), RegistryFailure> {
        Registry::delete_manifest(self, repo, tag).await.map_err(failure)
    }
}
