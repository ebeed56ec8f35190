//! The export side of a push: cocoon's export tar read on a blocking thread with the `tar` crate,
//! each entry turned into what the uploader sends, in export order —
//!
//! - a small raw file (≤ [`ReadPlan::small_max`]): read whole and hashed here, uploaded after a `HEAD`;
//! - a big raw file: streamed in pieces as it is read, hashed along the way (the digest ends the stream);
//! - v2, chunked: cut at fixed uncompressed offsets, each chunk a blob of its own (compressed by the
//!   uploader, in parallel, when zstd is on);
//! - v2, compressed but not chunked: zstd-encoded here as one stream, hashed after compression.
//!
//! Every buffer holds permits of the push's memory budget (KiB units) until it has been sent, so a push
//! never holds more than the budget however big the snapshot. Sparse files arrive packed (their data
//! segments only, with the `COCOON.sparse.*` records), and go up packed.

use super::manifest;
use super::media;
use super::progress::Progress;
use super::tarfmt;
use bytes::{Bytes, BytesMut};
use sha2::Digest as _;
use std::io::{Read, Write};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

/// zstd is applied to files of at least this size (the Go writer's `compressMinBytes`).
pub(crate) const COMPRESS_MIN: u64 = 1 << 20;
/// The piece a stream hands over at a time.
const PIECE: usize = 1 << 20;
/// Pieces a stream may have in flight (its share of the budget: `STREAM_DEPTH` MiB).
const STREAM_DEPTH: usize = 4;

/// How entries are cut.
#[derive(Debug, Clone)]
pub(crate) struct ReadPlan {
    pub zstd_level: i32,
    pub chunk_size: u64,
    /// Raw files up to this size are read whole (and can be skipped when the registry has them).
    pub small_max: u64,
}

/// One file of the export (every entry but `snapshot.json`), announced before its blobs.
#[derive(Debug, Clone)]
pub(crate) struct FileEntry {
    pub index: usize,
    pub meta: tarfmt::EntryMeta,
}

/// Where a blob goes in the manifest.
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    pub file: usize,
    pub title: String,
    pub media_type: String,
    /// `(index, count)` when the file is cut into several blobs.
    pub chunk: Option<(usize, usize)>,
}

/// A piece of a streamed blob, holding its share of the budget until it is sent.
pub(crate) struct Piece(pub Bytes, pub OwnedSemaphorePermit);

pub(crate) enum Item {
    Envelope(Vec<u8>),
    File(FileEntry),
    /// A blob in memory. `digest` is `None` when the uploader compresses it first (at the push's level).
    Whole {
        layer: Layer,
        data: Bytes,
        digest: Option<String>,
        permit: OwnedSemaphorePermit,
    },
    /// A blob streamed as it is read; `length` is known for raw files. The digest of all its pieces
    /// follows on `digest` once the last one is sent (a separate channel: an HTTP body of known length
    /// is not read past its last byte); a reader that stops mid-file drops it unsent.
    Stream {
        layer: Layer,
        length: Option<u64>,
        pieces: mpsc::Receiver<Piece>,
        digest: oneshot::Receiver<String>,
    },
}

/// Why reading the export failed.
pub(crate) enum ReadError {
    /// The stream is unreadable or not a cocoon export.
    Source(String),
}

fn source(e: impl std::fmt::Display) -> ReadError {
    ReadError::Source(e.to_string())
}

/// KiB permits for `n` bytes.
pub(crate) fn kib(n: u64) -> u32 {
    n.div_ceil(1024).min(u32::MAX as u64) as u32
}

pub(crate) fn digest_of(h: sha2::Sha256) -> String {
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// The reader's end of the channels; `Err(())` from a send means the uploader stopped (its error is
/// the one reported).
pub(crate) struct Feed<'a> {
    pub tx: &'a mpsc::Sender<Item>,
    pub budget: &'a Arc<Semaphore>,
    pub handle: &'a tokio::runtime::Handle,
    pub progress: &'a Progress,
}

impl Feed<'_> {
    fn permit(&self, bytes: u64) -> Result<OwnedSemaphorePermit, ()> {
        self.handle
            .block_on(self.budget.clone().acquire_many_owned(kib(bytes).max(1)))
            .map_err(|_| ())
    }

    fn send(&self, item: Item) -> Result<(), ()> {
        self.tx.blocking_send(item).map_err(|_| ())
    }
}

