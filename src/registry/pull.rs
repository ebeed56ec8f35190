//! Pull a snapshot artifact into `cocoon snapshot import --name LOCAL` (contracts B.3/B.5, behaviour §6.2):
//! manifest (an index resolves to linux/amd64), config, then each layer re-assembled into cocoon's A.6
//! import tar and streamed through a small bounded channel into the import's stdin. Every blob is verified
//! (size and sha256); a failure mid-stream makes the import's input fail, so cocoon never registers a
//! truncated snapshot, and the stream's error is the one reported. Concurrent pulls of one snapshot share
//! one transfer; v2 and index artifacts take one of the node's `max_heavy_pulls` slots.

use super::client::Registry;
use super::errors::RegistryError;
use super::manifest::{self, BlobPart, PlanError};
use super::media::{ArtifactKind, LayerEncoding};
use super::tarfmt;
use crate::runtime::CocoonRuntime;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, watch};

/// What a pull did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullReport {
    pub repo: String,
    pub tag: String,
    pub local_name: String,
    pub manifest_digest: String,
    /// `snapshotId` of the config blob (the ID of the snapshot that was pushed).
    pub snapshot_id: String,
    /// Bytes fed to the import (tar framing included).
    pub tar_bytes: u64,
    pub layer_count: usize,
    /// True when this caller joined a pull already in flight.
    pub shared: bool,
}

/// Bound of the in-flight chunks between the registry and cocoon's stdin (each ≤ a few MiB).
const FEED_DEPTH: usize = 4;

pub(crate) type Feed = mpsc::Sender<std::io::Result<Bytes>>;

/// Marker of "the import stopped reading" (its own error explains why).
pub(crate) const IMPORT_STOPPED: &str = "the import stopped reading its input";

enum Role {
    Leader(watch::Sender<Option<Result<PullReport, RegistryError>>>),
    Follower(watch::Receiver<Option<Result<PullReport, RegistryError>>>),
}

struct FlightGuard<'a> {
    reg: &'a Registry,
    key: String,
}

impl Drop for FlightGuard<'_> {
    fn drop(&mut self) {
        self.reg.flights.lock().expect("flights lock").remove(&self.key);
    }
}

