//! The staging directory (`VK_STAGING_DIR`): where a peer restore lays out a snapshot in the
//! `--to-dir` format for `vm clone --from-dir`. Each restore gets a fresh
//! `<root>/<sanitized-name>-XXXXXX/` that is removed when the restore fails or once the clone
//! is done; whatever a crash left behind is swept at startup.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::arrivals::{Arrivals, ChunkBuffer};

/// Chunks of all-zero bytes this long (aligned within a slice) are not written: the staged
/// file keeps a hole there, as the source had (a guest's untouched memory, a sparse disk).
pub const ZERO_CHUNK: usize = 1 << 20;

/// The longest single write to a staged file. The page cache sizes the folio a write lands in
/// by the write's length, and a large folio comes from the kernel's high-order free blocks: on a
/// node that is itself a VM whose host takes free guest memory back (free page reporting),
/// those are exactly the blocks the host must fault in again. Measured on such a VM, beyond the
/// memory recently in use: writing a file in 1 MiB writes cost 1.6–1.8 s of CPU per GiB, in
/// 256 KiB writes 0.28–0.30 s, the same as while warm.
const WRITE_PIECE: usize = 256 << 10;

#[derive(Debug, Clone)]
pub struct Staging {
    root: PathBuf,
}

impl Staging {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Creates the root if needed and removes everything inside it (a restore in flight at a
    /// crash never finished: its directory has no use). Returns how many entries went.
    pub fn sweep(&self) -> io::Result<usize> {
        std::fs::create_dir_all(&self.root)?;
        let mut removed = 0;
        for entry in std::fs::read_dir(&self.root)? {
            let entry = entry?;
            // `file_type` does not follow symlinks: a link is removed, never its target.
            let result = if entry.file_type()?.is_dir() {
                std::fs::remove_dir_all(entry.path())
            } else {
                std::fs::remove_file(entry.path())
            };
            match result {
                Ok(()) => removed += 1,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(removed)
    }

    /// A fresh directory for restoring `name`; removed when the returned value drops.
    pub fn fresh(&self, name: &str) -> io::Result<tempfile::TempDir> {
        std::fs::create_dir_all(&self.root)?;
        tempfile::Builder::new()
            .prefix(&format!("{}-", sanitize(name)))
            .tempdir_in(&self.root)
    }
}

/// A name safe as one path component: `[A-Za-z0-9._-]`, others become `_`, at most 64 bytes.
pub fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    match s.trim_start_matches('.') {
        "" => "snapshot".into(),
        t => t.to_string(),
    }
}

/// A staged file, written by the writers of all its slices at once. Buffered writes to one file
/// take the inode's lock in the kernel, and a writer waiting for it spins on a core while its
/// holder copies; the writers here take a lock of their own first, whose waiters sleep.
pub struct StagedFile {
    file: File,
    writing: Mutex<()>,
}

impl StagedFile {
    pub fn new(file: File) -> Self {
        Self {
            file,
            writing: Mutex::new(()),
        }
    }

    /// Writes `bytes` at `offset`, in writes of at most [`WRITE_PIECE`].
    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        let _writing = self.writing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut at = offset;
        for piece in bytes.chunks(WRITE_PIECE) {
            self.file.write_all_at(piece, at)?;
            at += piece.len() as u64;
        }
        Ok(())
    }
}

/// Writes one slice's bytes at its offset, skipping all-zero [`ZERO_CHUNK`]s. Received frames are
/// copied into a chunk buffer (so the receive buffers they came in are free again at once);
/// a whole chunk's zero check and write run on the blocking pool, off the async workers that
/// receive the next frames. When the file's [`Arrivals`] have room in the node's budget, the
/// chunk's buffer is one the budget counts and goes to them once written, kept for the
/// registry check so it can hash the bytes without reading them back; otherwise the writer
/// reuses a buffer of its own.
pub struct SliceWriter {
    file: Arc<StagedFile>,
    pos: u64,
    /// The chunk being filled.
    chunk: Option<ChunkBuffer>,
    /// The writer's own buffer, reused while the budget has no room.
    spare: Option<ChunkBuffer>,
    /// Told of each chunk once it is on disk (see [`Arrivals`]).
    landing: Option<Arc<Arrivals>>,
    /// Bytes actually written (the rest stayed holes).
    pub written: u64,
}

impl SliceWriter {
    pub fn new(file: Arc<StagedFile>, offset: u64) -> Self {
        Self {
            file,
            pos: offset,
            chunk: None,
            spare: None,
            landing: None,
            written: 0,
        }
    }

    /// Reports each chunk to `arrivals` once written (or left a hole).
    pub fn landing_in(mut self, arrivals: Arc<Arrivals>) -> Self {
        self.landing = Some(arrivals);
        self
    }

