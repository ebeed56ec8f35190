//! Pull a snapshot artifact as cocoon's import tar (`snapshot.json` first, then the files), in two
//! steps: [`Registry::open_snapshot`] resolves the manifest (an index resolves to linux/amd64), the
//! config and the plan — so an absent tag or an unreadable artifact fails before anything is
//! imported — and [`Registry::write_snapshot`] streams the tar into a writer: `snapshot.json`
//! synthesised from the config, then each file re-assembled from its blobs (fetched ahead in
//! parallel within `SNAPSHOT_PULL_BUDGET_MIB`, see `prefetch`), then the end marker. Every blob is
//! verified (size and sha256), and no file's body runs past the size its entry header declares: the
//! first byte beyond it fails the pull as corrupt before it is written (what follows a body is read
//! as the next tar header, so an artifact must not choose it). The caller must discard what it
//! imported when the write fails. v2 and index artifacts hold one of the node's `max_heavy_pulls`
//! slots from open to the end of the write.

use super::client::Registry;
use super::errors::RegistryError;
use super::manifest::{self, BlobPart, FilePlan, PlanError, SnapshotConfig};
use super::media::{ArtifactKind, LayerEncoding};
use super::prefetch::{Job, Next, Prefetcher};
use super::progress::{Progress, watched};
use super::tarfmt;
use bytes::BytesMut;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// What a pull did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullReport {
    pub repo: String,
    pub tag: String,
    pub local_name: String,
    pub manifest_digest: String,
    /// `snapshotId` of the config blob (the ID of the snapshot that was pushed).
    pub snapshot_id: String,
    /// Bytes written (tar framing included).
    pub tar_bytes: u64,
    pub layer_count: usize,
    /// True when this caller joined a pull already in flight.
    pub shared: bool,
}

/// A snapshot artifact resolved for a pull.
#[derive(Debug)]
pub struct SnapshotSource {
    pub repo: String,
    pub tag: String,
    pub manifest_digest: String,
    pub snapshot_id: String,
    /// Bytes of the files the import tar carries (uncompressed; framing excluded).
    pub file_bytes: u64,
    plan: Option<Arc<Planned>>,
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

#[derive(Debug)]
struct Planned {
    cfg: SnapshotConfig,
    files: Vec<FilePlan>,
}

impl SnapshotSource {
    /// A source described by its facts only, for implementations of the provider's registry port other
    /// than [`Registry`] (which cannot stream it).
    pub fn described(repo: &str, tag: &str, manifest_digest: &str, snapshot_id: &str, file_bytes: u64) -> Self {
        SnapshotSource {
            repo: repo.into(),
            tag: tag.into(),
            manifest_digest: manifest_digest.into(),
            snapshot_id: snapshot_id.into(),
            file_bytes,
            plan: None,
            _permit: None,
        }
    }

    fn artifact(&self) -> String {
        format!("{}:{}", self.repo, self.tag)
    }
}

impl Registry {
    /// Resolves `repo:tag` for a pull: manifest, config, plan. `NotFound` when the tag is absent.
    pub async fn open_snapshot(&self, repo: &str, tag: &str) -> Result<SnapshotSource, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let resolved = self
            .fetch_resolved(repo, tag)
            .await?
            .ok_or_else(|| RegistryError::NotFound {
                artifact: artifact.clone(),
                registry: self.cfg.host.clone(),
                detail: String::new(),
            })?;
        let heavy = resolved.from_index || manifest::image_kind(&resolved.manifest) == ArtifactKind::SnapshotV2;
        let permit = if heavy {
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
        let cfg = self.fetch_snapshot_config(repo, tag, &resolved.manifest).await?;
        let files = manifest::snapshot_plan(&resolved.manifest, &cfg).map_err(|e| match e {
            PlanError::Invalid { detail, cause } => RegistryError::InvalidArtifact {
                artifact: artifact.clone(),
                detail,
                cause,
            },
            PlanError::MediaType { title, media_type } => RegistryError::UnsupportedMediaType {
                artifact: artifact.clone(),
                title,
                media_type,
            },
        })?;
        Ok(SnapshotSource {
            repo: repo.into(),
            tag: tag.into(),
            manifest_digest: resolved.digest,
            snapshot_id: cfg.snapshot_id.clone(),
            file_bytes: files.iter().map(|p| p.size).sum(),
            plan: Some(Arc::new(Planned { cfg, files })),
            _permit: permit,
        })
    }