/// Reads the whole export into `feed`. `Ok` also when the uploader stopped early.
pub(crate) fn read_export(input: impl Read, plan: &ReadPlan, feed: &Feed<'_>) -> Result<(), ReadError> {
    let mut archive = tar::Archive::new(input);
    let mut seen = std::collections::HashSet::new();
    let mut index = 0;
    for entry in archive
        .entries()
        .map_err(|e| source(format!("the export is not a tar stream: {e}")))?
    {
        let mut entry = entry.map_err(|e| source(format!("reading the next tar entry: {e}")))?;
        let meta = tarfmt::entry_meta(&mut entry).map_err(|e| source(format!("reading a tar header: {e}")))?;
        let kind = entry.header().entry_type();
        if kind != tar::EntryType::Regular && kind != tar::EntryType::Continuous {
            return Err(source(format!(
                "entry {:?} is not a regular file (cocoon exports are flat)",
                meta.name
            )));
        }
        if meta.name.contains('/') || meta.name.is_empty() {
            return Err(source(format!("entry {:?} is not a bare file name", meta.name)));
        }
        if !seen.insert(meta.name.clone()) {
            return Err(source(format!("entry {:?} appears twice", meta.name)));
        }
        let sent = if meta.name == "snapshot.json" {
            let mut b = Vec::new();
            (&mut entry)
                .take(manifest::MAX_CONFIG_BYTES)
                .read_to_end(&mut b)
                .map_err(|e| source(format!("reading snapshot.json: {e}")))?;
            feed.send(Item::Envelope(b))
        } else {
            index += 1;
            read_file(&mut entry, index, meta, plan, feed)?
        };
        if sent.is_err() {
            return Ok(());
        }
    }
    // Drain to EOF: the export stream reports cocoon's exit status only there.
    std::io::copy(&mut archive.into_inner(), &mut std::io::sink())
        .map_err(|e| source(format!("finishing the export stream: {e}")))?;
    Ok(())
}

fn read_file(
    entry: &mut impl Read,
    index: usize,
    meta: tarfmt::EntryMeta,
    plan: &ReadPlan,
    feed: &Feed<'_>,
) -> Result<Result<(), ()>, ReadError> {
    let size = meta.size;
    let name = meta.name.clone();
    if feed.send(Item::File(FileEntry { index, meta })).is_err() {
        return Ok(Err(()));
    }
    let compress = plan.zstd_level > 0 && size >= COMPRESS_MIN;
    let base_type = media::layer_media_type(&name);
    let layer = |chunk| Layer {
        file: index,
        title: name.clone(),
        media_type: if compress {
            media::zstd_media_type(base_type)
        } else {
            base_type.to_string()
        },
        chunk,
    };
    if plan.chunk_size > 0 && (compress || size > plan.chunk_size) {
        let count = size.div_ceil(plan.chunk_size).max(1) as usize;
        let mut left = size;
        for i in 0..count {
            let len = left.min(plan.chunk_size);
            left -= len;
            // A chunk to compress is held raw and compressed: both count.
            let Ok(permit) = feed.permit(if compress { 2 * len } else { len }) else {
                return Ok(Err(()));
            };
            let data = read_exact(entry, len, &name)?;
            let digest = (!compress).then(|| digest_of(sha2::Sha256::new_with_prefix(&data)));
            let item = Item::Whole {
                layer: layer((count > 1).then_some((i, count))),
                data,
                digest,
                permit,
            };
            if feed.send(item).is_err() {
                return Ok(Err(()));
            }
        }
        return Ok(Ok(()));
    }
    if compress {
        return stream_compressed(entry, layer(None), size, plan.zstd_level, feed);
    }
    if size <= plan.small_max {
        let Ok(permit) = feed.permit(size) else {
            return Ok(Err(()));
        };
        let data = read_exact(entry, size, &name)?;
        let digest = Some(digest_of(sha2::Sha256::new_with_prefix(&data)));
        return Ok(feed.send(Item::Whole {
            layer: layer(None),
            data,
            digest,
            permit,
        }));
    }
    stream_raw(entry, layer(None), size, feed)
}

