//! The blobs of a pull fetched ahead of the tar writer: in parallel, in any order, within the pull
//! budget.
//!
//! The import tar must be written in the artifact's order, but its blobs need not be fetched in it.
//! Up to `SNAPSHOT_TRANSFER_CONCURRENCY` blobs download at once, each in its own task (so the digest
//! check runs on another core), and a zstd chunk is decoded there too, on the blocking pool, while the
//! writer drains the oldest. What they hold — the stored bytes, plus a zstd chunk's decoded bytes —
//! stays within `SNAPSHOT_PULL_BUDGET_MIB`.
//!
//! Two cases keep that bound whatever the artifact says:
//! - a blob too big for the budget (a v1 memory file) is not fetched ahead: once everything before it
//!   is written, the writer streams it itself, as a pull without prefetch would;
//! - the config does not record a chunk's decoded size, so a chunk is allowed its file's share (the
//!   file's size over its chunk count: the v2 writer cuts equal chunks). One that decodes to more is
//!   handed over still compressed and decoded as it is written — only as far as its file has room
//!   for: the writer refuses the first byte past the file's declared size (`pull`).
//!
//! Blobs are only started in order and the budget is only claimed by the oldest blobs not yet written,
//! so the one the writer waits for is always in flight or streamed: no deadlock. Dropping the
//! prefetcher (a failed pull) aborts every download it started.

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, StreamExt, TryStreamExt};
use std::collections::VecDeque;
use tokio_util::task::AbortOnDropHandle;

use super::client::Registry;
use super::errors::{Cause, RegistryError};
use super::manifest::BlobPart;
use super::media::LayerEncoding;

/// One blob of the tar, in the order the writer needs it.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    /// The tar entry it belongs to (for errors).
    pub title: String,
    pub part: BlobPart,
    /// What a zstd chunk may decode to and still be decoded ahead.
    pub decoded_share: u64,
}

impl Job {
    /// The budget the blob holds while it waits to be written.
    fn cost(&self) -> u64 {
        match self.part.encoding {
            LayerEncoding::Raw => self.part.size,
            LayerEncoding::Zstd => self.part.size.saturating_add(self.decoded_share),
        }
    }
}

/// The next blob for the writer.
pub(crate) enum Next {
    /// Fetched and checked: the bytes to write, decoded.
    Ready(Vec<Bytes>),
    /// Fetched and checked but still zstd-compressed (it decodes past its share): decode as written.
    Compressed(Vec<Bytes>),
    /// Too big for the budget: stream it (nothing else is in flight).
    Stream(Job),
}

/// The jobs of one pull: those fetched ahead and those still to start.
pub(crate) struct Prefetcher<'a> {
    registry: &'a Registry,
    repo: &'a str,
    tag: &'a str,
    artifact: String,
    waiting: VecDeque<Job>,
    inflight: FuturesOrdered<BoxFuture<'a, Result<Next, RegistryError>>>,
    /// The cost of each in-flight job, oldest first.
    costs: VecDeque<u64>,
    /// The cost of the blob handed out last: released when the writer asks for the next one.
    handed_out: u64,
    held: u64,
    budget: u64,
    concurrency: usize,
}

impl<'a> Prefetcher<'a> {
    pub fn new(
        registry: &'a Registry,
        repo: &'a str,
        tag: &'a str,
        jobs: Vec<Job>,
        budget: u64,
        concurrency: usize,
    ) -> Self {
        Prefetcher {
            registry,
            repo,
            tag,
            artifact: format!("{repo}:{tag}"),
            waiting: jobs.into(),
            inflight: FuturesOrdered::new(),
            costs: VecDeque::new(),
            handed_out: 0,
            held: 0,
            budget,
            concurrency: concurrency.max(1),
        }
    }

    /// The next blob in the tar's order; `None` when all were handed out.
    pub async fn next(&mut self) -> Option<Result<Next, RegistryError>> {
        // The writer is done with the previous blob: its bytes are gone.
        self.held -= std::mem::take(&mut self.handed_out);
        self.start_what_fits();
        if let Some(cost) = self.costs.pop_front() {
            self.handed_out = cost;
            return self.inflight.next().await;
        }
        // Nothing in flight, so nothing is held: the oldest job did not fit an empty budget.
        self.waiting.pop_front().map(|job| Ok(Next::Stream(job)))
    }

    /// Starts jobs in order while the concurrency and the budget allow.
    fn start_what_fits(&mut self) {
        while self.inflight.len() < self.concurrency {
            let Some(cost) = self.waiting.front().map(Job::cost) else {
                return;
            };
            if cost > self.budget - self.held {
                return;
            }
            let job = self.waiting.pop_front().expect("peeked");
            self.held += cost;
            self.costs.push_back(cost);
            let fetch = fetch(self.registry, self.repo, self.tag, self.artifact.clone(), job);
            self.inflight.push_back(Box::pin(fetch));
        }
    }
}

