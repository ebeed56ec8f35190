//! What a bring-up needs present before `cocoon vm clone` / `vm run` (behaviour spec §4b): the
//! shared fork snapshot of a lineage, the clone source snapshot (pulled once per name), the
//! snapshot's base image, and a run image (a cloud image is imported, a snapshot artifact is
//! refused, anything else is `cocoon image pull`). Concurrent callers share one piece of work.

use super::CocoonProvider;
use super::failure::Failure;
use super::plan::{self, ArtifactKind, BaseImage};
use super::ports::CloudImageResult;
use crate::runtime::SnapshotRecord;

/// One fork snapshot per source lineage, shared by concurrent forks.
pub(super) async fn ensure_fork_snapshot(p: &CocoonProvider, source: &str, fork: &str) -> Result<(), Failure> {
    let _guard = p.state.work_lock(&format!("fork:{fork}")).await;
    match p.ports.runtime.snapshot_inspect(fork).await {
        Ok(_) => return Ok(()),
        Err(e) if e.is_not_found() => {}
        Err(e) => {
            return Err(Failure::transient(
                "ForkSnapshotFailed",
                format!("inspect fork snapshot {fork}: {e}"),
            ));
        }
    }
    let source_vm = match p.state.vm_by_name(source) {
        Some(vm) => vm,
        None => p.ports.runtime.inspect(source).await.map_err(|e| {
            if e.is_not_found() {
                Failure::transient(
                    "ForkSourceMissing",
                    format!("fork source vm {source} does not exist on this node: {e}"),
                )
            } else {
                Failure::transient("ForkSnapshotFailed", format!("inspect fork source vm {source}: {e}"))
            }
        })?,
    };
    p.save_snapshot(fork, &source_vm.id).await.map_err(|e| {
        Failure::transient(
            "ForkSnapshotFailed",
            format!("snapshot fork source vm {source} ({}) as {fork}: {e}", source_vm.id),
        )
    })
}

/// The clone source snapshot: local, else pulled from the registry (one pull per name).
pub(super) async fn ensure_snapshot(
    p: &CocoonProvider,
    local: &str,
    repo: &str,
    tag: &str,
) -> Result<SnapshotRecord, Failure> {
    let _guard = p.state.work_lock(&format!("snapshot:{local}")).await;
    match p.ports.runtime.snapshot_inspect(local).await {
        Ok(s) => return Ok(s),
        Err(e) if e.is_not_found() => {}
        Err(e) => {
            return Err(Failure::transient(
                "SnapshotInspectFailed",
                format!("inspect snapshot {local}: {e}"),
            ));
        }
    }
    let Some(registry) = &p.ports.registry else {
        return Err(Failure::transient(
            "SnapshotUnavailable",
            format!("snapshot {local} is not on this node and no registry is configured (set OCI_REGISTRY)"),
        ));
    };
    p.pull_snapshot(registry.as_ref(), repo, tag, local)
        .await
        .map_err(|e| {
            Failure::transfer(
                "SnapshotPullFailed",
                format!("pull snapshot {repo}:{tag} into {local}: {e}"),
                &e,
            )
        })?;
    p.ports.runtime.snapshot_inspect(local).await.map_err(|e| {
        Failure::transient(
            "SnapshotInspectFailed",
            format!("inspect snapshot {local} after the pull: {e}"),
        )
    })
}

/// The snapshot's base image, so `vm clone --pull` finds the exact version.
pub(super) async fn ensure_base_image(p: &CocoonProvider, snapshot: &SnapshotRecord) -> Result<(), Failure> {
    match plan::base_image(snapshot) {
        BaseImage::Skip => Ok(()),
        BaseImage::CheckDigest { digest, image } => match p.ports.runtime.image_inspect(&digest).await {
            Ok(_) => Ok(()),
            Err(_) => ensure_run_image(p, &image, false).await.map(|_| ()),
        },
        BaseImage::Ensure(image) => ensure_run_image(p, &image, false).await.map(|_| ()),
    }
}

/// Makes `reference` runnable; returns the local image name (§4b "Ensure run image").
pub(super) async fn ensure_run_image(p: &CocoonProvider, reference: &str, force: bool) -> Result<String, Failure> {
    if reference.is_empty() {
        return Ok(String::new());
    }
    let _guard = p
        .state
        .work_lock(&format!("image:{}{reference}", if force { "force " } else { "" }))
        .await;
    let pull = || async {
        p.ports
            .runtime
            .image_pull(reference, force)
            .await
            .map(|()| reference.to_string())
            .map_err(|e| Failure::transient("ImagePullFailed", format!("pull image {reference}: {e}")))
    };
    let Some(registry) = p.ports.registry.as_ref().filter(|_| !plan::is_http(reference)) else {
        return pull().await;
    };
    let (repo, tag) = plan::parse_ref(reference);
    match registry.manifest(repo, tag).await {
        Ok(Some(artifact)) => match plan::artifact_kind(&artifact.artifact_type) {
            ArtifactKind::Snapshot => Err(Failure::permanent(
                "SnapshotAsImage",
                format!("image {reference} is a snapshot artifact; use mode=clone instead of mode=run"),
            )),
            ArtifactKind::CloudImage => match p.import_cloud_image(registry.as_ref(), reference, force).await {
                Ok(CloudImageResult::Imported(name)) => Ok(name),
                Ok(CloudImageResult::NotACloudImage) => pull().await,
                Err(e) => Err(Failure::transfer(
                    "CloudImageImportFailed",
                    format!("import cloud image {reference}: {e}"),
                    &e,
                )),
            },
            ArtifactKind::Other => pull().await,
        },
        Ok(None) | Err(_) => pull().await,
    }
}