fn read_exact(entry: &mut impl Read, len: u64, name: &str) -> Result<Bytes, ReadError> {
    let mut buf = vec![0u8; len as usize];
    entry
        .read_exact(&mut buf)
        .map_err(|e| source(format!("reading {name}: {e}")))?;
    Ok(Bytes::from(buf))
}

/// A raw file as pieces, hashed as they go by.
fn stream_raw(entry: &mut impl Read, layer: Layer, size: u64, feed: &Feed<'_>) -> Result<Result<(), ()>, ReadError> {
    let name = layer.title.clone();
    let (tx, pieces) = mpsc::channel(STREAM_DEPTH);
    let (digest_tx, digest) = oneshot::channel();
    if feed
        .send(Item::Stream {
            layer,
            length: Some(size),
            pieces,
            digest,
        })
        .is_err()
    {
        return Ok(Err(()));
    }
    let mut hasher = sha2::Sha256::new();
    let mut left = size;
    while left > 0 {
        let len = left.min(PIECE as u64);
        let Ok(permit) = feed.permit(len) else {
            return Ok(Err(()));
        };
        let data = read_exact(entry, len, &name)?;
        hasher.update(&data);
        left -= len;
        if tx.blocking_send(Piece(data, permit)).is_err() {
            return Ok(Err(()));
        }
        feed.progress.advance(len);
    }
    Ok(digest_tx.send(digest_of(hasher)).map_err(|_| ()))
}

/// A file zstd-encoded as one stream (v2 without chunks), hashed after compression.
fn stream_compressed(
    entry: &mut impl Read,
    layer: Layer,
    size: u64,
    level: i32,
    feed: &Feed<'_>,
) -> Result<Result<(), ()>, ReadError> {
    let name = layer.title.clone();
    let (tx, pieces) = mpsc::channel(STREAM_DEPTH);
    let (digest_tx, digest) = oneshot::channel();
    if feed
        .send(Item::Stream {
            layer,
            length: None,
            pieces,
            digest,
        })
        .is_err()
    {
        return Ok(Err(()));
    }
    let out = PieceWriter {
        tx: &tx,
        feed,
        buf: BytesMut::with_capacity(PIECE),
        hasher: sha2::Sha256::new(),
    };
    let mut enc = zstd::stream::write::Encoder::new(out, level).map_err(|e| source(format!("zstd: {e}")))?;
    let mut buf = vec![0u8; PIECE];
    let mut left = size;
    while left > 0 {
        let len = left.min(PIECE as u64) as usize;
        entry
            .read_exact(&mut buf[..len])
            .map_err(|e| source(format!("reading {name}: {e}")))?;
        if enc.write_all(&buf[..len]).is_err() {
            // Only the channel can fail a write into memory: the uploader stopped.
            return Ok(Err(()));
        }
        left -= len as u64;
        feed.progress.advance(len as u64);
    }
    let Ok(mut out) = enc.finish() else {
        return Ok(Err(()));
    };
    if out.flush_piece().is_err() {
        return Ok(Err(()));
    }
    let digest = digest_of(std::mem::take(&mut out.hasher));
    // The last piece is in the channel: closing it ends the body, then the digest commits the upload.
    drop(out);
    drop(tx);
    Ok(digest_tx.send(digest).map_err(|_| ()))
}

/// The sink of the zstd encoder: hashes what comes out and hands it over in pieces.
struct PieceWriter<'a, 'f> {
    tx: &'a mpsc::Sender<Piece>,
    feed: &'a Feed<'f>,
    buf: BytesMut,
    hasher: sha2::Sha256,
}

impl PieceWriter<'_, '_> {
    fn flush_piece(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let broken = || std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the uploader stopped");
        let permit = self.feed.permit(self.buf.len() as u64).map_err(|_| broken())?;
        let data = self.buf.split().freeze();
        self.buf.reserve(PIECE);
        self.hasher.update(&data);
        self.tx.blocking_send(Piece(data, permit)).map_err(|_| broken())
    }
}

impl Write for PieceWriter<'_, '_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() >= PIECE {
            self.flush_piece()?;
        }
        let n = b.len().min(PIECE - self.buf.len());
        self.buf.extend_from_slice(&b[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