impl Registry {
    /// Pulls `repo:tag` into the local snapshot `local_name` (replacing one of that name).
    pub async fn pull_snapshot(
        &self,
        runtime: &dyn CocoonRuntime,
        repo: &str,
        tag: &str,
        local_name: &str,
    ) -> Result<PullReport, RegistryError> {
        let key = format!("{repo}:{tag}=>{local_name}");
        loop {
            let role = {
                let mut flights = self.flights.lock().expect("flights lock");
                match flights.get(&key) {
                    Some(rx) => Role::Follower(rx.clone()),
                    None => {
                        let (tx, rx) = watch::channel(None);
                        flights.insert(key.clone(), rx);
                        Role::Leader(tx)
                    }
                }
            };
            match role {
                Role::Leader(tx) => {
                    let _guard = FlightGuard {
                        reg: self,
                        key: key.clone(),
                    };
                    let r = self.pull_once(runtime, repo, tag, local_name).await;
                    let _ = tx.send(Some(r.clone()));
                    return r;
                }
                Role::Follower(mut rx) => {
                    tracing::info!(repo, tag, local_name, "joining the pull already in flight");
                    let outcome = rx.wait_for(|v| v.is_some()).await.map(|v| v.clone());
                    match outcome {
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

    async fn pull_once(
        &self,
        runtime: &dyn CocoonRuntime,
        repo: &str,
        tag: &str,
        local_name: &str,
    ) -> Result<PullReport, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let started = Instant::now();
        let (f, from_index) = self
            .fetch_resolved(repo, tag)
            .await?
            .ok_or_else(|| RegistryError::NotFound {
                artifact: artifact.clone(),
                registry: self.cfg.host.clone(),
                detail: String::new(),
            })?;
        let heavy = from_index || f.manifest.kind() == ArtifactKind::SnapshotV2;
        let _permit = if heavy {
            tracing::debug!(%artifact, "waiting for a heavy-pull slot");
            Some(
                self.heavy_pulls
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("semaphore never closed"),
            )
        } else {
            None
        };
        let cfg = self.fetch_snapshot_config(repo, tag, &f.manifest).await?;
        let plan = manifest::snapshot_plan(&f.manifest, &cfg).map_err(|e| match e {
            PlanError::Invalid(detail) => RegistryError::InvalidArtifact {
                artifact: artifact.clone(),
                detail,
            },
            PlanError::MediaType { title, media_type } => RegistryError::UnsupportedMediaType {
                artifact: artifact.clone(),
                title,
                media_type,
            },
        })?;
        let total: u64 = plan.iter().map(|p| p.stored_bytes()).sum();
        tracing::info!(%artifact, local_name, digest = %f.digest, files = plan.len(), bytes = total, "pulling snapshot");

        let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(FEED_DEPTH);
        let producer = async {
            let r = self
                .produce_import_tar(&tx, repo, tag, &cfg.envelope(local_name), &plan, started)
                .await;
            if let Err(e) = &r {
                // Make the import's input fail so cocoon discards what it read.
                let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
            }
            drop(tx);
            r
        };
        let import = async move {
            let mut input = tokio_util::io::StreamReader::new(receiver_stream(rx));
            runtime.snapshot_import(local_name, &mut input).await
        };
        let (produced, imported) = tokio::join!(producer, import);
        match (produced, imported) {
            (Ok(tar_bytes), Ok(())) => {
                tracing::info!(%artifact, local_name, tar_bytes, elapsed_s = started.elapsed().as_secs_f64(), "snapshot pulled and imported");
                Ok(PullReport {
                    repo: repo.into(),
                    tag: tag.into(),
                    local_name: local_name.into(),
                    manifest_digest: f.digest,
                    snapshot_id: cfg.snapshot_id,
                    tar_bytes,
                    layer_count: plan.len(),
                    shared: false,
                })
            }
            (Err(e), imported) if !is_import_stopped(&e) => {
                if imported.is_ok() {
                    // Should not happen (the input failed), but never keep an unverified copy.
                    let _ = runtime.snapshot_remove_if_exists(local_name).await;
                }
                tracing::warn!(%artifact, local_name, error = %e, "snapshot pull failed");
                Err(e)
            }
            (_, Err(e)) => Err(RegistryError::runtime(
                &artifact,
                &format!("snapshot import --name {local_name}"),
                &e,
            )),
            (Err(e), Ok(())) => Err(e),
        }
    }

    /// Writes the A.6 tar: `snapshot.json`, then one entry per planned file, then the end marker.
    async fn produce_import_tar(
        &self,
        tx: &Feed,
        repo: &str,
        tag: &str,
        envelope: &[u8],
        plan: &[manifest::FilePlan],
        started: Instant,
    ) -> Result<u64, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let io_err = |e: std::io::Error| RegistryError::Io {
            artifact: artifact.clone(),
            step: "building the import tar".into(),
            detail: e.to_string(),
        };
        let mut sent = 0u64;
        let mut head =
            tarfmt::entry_header("snapshot.json", 0o644, envelope.len() as u64, None, None).map_err(io_err)?;
        head.extend_from_slice(envelope);
        head.resize(head.len() + tarfmt::padding(envelope.len() as u64), 0);
        sent += send(tx, Bytes::from(head)).await?;
        let mut last_log = Instant::now();
        for p in plan {
            sent += send(tx, Bytes::from(tarfmt::plan_header(p).map_err(io_err)?)).await?;
            let mut written = 0u64;
            for part in &p.parts {
                written += self
                    .send_part(tx, repo, tag, &p.title, part, &mut last_log, started, &mut sent)
                    .await?;
            }
            if written != p.size {
                return Err(RegistryError::Corrupt {
                    artifact,
                    digest: p.parts.first().map(|x| x.digest.clone()).unwrap_or_default(),
                    what: p.title.clone(),
                    detail: format!("the file has {written} bytes, its config says {}", p.size),
                });
            }
            let pad = tarfmt::padding(p.size);
            if pad > 0 {
                sent += send(tx, Bytes::from(vec![0u8; pad])).await?;
            }
        }
        sent += send(tx, Bytes::from_static(&tarfmt::END_OF_ARCHIVE)).await?;
        Ok(sent)
    }

    /// Streams one blob (decompressing zstd parts) into the feed; returns the (uncompressed) bytes sent.
    #[allow(clippy::too_many_arguments)]
    async fn send_part(
        &self,
        tx: &Feed,
        repo: &str,
        tag: &str,
        title: &str,
        part: &BlobPart,
        last_log: &mut Instant,
        started: Instant,
        sent: &mut u64,
    ) -> Result<u64, RegistryError> {
        let stream = self.blob_stream(repo, tag, &part.digest, part.size, title).await?;
        let mut n = 0u64;
        let mut progress = |k: u64, sent: &mut u64| {
            *sent += k;
            if last_log.elapsed() >= Duration::from_secs(5) {
                *last_log = Instant::now();
                let secs = started.elapsed().as_secs_f64();
                tracing::info!(
                    repo,
                    tag,
                    file = title,
                    bytes = *sent,
                    mib_per_s = (*sent as f64 / 1048576.0) / secs.max(1e-9),
                    "pull progress"
                );
            }
        };
        match part.encoding {
            LayerEncoding::Raw => {
                let mut stream = std::pin::pin!(stream);
                while let Some(chunk) = stream.next().await {
                    let chunk = chunk?;
                    let k = chunk.len() as u64;
                    send(tx, chunk).await?;
                    n += k;
                    progress(k, sent);
                }
            }
            LayerEncoding::Zstd => {
                let reader =
                    tokio_util::io::StreamReader::new(Box::pin(stream.map(|r| r.map_err(std::io::Error::other))));
                let mut dec = async_compression::tokio::bufread::ZstdDecoder::new(reader);
                dec.multiple_members(true);
                loop {
                    let mut buf = BytesMut::with_capacity(1 << 20);
                    let k = dec.read_buf(&mut buf).await.map_err(|e| {
                        match e.get_ref().and_then(|i| i.downcast_ref::<RegistryError>()) {
                            Some(inner) => inner.clone(),
                            None => RegistryError::Corrupt {
                                artifact: format!("{repo}:{tag}"),
                                digest: part.digest.clone(),
                                what: title.to_string(),
                                detail: format!("zstd decoding failed: {e}"),
                            },
                        }
                    })?;
                    if k == 0 {
                        break;
                    }
                    send(tx, buf.freeze()).await?;
                    n += k as u64;
                    progress(k as u64, sent);
                }
            }
        }
        Ok(n)
    }
}

pub(crate) async fn send(tx: &Feed, b: Bytes) -> Result<u64, RegistryError> {
    let k = b.len() as u64;
    tx.send(Ok(b)).await.map_err(|_| RegistryError::Io {
        artifact: String::new(),
        step: "feeding cocoon".into(),
        detail: IMPORT_STOPPED.into(),
    })?;
    Ok(k)
}

pub(crate) fn is_import_stopped(e: &RegistryError) -> bool {
    matches!(e, RegistryError::Io { detail, .. } if detail == IMPORT_STOPPED)
}

pub(crate) fn receiver_stream(
    mut rx: mpsc::Receiver<std::io::Result<Bytes>>,
) -> impl Stream<Item = std::io::Result<Bytes>> + Send + Unpin {
    Box::pin(async_stream::stream! {
        while let Some(item) = rx.recv().await {
            yield item;
        }
    })
}
