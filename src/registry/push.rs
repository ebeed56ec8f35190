//! Push a snapshot export (cocoon's export tar, read from any reader) as an OCI artifact:
//! v1 — one blob per file — or, with `SNAPSHOT_ZSTD_LEVEL` / `SNAPSHOT_CHUNK_SIZE_MIB`, v2 — files of at
//! least 1 MiB zstd-compressed and / or cut into fixed-size chunks, one blob each, `config.files[title]`
//! carrying the uncompressed size and the authoritative chunk order.
//!
//! The export is read on a blocking thread (`super::push_reader`); its blobs go up concurrently
//! (`SNAPSHOT_TRANSFER_CONCURRENCY`), v2 chunks compressed on the blocking pool, all within the memory
//! budget (`SNAPSHOT_MEMORY_BUDGET_MIB`). Big raw files stream straight from the export into one upload
//! session, so the bytes are read once and hashed on the way. The manifest, with every annotation
//! (created, baseimage, from-node), is written last in one PUT: a failed push never leaves a tag
//! pointing at a partial artifact.

use super::chunk_compressor::ChunkCompressor;
use super::client::Registry;
use super::errors::{Cause, RegistryError};
use super::manifest::{self, FileInfo, PushedLayer, SnapshotConfig};
use super::media;
use super::progress::{Progress, watched};
use super::push_reader::{self, FileEntry, Item, Layer, Piece, ReadError, ReadPlan};
use bytes::Bytes;
use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;
use tokio::io::AsyncRead;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

/// What a push did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushReport {
    pub repo: String,
    pub tag: String,
    /// The digest of the manifest now under the tag.
    pub manifest_digest: String,
    pub manifest_bytes: u64,
    /// Bytes of all layers (as stored) plus the config.
    pub total_size: u64,
    /// Bytes of the files (uncompressed; sparse files packed).
    pub file_bytes: u64,
    pub layer_count: usize,
    /// Bytes actually uploaded (blobs the registry already had were skipped).
    pub uploaded_bytes: u64,
    /// True when the artifact is v2 (something was compressed or chunked).
    pub v2: bool,
}

/// A blob that is up: where it goes and what it is.
struct Uploaded {
    layer: Layer,
    digest: String,
    stored: u64,
    sent: u64,
}

/// What a snapshot push records about the guest beside its bytes (each only when not empty).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushLabels<'a> {
    /// The image the guest was booted from: a restore that asks for another image is refused.
    pub base_image: &'a str,
    /// `<namespace>/<pod>` whose guest the snapshot holds: a restore by a pod of another
    /// namespace is the bring-up policy's to refuse.
    pub owner: &'a str,
}

impl<'a> From<&'a str> for PushLabels<'a> {
    /// Labels with the base image only (a push on behalf of no pod).
    fn from(base_image: &'a str) -> Self {
        Self { base_image, owner: "" }
    }
}

