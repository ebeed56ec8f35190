//! What a bring-up needs present before `cocoon vm clone` / `vm run`: the
//! shared fork snapshot of a lineage, the clone source snapshot (pulled once per name), the
//! snapshot's base image, and a run image (a cloud image is imported, a snapshot artifact is
//! refused, anything else is `cocoon image pull`). Concurrent callers share one run of each piece
//! of work ([`Flights`]): it outlives a caller that goes away, has its own deadline, and stops
//! when the provider closes.

use std::future::Future;
use std::sync::Arc;

use super::CocoonProvider;
use super::failure::Failure;
use super::plan::{self, ArtifactKind, BaseImage};
use super::ports::CloudImageResult;
use super::table::{Interrupted, SHARED_WORK_DEADLINE, SharedWork};
use crate::kubelet::EventReason;
use crate::runtime::SnapshotRecord;
use crate::runtime::macos::record::MacImage;

/// The single flights of the work bring-ups share, by kind of result.
#[derive(Default)]
pub(super) struct Flights {
    forks: SharedWork<Result<(), Failure>>,
    snapshots: SharedWork<Result<SnapshotRecord, Failure>>,
    images: SharedWork<Result<String, Failure>>,
    macos_images: SharedWork<Result<MacImage, Failure>>,
}

/// Runs `work` as the one flight of `key` on `flights`, a failure of the flight itself (its
/// deadline, the daemon stopping) reported as `reason`.
async fn shared<T, F, Fut>(
    p: &CocoonProvider,
    flights: &SharedWork<Result<T, Failure>>,
    key: &str,
    reason: EventReason,
    work: F,
) -> Result<T, Failure>
where
    T: Clone + Send + Sync + 'static,
    F: FnOnce(Arc<CocoonProvider>) -> Fut,
    Fut: Future<Output = Result<T, Failure>> + Send + 'static,
{
    let me = p.arc();
    flights
        .run(key, SHARED_WORK_DEADLINE, &p.closing, move || work(me))
        .await
        .unwrap_or_else(|e: Interrupted| Err(Failure::transient(reason, format!("{key}: {e}"))))
}

/// One fork snapshot per source lineage, shared by concurrent forks.
pub(super) async fn ensure_fork_snapshot(p: &CocoonProvider, source: &str, fork: &str) -> Result<(), Failure> {
    let (source, fork) = (source.to_string(), fork.to_string());
    let key = format!("fork:{fork}");
    shared(
        p,
        &p.flights.forks,
        &key,
        EventReason::ForkSnapshotFailed,
        move |p| async move { fork_snapshot(&p, &source, &fork).await },
    )
    .await
}