    /// Writes the import tar of `src` into `sink`, naming the snapshot `local_name` in its
    /// `snapshot.json`. The sink is not shut down; on an error the caller must discard what was written.
    pub async fn write_snapshot(
        &self,
        src: &SnapshotSource,
        local_name: &str,
        sink: &mut (dyn AsyncWrite + Send + Unpin),
        progress: &Progress,
    ) -> Result<PullReport, RegistryError> {
        let artifact = src.artifact();
        let write = self.write_import(src, local_name, sink, progress);
        watched(write, progress, self.watch(), &artifact)
            .await
            .unwrap_or_else(|stalled| Err(self.unavailable("pulling", &artifact, stalled)))
    }

    /// The write itself (see [`Self::write_snapshot`]).
    async fn write_import(
        &self,
        src: &SnapshotSource,
        local_name: &str,
        sink: &mut (dyn AsyncWrite + Send + Unpin),
        progress: &Progress,
    ) -> Result<PullReport, RegistryError> {
        let artifact = src.artifact();
        let plan = src.plan.as_ref().ok_or_else(|| {
            RegistryError::InvalidRequest(format!("{artifact}: the source was not opened by this registry client"))
        })?;
        let started = Instant::now();
        progress.set_total(src.file_bytes);
        tracing::info!(%artifact, local_name, digest = %src.manifest_digest, files = plan.files.len(), bytes = src.file_bytes, "pulling snapshot");
        let mut out = TarOut {
            sink,
            artifact: &artifact,
            sent: 0,
        };
        let envelope = plan.cfg.envelope(local_name);
        let io_err = |e: std::io::Error| RegistryError::Io {
            artifact: artifact.clone(),
            step: "building the import tar".into(),
            detail: e.to_string(),
            cause: Some(super::errors::Cause::new(e)),
        };
        let mut head =
            tarfmt::entry_header("snapshot.json", 0o644, envelope.len() as u64, None, None).map_err(io_err)?;
        head.extend_from_slice(&envelope);
        head.resize(head.len() + tarfmt::padding(envelope.len() as u64), 0);
        out.write(&head).await?;
        let jobs = plan
            .files
            .iter()
            .flat_map(|p| {
                let share = decoded_share(p);
                p.parts.iter().map(move |part| Job {
                    title: p.title.clone(),
                    part: part.clone(),
                    decoded_share: share,
                })
            })
            .collect();
        let transfer = &self.cfg.transfer;
        let mut ahead = Prefetcher::new(
            self,
            &src.repo,
            &src.tag,
            jobs,
            transfer.pull_budget,
            transfer.concurrency,
        );
        for p in &plan.files {
            out.write(&tarfmt::plan_header(p).map_err(io_err)?).await?;
            // The entry's header says `p.size` bytes: the importer reads exactly that many as the file,
            // and whatever follows as the next header. So no part may write past what the file has
            // left — not one byte, whatever the part decodes to — and a short file is refused too.
            let mut body = FileBody {
                out: &mut out,
                file: p,
                artifact: &artifact,
                left: p.size,
            };
            for part in &p.parts {
                match ahead.next().await.expect("one job per part")? {
                    Next::Ready(bytes) => {
                        for b in bytes {
                            body.write(part, &b).await?;
                            progress.advance(b.len() as u64);
                        }
                    }
                    Next::Compressed(stored) => {
                        let stream = futures::stream::iter(stored.into_iter().map(Ok));
                        write_blob(&mut body, part, stream, progress).await?;
                    }
                    Next::Stream(job) => {
                        let stream = self
                            .blob_stream(&src.repo, &src.tag, &job.part.digest, job.part.size, &job.title)
                            .await?;
                        write_blob(&mut body, part, stream, progress).await?;
                    }
                }
            }
            if body.left != 0 {
                return Err(RegistryError::Corrupt {
                    artifact: artifact.clone(),
                    digest: p.parts.first().map(|x| x.digest.clone()).unwrap_or_default(),
                    what: p.title.clone(),
                    detail: format!("the file has {} bytes, its config says {}", p.size - body.left, p.size),
                    cause: None,
                });
            }
            out.write(&vec![0u8; tarfmt::padding(p.size)]).await?;
        }
        out.write(&tarfmt::END_OF_ARCHIVE).await?;
        out.flush().await?;
        tracing::info!(%artifact, local_name, tar_bytes = out.sent, elapsed_s = started.elapsed().as_secs_f64(), "snapshot streamed");
        Ok(PullReport {
            repo: src.repo.clone(),
            tag: src.tag.clone(),
            local_name: local_name.into(),
            manifest_digest: src.manifest_digest.clone(),
            snapshot_id: src.snapshot_id.clone(),
            tar_bytes: out.sent,
            layer_count: plan.files.len(),
            shared: false,
        })
    }
}

/// Streams one blob's bytes (decompressing a zstd part) into the file's body, which refuses the first
/// byte past the file's size: a zstd part is decoded only as far as the file has room for (plus the
/// one byte that shows it goes on).
async fn write_blob(
    body: &mut FileBody<'_, '_>,
    part: &BlobPart,
    stream: impl futures::Stream<Item = Result<bytes::Bytes, RegistryError>> + Send,
    progress: &Progress,
) -> Result<(), RegistryError> {
    match part.encoding {
        LayerEncoding::Raw => {
            let mut stream = std::pin::pin!(stream);
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                body.write(part, &chunk).await?;
                progress.advance(chunk.len() as u64);
            }
        }
        LayerEncoding::Zstd => {
            let reader = tokio_util::io::StreamReader::new(Box::pin(stream.map(|r| r.map_err(std::io::Error::other))));
            let mut dec = async_compression::tokio::bufread::ZstdDecoder::new(reader);
            dec.multiple_members(true);
            let mut buf = BytesMut::with_capacity(DECODE_BUFFER);
            loop {
                buf.clear();
                // Room for what the file has left and one byte more: enough to see it overflow.
                let room = body.left.saturating_add(1).min(DECODE_BUFFER as u64) as usize;
                let k = (&mut dec).take(room as u64).read_buf(&mut buf).await.map_err(|e| {
                    match e.get_ref().and_then(|i| i.downcast_ref::<RegistryError>()) {
                        Some(inner) => inner.clone(),
                        None => body.corrupt(part, format!("zstd decoding failed: {e}")),
                    }
                })?;
                if k == 0 {
                    break;
                }
                body.write(part, &buf).await?;
                progress.advance(k as u64);
            }
        }
    }
    Ok(())
}

