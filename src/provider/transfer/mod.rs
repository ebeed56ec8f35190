//! Moving guest state between cocoon and the registry: `cocoon snapshot export` into a push,
//! a pull into `cocoon snapshot import`, a cloud image into `cocoon image import`. The registry is a
//! pure OCI adapter (readers in, writers out); this module runs cocoon around it, decides whose error
//! a failed transfer reports, never keeps an unverified import, and lets concurrent pulls of one
//! snapshot share one transfer. [`CocoonProvider`]'s wrappers count each path in its `{result}` metric
//! and time it in its duration histogram — one place for every path that moves guest state (fork,
//! delete, hibernate, clone source, wake).

mod pipe;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::watch;

use super::CocoonProvider;
use super::metrics::ProviderMetrics;
use super::ports::{CloudImageResult, SnapshotRegistry};
use crate::registry::{Progress, PullReport, PushLabels, PushReport, RegistryError};
use crate::runtime::{CocoonRuntime, RuntimeError};

/// Bytes in flight between the registry and an import's stdin.
const PIPE_BYTES: usize = 4 << 20;

/// Why a transfer failed: the registry's typed error, or the cocoon step around it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TransferError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("{artifact}: cocoon snapshot export {local} failed: {source}; nothing was tagged — retry the push")]
    Export {
        artifact: String,
        local: String,
        source: Arc<RuntimeError>,
    },
    #[error("{artifact}: cocoon snapshot import --name {local} failed: {source}")]
    Import {
        artifact: String,
        local: String,
        source: Arc<RuntimeError>,
    },
    #[error("{artifact}: cocoon image import {local} failed: {source}")]
    ImageImport {
        artifact: String,
        local: String,
        source: Arc<RuntimeError>,
    },
}

impl TransferError {
    /// The registry's error, when the registry is what failed.
    pub fn registry(&self) -> Option<&RegistryError> {
        match self {
            TransferError::Registry(e) => Some(e),
            _ => None,
        }
    }

    /// True when the registry could not give an authoritative answer (retry later).
    pub fn is_unavailable(&self) -> bool {
        self.registry().is_some_and(RegistryError::is_unavailable)
    }
}

type Flight = watch::Receiver<Option<Result<PullReport, TransferError>>>;

/// The transfers of one node: the pulls in flight, by `repo:tag=>local`.
#[derive(Default)]
pub struct Transfers {
    flights: Mutex<HashMap<String, Flight>>,
}

struct FlightGuard<'a> {
    flights: &'a Mutex<HashMap<String, Flight>>,
    key: String,
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        self.flights.lock().expect("flights lock").remove(&self.key);
    }
}

impl Transfers {
    pub fn new() -> Self {
        Self::default()
    }

