//! `follow=true`: the hypervisor's log file streamed as it grows (inotify on its directory,
//! with a 1 s poll as a backstop), until the client leaves, the pod's VM goes, or the daemon
//! stops. A truncated or replaced file is read again from its start, as `cocoon vm logs -f`
//! does.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use notify::Watcher;
use tokio_util::sync::CancellationToken;

use super::lines::{Emitter, tail_start};

/// The byte offset of the last `n` lines of `file`, reading backwards in chunks (the file may
/// be large).
pub fn tail_offset(file: &File, n: u64) -> io::Result<u64> {
    let size = file.metadata()?.len();
    const CHUNK: u64 = 64 * 1024;
    let mut pos = size;
    let mut buf = Vec::new();
    while pos > 0 {
        let read = CHUNK.min(pos);
        pos -= read;
        let mut chunk = vec![0; read as usize];
        file.read_exact_at(&mut chunk, pos)?;
        chunk.extend_from_slice(&buf);
        buf = chunk;
        let start = tail_start(&buf, n);
        if start > 0 || pos == 0 {
            return Ok(pos + start as u64);
        }
    }
    Ok(0)
}

/// Open handle plus where reading goes on.
struct Cursor {
    path: PathBuf,
    file: Arc<File>,
    inode: u64,
    offset: u64,
    pending: Vec<u8>,
}

impl Cursor {
    /// Reads what was appended since the last call (blocking). A truncated or replaced file
    /// starts over.
    fn read_new(&mut self) -> io::Result<Vec<u8>> {
        if let Ok(meta) = std::fs::metadata(&self.path)
            && meta.ino() != self.inode
            && let Ok(f) = File::open(&self.path)
        {
            self.inode = meta.ino();
            self.file = Arc::new(f);
            self.offset = 0;
            self.pending.clear();
        }
        let size = self.file.metadata()?.len();
        if size < self.offset {
            self.offset = 0;
            self.pending.clear();
        }
        let mut out = vec![0; (size - self.offset) as usize];
        let n = self.file.read_at(&mut out, self.offset)?;
        out.truncate(n);
        self.offset += n as u64;
        Ok(out)
    }
}

/// Opens `path` for following, positioned at its last `tail` lines (or its start).
pub fn open(path: &Path, tail: Option<u64>) -> io::Result<impl FnOnce(FollowArgs) -> FollowStream> {
    let file = File::open(path)?;
    let inode = file.metadata()?.ino();
    let offset = match tail {
        Some(n) => tail_offset(&file, n)?,
        None => 0,
    };
    let cursor = Cursor {
        path: path.to_path_buf(),
        file: Arc::new(file),
        inode,
        offset,
        pending: Vec::new(),
    };
    Ok(move |args: FollowArgs| follow(cursor, args))
}

pub struct FollowArgs {
    pub emitter: Emitter,
    /// False once the pod's VM is gone (checked every poll).
    pub still_running: Box<dyn Fn() -> bool + Send + Sync>,
    pub shutdown: CancellationToken,
    /// Held while the stream lives (the in-flight gauge).
    pub guard: Box<dyn Send + Sync>,
}

pub type FollowStream = std::pin::Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

const POLL: Duration = Duration::from_secs(1);

fn follow(cursor: Cursor, args: FollowArgs) -> FollowStream {
    Box::pin(async_stream::try_stream! {
        let FollowArgs { mut emitter, still_running, shutdown, guard } = args;
        let _guard = guard;
        let (tx, mut changed) = tokio::sync::mpsc::unbounded_channel::<()>();
        let dir = cursor.path.parent().map(Path::to_path_buf);
        // inotify on the directory catches appends and a replaced file; without it (an
        // unsupported filesystem) the poll still delivers within a second.
        let _watcher = dir.and_then(|dir| {
            let mut w = notify::recommended_watcher(move |_res: notify::Result<notify::Event>| {
                let _ = tx.send(());
            })
            .ok()?;
            w.watch(&dir, notify::RecursiveMode::NonRecursive).ok()?;
            Some(w)
        });
        let mut watching = _watcher.is_some();
        let mut cursor = cursor;
        let mut last_pass = false;
        loop {
            let (c, new) = tokio::task::spawn_blocking(move || {
                let r = cursor.read_new();
                (cursor, r)
            })
            .await
            .map_err(io::Error::other)?;
            cursor = c;
            let new = new?;
            cursor.pending.extend_from_slice(&new);
            let mut out = Vec::new();
            let now = chrono::Utc::now();
            while let Some(nl) = cursor.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = cursor.pending.drain(..=nl).collect();
                emitter.line(String::from_utf8_lossy(&line[..line.len() - 1]).as_ref(), now, &mut out);
            }
            if last_pass && !cursor.pending.is_empty() {
                let rest = std::mem::take(&mut cursor.pending);
                emitter.line(String::from_utf8_lossy(&rest).as_ref(), now, &mut out);
            }
            if !out.is_empty() {
                yield Bytes::from(out);
            }
            if emitter.done() || last_pass {
                break;
            }
            tokio::select! {
                r = changed.recv(), if watching => watching = r.is_some(),
                _ = tokio::time::sleep(POLL) => {}
                _ = shutdown.cancelled() => last_pass = true,
            }
            if !still_running() {
                // One more read: the VM's last words.
                last_pass = true;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_offset_reads_backwards_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        let mut text = String::new();
        for i in 0..20_000 {
            text.push_str(&format!("line {i}\n"));
        }
        std::fs::write(&p, &text).unwrap();
        let f = File::open(&p).unwrap();
        let off = tail_offset(&f, 3).unwrap() as usize;
        assert_eq!(&text[off..], "line 19997\nline 19998\nline 19999\n");
        assert_eq!(tail_offset(&f, 1_000_000).unwrap(), 0);
        assert_eq!(tail_offset(&f, 0).unwrap() as usize, text.len());
    }
}