    pub async fn push(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            if self.chunk.is_none() {
                self.chunk = Some(self.next_buffer());
            }
            let chunk = self.chunk.as_mut().expect("set above");
            bytes = &bytes[chunk.fill(bytes)..];
            if chunk.is_full() {
                self.flush().await?;
            }
        }
        Ok(())
    }

    /// A budget-counted buffer when there is room, else the writer's own.
    fn next_buffer(&mut self) -> ChunkBuffer {
        self.landing
            .as_ref()
            .and_then(|arrivals| arrivals.buffer(ZERO_CHUNK))
            .or_else(|| self.spare.take())
            .unwrap_or_else(|| ChunkBuffer::uncounted(ZERO_CHUNK))
    }

    /// Writes what is held (the slice's tail).
    pub async fn flush(&mut self) -> io::Result<()> {
        let Some(chunk) = self.chunk.take().filter(|c| !c.is_empty()) else {
            return Ok(());
        };
        let (file, pos) = (self.file.clone(), self.pos);
        let (mut chunk, data) = tokio::task::spawn_blocking(move || -> io::Result<(ChunkBuffer, bool)> {
            if all_zero(chunk.as_ref()) {
                return Ok((chunk, false));
            }
            file.write_at(chunk.as_ref(), pos)?;
            Ok((chunk, true))
        })
        .await
        .map_err(io::Error::other)??;
        let len = chunk.len() as u64;
        if data {
            self.written += len;
        }
        match (&self.landing, chunk.is_counted()) {
            (Some(arrivals), true) => arrivals.land_chunk(self.pos, chunk),
            (landing, _) => {
                if let Some(arrivals) = landing {
                    arrivals.land(self.pos, len);
                }
                chunk.clear();
                self.spare = Some(chunk);
            }
        }
        self.pos += len;
        Ok(())
    }
}

/// Whether `bytes` are all zero: OR-folds 4 KiB blocks (the fold vectorises; the early exit
/// between blocks stops at the first page holding data).
fn all_zero(bytes: &[u8]) -> bool {
    bytes
        .chunks(4096)
        .all(|block| block.iter().fold(0u8, |acc, &b| acc | b) == 0)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    #[test]
    fn names_become_one_safe_component() {
        assert_eq!(sanitize("vk-default-demo-0"), "vk-default-demo-0");
        assert_eq!(sanitize("../../etc"), "_.._etc");
        assert_eq!(sanitize("a/b:c"), "a_b_c");
        assert_eq!(sanitize(""), "snapshot");
        assert_eq!(sanitize(&"x".repeat(100)).len(), 64);
    }

    #[test]
    fn the_sweep_empties_the_root_and_never_follows_links() {
        let base = tempfile::tempdir().unwrap();
        let outside = base.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"x").unwrap();
        let staging = Staging::new(base.path().join("staging"));
        assert_eq!(staging.sweep().unwrap(), 0, "a missing root is created");
        let left = staging.fresh("vk-a").unwrap().keep();
        std::fs::write(left.join("memory-ranges"), b"m").unwrap();
        std::fs::write(staging.root().join("stray"), b"s").unwrap();
        std::os::unix::fs::symlink(&outside, staging.root().join("link")).unwrap();
        assert_eq!(staging.sweep().unwrap(), 3);
        assert_eq!(std::fs::read_dir(staging.root()).unwrap().count(), 0);
        assert!(outside.join("keep").exists(), "a symlink's target survives the sweep");
    }

    #[tokio::test]
    async fn zero_chunks_stay_holes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mem");
        let file = File::create(&path).unwrap();
        file.set_len(8 * ZERO_CHUNK as u64).unwrap();
        let mut w = SliceWriter::new(Arc::new(StagedFile::new(file)), ZERO_CHUNK as u64);
        // 3 chunks: zero, data, zero; fed in odd frame sizes.
        let mut bytes = vec![0u8; 3 * ZERO_CHUNK];
        bytes[ZERO_CHUNK + 5] = 9;
        for frame in bytes.chunks(100_003) {
            w.push(frame).await.unwrap();
        }
        w.flush().await.unwrap();
        assert_eq!(w.written, ZERO_CHUNK as u64);
        drop(w);
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.len(), 8 * ZERO_CHUNK as u64);
        assert!(meta.blocks() * 512 <= 2 * ZERO_CHUNK as u64, "{} blocks", meta.blocks());
        let back = std::fs::read(&path).unwrap();
        assert_eq!(back[2 * ZERO_CHUNK + 5], 9);
        assert_eq!(back.iter().filter(|&&b| b != 0).count(), 1);
    }
}