/// Downloads one blob (its digest checked by the stream) in a task of its own and decodes it there.
async fn fetch(registry: &Registry, repo: &str, tag: &str, artifact: String, job: Job) -> Result<Next, RegistryError> {
    let stream = registry
        .blob_stream(repo, tag, &job.part.digest, job.part.size, &job.title)
        .await?;
    let task = AbortOnDropHandle::new(tokio::spawn(async move {
        let chunks: Vec<Bytes> = stream.try_collect().await?;
        match job.part.encoding {
            LayerEncoding::Raw => Ok(Next::Ready(chunks)),
            LayerEncoding::Zstd => {
                let decoded = tokio::task::spawn_blocking(move || decode(chunks, job.decoded_share)).await;
                match decoded {
                    Ok(Ok(next)) => Ok(next),
                    Ok(Err(e)) => Err(RegistryError::Corrupt {
                        artifact,
                        digest: job.part.digest.clone(),
                        what: job.title.clone(),
                        detail: format!("zstd decoding failed: {e}"),
                        cause: Some(Cause::new(e)),
                    }),
                    Err(e) => Err(task_failed(&artifact, &job, e)),
                }
            }
        }
    }));
    match task.await {
        Ok(result) => result,
        Err(e) => Err(RegistryError::Io {
            artifact: format!("{repo}:{tag}"),
            step: "fetching a blob ahead of the import tar".into(),
            detail: e.to_string(),
            cause: Some(Cause::new(e)),
        }),
    }
}

fn task_failed(artifact: &str, job: &Job, e: tokio::task::JoinError) -> RegistryError {
    RegistryError::Io {
        artifact: artifact.to_string(),
        step: format!("decoding blob {} ({})", job.part.digest, job.title),
        detail: e.to_string(),
        cause: Some(Cause::new(e)),
    }
}

/// Decodes a zstd blob (every frame in it) straight into a buffer of `share` bytes. One that does not
/// fit, or does not decode, is handed back compressed: the writer's streaming decoder then writes it,
/// or reports it corrupt with the error it finds. (One-shot decoding needs no window buffer beside
/// the output, so a decode holds only what the budget counted.)
fn decode(chunks: Vec<Bytes>, share: u64) -> std::io::Result<Next> {
    let stored = join(chunks);
    let capacity = usize::try_from(share).map_err(std::io::Error::other)?;
    match zstd::bulk::Decompressor::new()?.decompress(&stored, capacity) {
        Ok(decoded) => Ok(Next::Ready(vec![Bytes::from(decoded)])),
        Err(_) => Ok(Next::Compressed(vec![stored])),
    }
}

/// One contiguous buffer of a blob's chunks (a copy only when it arrived in several).
fn join(mut chunks: Vec<Bytes>) -> Bytes {
    if chunks.len() == 1 {
        return chunks.pop().expect("one chunk");
    }
    let mut all = BytesMut::with_capacity(chunks.iter().map(Bytes::len).sum());
    for c in &chunks {
        all.extend_from_slice(c);
    }
    all.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zstd_of(data: &[u8]) -> Vec<Bytes> {
        let packed = zstd::encode_all(data, 3).unwrap();
        // Split, as the network would.
        let (a, b) = packed.split_at(packed.len() / 2);
        vec![Bytes::copy_from_slice(a), Bytes::copy_from_slice(b)]
    }

    #[test]
    fn a_chunk_within_its_share_is_decoded_ahead() {
        let data = vec![7u8; 1 << 20];
        match decode(zstd_of(&data), 1 << 20).unwrap() {
            Next::Ready(parts) => assert_eq!(join(parts), Bytes::from(data)),
            _ => panic!("decoded ahead"),
        }
    }

    #[test]
    fn a_chunk_past_its_share_is_handed_back_compressed() {
        let data = vec![7u8; (1 << 20) + 1];
        let stored = zstd_of(&data);
        match decode(stored.clone(), 1 << 20).unwrap() {
            Next::Compressed(parts) => assert_eq!(join(parts), join(stored)),
            _ => panic!("a chunk bigger than its share is not held decoded"),
        }
    }

    #[test]
    fn concatenated_frames_decode_whole() {
        let mut stored = zstd::encode_all(&b"first "[..], 1).unwrap();
        stored.extend(zstd::encode_all(&b"second"[..], 1).unwrap());
        match decode(vec![Bytes::from(stored)], 64).unwrap() {
            Next::Ready(parts) => assert_eq!(&join(parts)[..], b"first second"),
            _ => panic!("decoded"),
        }
    }

    #[test]
    fn garbage_is_left_to_the_streaming_decoder() {
        // Which reports it as corrupt (`a_chunk_that_is_not_zstd_fails_the_pull_as_corrupt`).
        match decode(vec![Bytes::from_static(b"not zstd at all")], 64).unwrap() {
            Next::Compressed(parts) => assert_eq!(&join(parts)[..], b"not zstd at all"),
            _ => panic!("not decoded"),
        }
    }

    #[test]
    fn the_cost_of_a_zstd_chunk_counts_its_decoded_share() {
        let job = |encoding| Job {
            title: "memory-ranges".into(),
            part: BlobPart {
                digest: "sha256:00".into(),
                size: 100,
                encoding,
            },
            decoded_share: 400,
        };
        assert_eq!(job(LayerEncoding::Raw).cost(), 100);
        assert_eq!(job(LayerEncoding::Zstd).cost(), 500);
    }
}