async fn fork_snapshot(p: &CocoonProvider, source: &str, fork: &str) -> Result<(), Failure> {
    match p.ports.runtime.snapshot_inspect(fork).await {
        Ok(_) => return Ok(()),
        Err(e) if e.is_not_found() => {}
        Err(e) => {
            return Err(Failure::transient(
                EventReason::ForkSnapshotFailed,
                format!("inspect fork snapshot {fork}: {e}"),
            ));
        }
    }
    let source_vm = match p.state.vm_by_name(source) {
        Some(vm) => vm,
        None => p.ports.runtime.inspect(source).await.map_err(|e| {
            if e.is_not_found() {
                Failure::transient(
                    EventReason::ForkSourceMissing,
                    format!("fork source vm {source} does not exist on this node: {e}"),
                )
            } else {
                Failure::transient(
                    EventReason::ForkSnapshotFailed,
                    format!("inspect fork source vm {source}: {e}"),
                )
            }
        })?,
    };
    super::transfer::save_snapshot(p, fork, &source_vm.id)
        .await
        .map_err(|e| {
            Failure::transient(
                EventReason::ForkSnapshotFailed,
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
    let (local, repo, tag) = (local.to_string(), repo.to_string(), tag.to_string());
    let key = format!("snapshot:{local}");
    shared(
        p,
        &p.flights.snapshots,
        &key,
        EventReason::SnapshotPullFailed,
        move |p| async move { local_or_pulled(&p, &local, &repo, &tag).await },
    )
    .await
}

async fn local_or_pulled(p: &CocoonProvider, local: &str, repo: &str, tag: &str) -> Result<SnapshotRecord, Failure> {
    match p.ports.runtime.snapshot_inspect(local).await {
        Ok(s) => return Ok(s),
        Err(e) if e.is_not_found() => {}
        Err(e) => {
            return Err(Failure::transient(
                EventReason::SnapshotInspectFailed,
                format!("inspect snapshot {local}: {e}"),
            ));
        }
    }
    let Some(registry) = &p.ports.registry else {
        return Err(Failure::transient(
            EventReason::SnapshotUnavailable,
            format!("snapshot {local} is not on this node and no registry is configured (set OCI_REGISTRY)"),
        ));
    };
    super::transfer::pull_snapshot(p, registry.as_ref(), repo, tag, local)
        .await
        .map_err(|e| {
            Failure::transfer(
                EventReason::SnapshotPullFailed,
                format!("pull snapshot {repo}:{tag} into {local}: {e}"),
                &e,
            )
        })?;
    p.ports.runtime.snapshot_inspect(local).await.map_err(|e| {
        Failure::transient(
            EventReason::SnapshotInspectFailed,
            format!("inspect snapshot {local} after the pull: {e}"),
        )
    })
}

/// The snapshot's base image, so `vm clone --pull` finds the exact version. An image the
/// daemon's own calls saw present is not asked for again: the daemon never removes images, and
/// if one went behind its back the clone's `--pull` fetches the exact version itself (cocoon
/// builds the digest reference from the snapshot), so a stale answer costs a slower clone,
/// never a wrong guest.
pub(super) async fn ensure_base_image(p: &CocoonProvider, snapshot: &SnapshotRecord) -> Result<(), Failure> {
    match plan::base_image(snapshot) {
        BaseImage::Skip => Ok(()),
        BaseImage::CheckDigest { digest, .. } if p.known.has_image(&digest) => Ok(()),
        BaseImage::CheckDigest { digest, image } => match p.ports.runtime.image_inspect(&digest).await {
            Ok(_) => Ok(()),
            Err(_) => {
                ensure_run_image(p, &image, false).await?;
                // Learn whether the pull brought the digest (the next clone then asks nothing).
                let _ = p.ports.runtime.image_inspect(&digest).await;
                Ok(())
            }
        },
        BaseImage::Ensure(image) if p.known.has_image(&image) => Ok(()),
        BaseImage::Ensure(image) => ensure_run_image(p, &image, false).await.map(|_| ()),
    }
}

/// Makes `reference` runnable; returns the local image name: one pull (or import) however many
/// pods want it at once.
pub(super) async fn ensure_run_image(p: &CocoonProvider, reference: &str, force: bool) -> Result<String, Failure> {
    if reference.is_empty() {
        return Ok(String::new());
    }
    let key = format!("image:{}{reference}", if force { "force " } else { "" });
    let reference = reference.to_string();
    shared(
        p,
        &p.flights.images,
        &key,
        EventReason::ImagePullFailed,
        move |p| async move { runnable_image(&p, &reference, force).await },
    )
    .await
}

/// The macOS image `image`: inspect, else pull and inspect again, once however many pods want it.
pub(super) async fn ensure_macos_image(
    p: &CocoonProvider,
    image: &str,
    work: impl FnOnce(Arc<CocoonProvider>) -> futures::future::BoxFuture<'static, Result<MacImage, Failure>>,
) -> Result<MacImage, Failure> {
    let key = format!("macos-image:{image}");
    shared(
        p,
        &p.flights.macos_images,
        &key,
        EventReason::MacOsImagePullFailed,
        work,
    )
    .await
}

async fn runnable_image(p: &CocoonProvider, reference: &str, force: bool) -> Result<String, Failure> {
    let pull = || async {
        p.ports
            .runtime
            .image_pull(reference, force)
            .await
            .map(|()| reference.to_string())
            .map_err(|e| Failure::transient(EventReason::ImagePullFailed, format!("pull image {reference}: {e}")))
    };
    let Some(registry) = p.ports.registry.as_ref().filter(|_| !plan::is_http(reference)) else {
        return pull().await;
    };
    let (repo, tag) = plan::parse_ref(reference);
    match registry.manifest(repo, tag).await {
        Ok(Some(artifact)) => match plan::artifact_kind(&artifact.artifact_type) {
            ArtifactKind::Snapshot => Err(Failure::permanent(
                EventReason::SnapshotAsImage,
                format!("image {reference} is a snapshot artifact; use mode=clone instead of mode=run"),
            )),
            ArtifactKind::CloudImage => {
                match super::transfer::import_cloud_image(p, registry.as_ref(), reference, force).await {
                    Ok(CloudImageResult::Imported(name)) => Ok(name),
                    Ok(CloudImageResult::NotACloudImage) => pull().await,
                    Err(e) => Err(Failure::transfer(
                        EventReason::CloudImageImportFailed,
                        format!("import cloud image {reference}: {e}"),
                        &e,
                    )),
                }
            }
            ArtifactKind::Other => pull().await,
        },
        Ok(None) | Err(_) => pull().await,
    }
}