    /// `cocoon snapshot export <local>` into `repo:tag`, recording the `labels`.
    pub async fn push<'a>(
        &self,
        runtime: &dyn CocoonRuntime,
        registry: &dyn SnapshotRegistry,
        local: &str,
        repo: &str,
        tag: &str,
        labels: impl Into<PushLabels<'a>>,
    ) -> Result<PushReport, TransferError> {
        let artifact = format!("{repo}:{tag}");
        let export_failed = |e: RuntimeError| TransferError::Export {
            artifact: artifact.clone(),
            local: local.to_string(),
            source: Arc::new(e),
        };
        let export = runtime.snapshot_export(local).await.map_err(export_failed)?;
        let (export, tap) = ErrorTap::new(export);
        let progress = Arc::new(Progress::new());
        match registry
            .push_snapshot(Box::new(export), repo, tag, labels.into(), progress)
            .await
        {
            Ok(report) => Ok(report),
            // The export's own failure (cocoon exited non-zero, timed out) explains a broken stream.
            Err(e @ RegistryError::Source { .. }) => match tap.take() {
                Some(io) => Err(export_failed(crate::runtime::client::runtime_error_of(io))),
                None => Err(e.into()),
            },
            Err(e) => Err(e.into()),
        }
    }

    /// `repo:tag` into `cocoon snapshot import --name <local>`; concurrent callers for the same
    /// triple share one transfer (the followers' reports say `shared`).
    pub async fn pull(
        &self,
        runtime: &dyn CocoonRuntime,
        registry: &dyn SnapshotRegistry,
        repo: &str,
        tag: &str,
        local: &str,
    ) -> Result<PullReport, TransferError> {
        let key = format!("{repo}:{tag}=>{local}");
        loop {
            let leader = {
                let mut flights = self.flights.lock().expect("flights lock");
                match flights.get(&key) {
                    Some(rx) => Err(rx.clone()),
                    None => {
                        let (tx, rx) = watch::channel(None);
                        flights.insert(key.clone(), rx);
                        Ok(tx)
                    }
                }
            };
            match leader {
                Ok(tx) => {
                    let _guard = FlightGuard {
                        flights: &self.flights,
                        key: key.clone(),
                    };
                    let r = pull_once(runtime, registry, repo, tag, local).await;
                    let _ = tx.send(Some(r.clone()));
                    return r;
                }
                Err(mut rx) => {
                    tracing::info!(repo, tag, local, "joining the pull already in flight");
                    match rx.wait_for(|v| v.is_some()).await.map(|v| v.clone()) {
                        Ok(Some(r)) => {
                            return r.map(|mut rep| {
                                rep.shared = true;
                                rep
                            });
                        }
                        // The leader was cancelled: take over.
                        _ => continue,
                    }
                }
            }
        }
    }

    /// Makes the cloud image `reference` present (imported unless it is and `force` is off).
    pub async fn import_cloud_image(
        &self,
        runtime: &dyn CocoonRuntime,
        registry: &dyn SnapshotRegistry,
        reference: &str,
        force: bool,
    ) -> Result<CloudImageResult, TransferError> {
        let Some(src) = registry.open_cloud_image(reference).await? else {
            return Ok(CloudImageResult::NotACloudImage);
        };
        let local = src.local_name.clone();
        if !force && runtime.image_inspect(&local).await.is_ok() {
            tracing::debug!(image = %local, "cloud image already present");
            return Ok(CloudImageResult::Imported(local));
        }
        let progress = Progress::new();
        let (mut writer, mut reader) = pipe::pipe(PIPE_BYTES);
        let produce = async {
            let r = registry.write_cloud_image(&src, &mut writer, &progress).await;
            finish(writer, &r).await;
            r
        };
        let import = runtime.image_import(&local, &mut reader);
        let (produced, imported) = tokio::join!(produce, import);
        match (produced, imported) {
            (Ok(bytes), Ok(())) => {
                tracing::info!(image = %local, bytes, "cloud image imported");
                Ok(CloudImageResult::Imported(local))
            }
            (Err(e), _) if !matches!(e, RegistryError::Sink { .. }) => Err(e.into()),
            (_, Err(e)) => Err(TransferError::ImageImport {
                artifact: format!("{}:{}", src.repo, src.tag),
                local,
                source: Arc::new(e),
            }),
            (Err(e), Ok(())) => Err(e.into()),
        }
    }
}

/// Opens `repo:tag` (nothing is imported when that fails), then streams it into cocoon.
async fn pull_once(
    runtime: &dyn CocoonRuntime,
    registry: &dyn SnapshotRegistry,
    repo: &str,
    tag: &str,
    local: &str,
) -> Result<PullReport, TransferError> {
    let started = Instant::now();
    let src = registry.open_snapshot(repo, tag).await?;
    let progress = Progress::new();
    let (mut writer, mut reader) = pipe::pipe(PIPE_BYTES);
    let produce = async {
        let r = registry.write_snapshot(&src, local, &mut writer, &progress).await;
        finish(writer, &r).await;
        r
    };
    let import = runtime.snapshot_import(local, &mut reader);
    let (produced, imported) = tokio::join!(produce, import);
    let artifact = format!("{repo}:{tag}");
    match (produced, imported) {
        (Ok(report), Ok(())) => {
            tracing::info!(%artifact, local, tar_bytes = report.tar_bytes, elapsed_s = started.elapsed().as_secs_f64(), "snapshot pulled and imported");
            Ok(report)
        }
        (Err(e), imported) if !matches!(e, RegistryError::Sink { .. }) => {
            if imported.is_ok() {
                // Cannot happen (the import's input failed), but never keep an unverified copy.
                let _ = runtime.snapshot_remove_if_exists(local).await;
            }
            tracing::warn!(%artifact, local, error = %e, "snapshot pull failed");
            Err(e.into())
        }
        (_, Err(e)) => Err(TransferError::Import {
            artifact,
            local: local.to_string(),
            source: Arc::new(e),
        }),
        (Err(e), Ok(())) => {
            let _ = runtime.snapshot_remove_if_exists(local).await;
            Err(e.into())
        }
    }
}