impl Registry {
    /// Pushes the snapshot export read from `export` to `repo:tag`, recording the `labels` and
    /// this node as `from-node` (when the client has a node name).
    pub async fn push_snapshot<'a>(
        &self,
        export: Box<dyn AsyncRead + Send + Unpin>,
        repo: &str,
        tag: &str,
        labels: impl Into<PushLabels<'a>>,
        progress: Arc<Progress>,
    ) -> Result<PushReport, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let push = self.push_export(export, repo, tag, labels.into(), progress.clone());
        watched(push, &progress, self.watch(), &artifact)
            .await
            .unwrap_or_else(|stalled| Err(self.unavailable("pushing", &artifact, stalled)))
    }

    /// The push itself (see [`Self::push_snapshot`]).
    async fn push_export(
        &self,
        export: Box<dyn AsyncRead + Send + Unpin>,
        repo: &str,
        tag: &str,
        labels: PushLabels<'_>,
        progress: Arc<Progress>,
    ) -> Result<PushReport, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let started = Instant::now();
        // The names go into every URL of the push: refused before the export is read.
        self.repo(repo)?;
        self.checked_reference(tag)?;
        let st = &self.cfg.transfer;
        tracing::info!(%artifact, v2 = st.v2(), zstd_level = st.zstd_level, chunk_mib = st.chunk_size >> 20, concurrency = st.concurrency, budget_mib = st.push_budget >> 20, "pushing snapshot");

        let plan = ReadPlan {
            zstd_level: st.zstd_level,
            chunk_size: st.chunk_size,
            small_max: (st.push_budget / 4).min(8 << 20),
        };
        let budget = Arc::new(Semaphore::new(push_reader::kib(st.push_budget) as usize));
        let (tx, mut rx) = mpsc::channel::<Item>(1);
        let handle = tokio::runtime::Handle::current();
        let bridge = tokio_util::io::SyncIoBridge::new(export);
        let reader_progress = progress.clone();
        let reader = tokio::task::spawn_blocking(move || {
            let feed = push_reader::Feed {
                tx: &tx,
                budget: &budget,
                handle: &handle,
                progress: &reader_progress,
            };
            push_reader::read_export(bridge, &plan, &feed)
        });

        let compressor = ChunkCompressor::new(st.zstd_level, ChunkCompressor::parallelism(st.concurrency));
        let mut envelope = None;
        let mut files: Vec<FileEntry> = Vec::new();
        let mut done: Vec<Uploaded> = Vec::new();
        let mut uploads = FuturesUnordered::new();
        let mut failed = None;
        let mut open = true;
        while open || !uploads.is_empty() {
            tokio::select! {
                item = rx.recv(), if open && uploads.len() < st.concurrency.max(1) => match item {
                    None => open = false,
                    Some(Item::Envelope(b)) => envelope = Some(b),
                    Some(Item::File(f)) => {
                        progress.grow_total(f.meta.size);
                        files.push(f);
                    }
                    Some(Item::Whole { layer, data, digest, permit }) => {
                        uploads.push(self.push_whole(repo, tag, layer, data, digest, &compressor, permit, &progress).boxed());
                    }
                    Some(Item::Stream { layer, length, pieces, digest }) => {
                        uploads.push(self.push_stream(repo, tag, layer, length, pieces, digest).boxed());
                    }
                },
                Some(result) = uploads.next() => match result {
                    Ok(u) => done.push(u),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                },
            }
        }
        drop(uploads);
        drop(rx); // stops the reader (and so the export) if we broke out early
        let read = reader.await.map_err(|e| RegistryError::Io {
            artifact: artifact.clone(),
            step: "reading the snapshot stream".into(),
            detail: format!("reader thread: {e}"),
            cause: Some(Cause::new(e)),
        })?;
        // A broken export explains the upload it broke: its error goes first.
        if let Err(ReadError::Source(detail)) = read {
            return Err(RegistryError::Source {
                artifact,
                detail,
                cause: None,
            });
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let envelope = envelope.ok_or_else(|| RegistryError::Source {
            artifact: artifact.clone(),
            detail: "the export has no snapshot.json".into(),
            cause: None,
        })?;
        self.finish_push(repo, tag, labels, &envelope, files, done, started)
            .await
    }

    /// Config blob and manifest, once every layer is up.
    #[allow(clippy::too_many_arguments)]
    async fn finish_push(
        &self,
        repo: &str,
        tag: &str,
        labels: PushLabels<'_>,
        envelope: &[u8],
        files: Vec<FileEntry>,
        mut done: Vec<Uploaded>,
        started: Instant,
    ) -> Result<PushReport, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        done.sort_by_key(|u| (u.layer.file, u.layer.chunk.map_or(0, |c| c.0)));
        let v2 = done
            .iter()
            .any(|u| u.layer.chunk.is_some() || u.layer.media_type.ends_with("+zstd"));
        let mut infos: BTreeMap<String, FileInfo> = BTreeMap::new();
        for f in &files {
            let chunks: Vec<String> = done
                .iter()
                .filter(|u| u.layer.file == f.index && u.layer.chunk.is_some())
                .map(|u| u.digest.clone())
                .collect();
            infos.insert(
                f.meta.name.clone(),
                FileInfo {
                    mode: f.meta.mode,
                    sparse_map: f.meta.sparse_map.clone(),
                    sparse_size: f.meta.sparse_size,
                    // The v2 reader frames compressed files by this size (the Go writer sets it for all).
                    size: v2.then_some(f.meta.size),
                    chunks,
                },
            );
        }
        let created = chrono::Utc::now();
        let mut cfg =
            SnapshotConfig::from_envelope(envelope, created.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                .map_err(|e| RegistryError::InvalidArtifact {
                    artifact: artifact.clone(),
                    detail: e.to_string(),
                    cause: Some(Cause::new(e)),
                })?;
        cfg.files = infos;
        if v2 {
            cfg.schema_version = "v2".into();
        }
        let cfg_bytes = serde_json::to_vec(&cfg).expect("config JSON");
        let cfg_digest = manifest::sha256_digest(&cfg_bytes);
        let cfg_size = cfg_bytes.len() as u64;
        self.upload_known(repo, tag, "config", Bytes::from(cfg_bytes), &cfg_digest)
            .await?;

        let mut annotations = BTreeMap::new();
        annotations.insert(
            media::ANN_CREATED.to_string(),
            created.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        );
        if !labels.base_image.is_empty() {
            annotations.insert(media::ANN_BASEIMAGE.to_string(), labels.base_image.to_string());
        }
        if !labels.owner.is_empty() {
            annotations.insert(media::ANN_OWNER.to_string(), labels.owner.to_string());
        }
        if !self.node_name.is_empty() {
            annotations.insert(media::ANN_FROM_NODE.to_string(), self.node_name.clone());
        }
        let layers: Vec<PushedLayer> = done
            .iter()
            .map(|u| PushedLayer {
                title: u.layer.title.clone(),
                media_type: u.layer.media_type.clone(),
                digest: u.digest.clone(),
                size: u.stored,
                chunk: u.layer.chunk,
            })
            .collect();
        let body = manifest::snapshot_manifest(v2, &cfg_digest, cfg_size, &layers, annotations);
        let manifest_digest = manifest::sha256_digest(&body);
        let manifest_bytes = body.len() as u64;
        self.put_manifest(repo, tag, body, media::OCI_MANIFEST).await?;
        let total_size = layers.iter().map(|l| l.size).sum::<u64>() + cfg_size;
        let file_bytes = files.iter().map(|f| f.meta.size).sum();
        let uploaded_bytes = done.iter().map(|u| u.sent).sum();
        tracing::info!(%artifact, digest = %manifest_digest, v2, layers = layers.len(), file_bytes, stored_bytes = total_size, uploaded_bytes, elapsed_s = started.elapsed().as_secs_f64(), "snapshot pushed");
        Ok(PushReport {
            repo: repo.into(),
            tag: tag.into(),
            manifest_digest,
            manifest_bytes,
            total_size,
            file_bytes,
            layer_count: layers.len(),
            uploaded_bytes,
            v2,
        })
    }

    /// A blob in memory: compressed first when it has no digest yet, then `HEAD` + PUT.
    #[allow(clippy::too_many_arguments)]
    async fn push_whole(
        &self,
        repo: &str,
        tag: &str,
        layer: Layer,
        data: Bytes,
        digest: Option<String>,
        compressor: &ChunkCompressor,
        mut permit: OwnedSemaphorePermit,
        progress: &Progress,
    ) -> Result<Uploaded, RegistryError> {
        let raw = data.len() as u64;
        let (data, digest) = match digest {
            Some(d) => (data, d),
            None => {
                let (c, d) = compressor.compress(data).await.map_err(|e| RegistryError::Io {
                    artifact: format!("{repo}:{tag}"),
                    step: format!("compressing {}", layer.title),
                    detail: e.to_string(),
                    cause: Some(Cause::new(e)),
                })?;
                // The raw chunk is gone: keep only the compressed bytes' share of the budget.
                let keep = push_reader::kib(c.len() as u64).max(1) as usize;
                if permit.num_permits() > keep {
                    drop(permit.split(permit.num_permits() - keep));
                }
                (c, d)
            }
        };
        let stored = data.len() as u64;
        let what = match layer.chunk {
            Some((i, n)) => format!("{} chunk {}/{n}", layer.title, i + 1),
            None => layer.title.clone(),
        };
        let sent = self.upload_known(repo, tag, &what, data, &digest).await?;
        drop(permit);
        progress.advance(raw);
        Ok(Uploaded {
            layer,
            digest,
            stored,
            sent,
        })
    }

    /// A blob streamed from the export into one upload session.
    async fn push_stream(
        &self,
        repo: &str,
        tag: &str,
        layer: Layer,
        length: Option<u64>,
        mut pieces: mpsc::Receiver<Piece>,
        digest: oneshot::Receiver<String>,
    ) -> Result<Uploaded, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let stored = Arc::new(AtomicU64::new(0));
        let counted = stored.clone();
        // Ends when the reader closes the channel: after the last piece, or mid-file when it failed (then
        // the digest never comes and the session is never committed).
        let body = async_stream::stream! {
            while let Some(Piece(b, permit)) = pieces.recv().await {
                counted.fetch_add(b.len() as u64, Ordering::Relaxed);
                yield Ok::<Bytes, std::io::Error>(b);
                drop(permit);
            }
        };
        let digest = self
            .upload_session(repo, &artifact, &layer.title, length, body, async { digest.await.ok() })
            .await?;
        let stored = stored.load(Ordering::Relaxed);
        Ok(Uploaded {
            layer,
            digest,
            stored,
            sent: stored,
        })
    }
}