/// The most a zstd part is decoded ahead of the write, at once.
const DECODE_BUFFER: usize = 1 << 20;

/// The body of one tar entry being written: at most the file's declared size.
struct FileBody<'o, 's> {
    out: &'o mut TarOut<'s>,
    file: &'o FilePlan,
    artifact: &'o str,
    /// Bytes the file still has room for.
    left: u64,
}

impl FileBody<'_, '_> {
    /// Writes `bytes` of `part`, unless they run past the file's size: then nothing of them is
    /// written and the pull fails as corrupt.
    async fn write(&mut self, part: &BlobPart, bytes: &[u8]) -> Result<(), RegistryError> {
        let n = bytes.len() as u64;
        if n > self.left {
            return Err(self.corrupt(
                part,
                format!(
                    "it decodes past the {} bytes the config declares for the file",
                    self.file.size
                ),
            ));
        }
        self.out.write(bytes).await?;
        self.left -= n;
        Ok(())
    }

    fn corrupt(&self, part: &BlobPart, detail: String) -> RegistryError {
        RegistryError::Corrupt {
            artifact: self.artifact.to_string(),
            digest: part.digest.clone(),
            what: self.file.title.clone(),
            detail,
            cause: None,
        }
    }
}

/// What one blob of a file may decode to: the file's size over its blob count (the v2 writer cuts
/// equal chunks; the last one is smaller).
fn decoded_share(p: &FilePlan) -> u64 {
    match p.parts.len() {
        0 | 1 => p.size,
        n => p.size.div_ceil(n as u64),
    }
}

/// The sink with the byte count and the error the caller can tell from a registry failure.
pub(crate) struct TarOut<'a> {
    pub sink: &'a mut (dyn AsyncWrite + Send + Unpin),
    pub artifact: &'a str,
    pub sent: u64,
}

impl TarOut<'_> {
    pub async fn write(&mut self, b: &[u8]) -> Result<(), RegistryError> {
        if b.is_empty() {
            return Ok(());
        }
        self.sink.write_all(b).await.map_err(|e| self.stopped(e))?;
        self.sent += b.len() as u64;
        Ok(())
    }

    pub async fn flush(&mut self) -> Result<(), RegistryError> {
        self.sink.flush().await.map_err(|e| self.stopped(e))
    }

    fn stopped(&self, e: std::io::Error) -> RegistryError {
        RegistryError::Sink {
            artifact: self.artifact.to_string(),
            detail: e.to_string(),
            cause: Some(super::errors::Cause::new(e)),
        }
    }
}