/// Ends the pipe as the producer ended: complete, or failed with its error.
async fn finish<T>(writer: pipe::PipeWriter, r: &Result<T, RegistryError>) {
    match r {
        Ok(_) => {
            let _ = writer.finish().await;
        }
        Err(e) => writer.fail(e.to_string()).await,
    }
}

/// Keeps the first error of a reader (the export's, which carries cocoon's [`RuntimeError`]) and hands
/// its consumer a copy (same kind and text).
struct ErrorTap<R> {
    inner: R,
    first: Arc<Mutex<Option<std::io::Error>>>,
}

struct Tapped(Arc<Mutex<Option<std::io::Error>>>);

impl Tapped {
    fn take(&self) -> Option<std::io::Error> {
        self.0.lock().expect("tap lock").take()
    }
}

impl<R> ErrorTap<R> {
    fn new(inner: R) -> (Self, Tapped) {
        let first = Arc::new(Mutex::new(None));
        (
            ErrorTap {
                inner,
                first: first.clone(),
            },
            Tapped(first),
        )
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for ErrorTap<R> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Err(e)) => {
                let copy = std::io::Error::new(e.kind(), e.to_string());
                let mut first = this.first.lock().expect("tap lock");
                if first.is_none() {
                    *first = Some(e);
                }
                Poll::Ready(Err(copy))
            }
            other => other,
        }
    }
}

/// `cocoon snapshot save --name <name> <vm_id>`.
pub(super) async fn save_snapshot(p: &CocoonProvider, name: &str, vm_id: &str) -> crate::runtime::Result<()> {
    let started = Instant::now();
    let saved = p.ports.runtime.snapshot_save(name, vm_id).await;
    ProviderMetrics::count(&p.metrics.snapshot_save, saved.is_ok());
    p.metrics
        .snapshot_save_duration
        .observe(started.elapsed().as_secs_f64());
    saved
}

/// Streams the local snapshot `local` into `repo:tag`, recording the `labels`.
pub(super) async fn push_snapshot(
    p: &CocoonProvider,
    registry: &dyn SnapshotRegistry,
    local: &str,
    repo: &str,
    tag: &str,
    labels: PushLabels<'_>,
) -> Result<PushReport, TransferError> {
    let started = Instant::now();
    let pushed = p
        .transfers
        .push(p.ports.runtime.as_ref(), registry, local, repo, tag, labels)
        .await;
    ProviderMetrics::count(&p.metrics.snapshot_push, pushed.is_ok());
    p.metrics
        .snapshot_push_duration
        .observe(started.elapsed().as_secs_f64());
    pushed
}

/// Imports `repo:tag` into the local store as `local`.
pub(super) async fn pull_snapshot(
    p: &CocoonProvider,
    registry: &dyn SnapshotRegistry,
    repo: &str,
    tag: &str,
    local: &str,
) -> Result<PullReport, TransferError> {
    let started = Instant::now();
    let pulled = p
        .transfers
        .pull(p.ports.runtime.as_ref(), registry, repo, tag, local)
        .await;
    ProviderMetrics::count(&p.metrics.snapshot_pull, pulled.is_ok());
    p.metrics
        .snapshot_pull_duration
        .observe(started.elapsed().as_secs_f64());
    pulled
}

/// Imports the cloud image `reference` (see [`Transfers::import_cloud_image`]).
pub(super) async fn import_cloud_image(
    p: &CocoonProvider,
    registry: &dyn SnapshotRegistry,
    reference: &str,
    force: bool,
) -> Result<CloudImageResult, TransferError> {
    p.transfers
        .import_cloud_image(p.ports.runtime.as_ref(), registry, reference, force)
        .await
}
