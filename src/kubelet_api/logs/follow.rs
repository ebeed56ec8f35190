//! `follow=true`: the hypervisor's log file streamed as it grows (inotify on its directory,
//! with a 1 s poll as a backstop), until the client leaves, the pod's VM goes, or the daemon
//! stops. A truncated or replaced file is read again from its start, as `cocoon vm logs -f`
//! does.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use notify::Watcher;
use tokio_util::sync::CancellationToken;

use super::lines::Emitter;

/// The most bytes read from the log (and turned into output) at once. The log's size is the
/// guest's to choose (a firecracker guest's serial console *is* its log), so a follow holds a
/// chunk of it, never the file, and each chunk is read and rendered on the blocking pool: the
/// async workers (lease renewals, status updates) never wait on a log.
pub const CHUNK: usize = 64 * 1024;
/// The longest line carried from one chunk to the next: a longer one is emitted in pieces of
/// this size (a guest that never prints a line break holds no more than this).
pub const MAX_LINE: usize = 1024 * 1024;

/// The byte offset of the last `n` lines of `file` (a final `\n` does not start an empty line,
/// like `cocoon vm logs --tail`). Reads backwards a chunk at a time and looks at each byte once:
/// linear in what it reads, with one chunk in memory, however large `n` and the file are.
pub fn tail_offset(file: &File, n: u64) -> io::Result<u64> {
    let size = file.metadata()?.len();
    if n == 0 {
        return Ok(size);
    }
    let mut chunk = vec![0u8; CHUNK];
    let mut end = size;
    let mut found = 0u64;
    let mut first = true;
    while end > 0 {
        let start = end.saturating_sub(CHUNK as u64);
        let buf = &mut chunk[..(end - start) as usize];
        file.read_exact_at(buf, start)?;
        let mut scan = &buf[..];
        if first {
            // The file's final line break ends the last line; it does not start one.
            if let Some((b'\n', rest)) = scan.split_last() {
                scan = rest;
            }
            first = false;
        }
        while let Some(i) = scan.iter().rposition(|b| *b == b'\n') {
            found += 1;
            if found == n {
                return Ok(start + i as u64 + 1);
            }
            scan = &scan[..i];
        }
        end = start;
    }
    Ok(0)
}

/// Complete lines out of a byte stream read in chunks: each byte is looked at once, and only the
/// unfinished last line (at most [`MAX_LINE`] bytes) is carried over.
#[derive(Debug, Default)]
pub struct Lines {
    partial: Vec<u8>,
}

impl Lines {
    /// Calls `line` with each line `chunk` completes (without its `\n`).
    pub fn feed(&mut self, mut chunk: &[u8], mut line: impl FnMut(&[u8])) {
        while let Some(nl) = chunk.iter().position(|b| *b == b'\n') {
            if self.partial.is_empty() {
                line(&chunk[..nl]);
            } else {
                self.partial.extend_from_slice(&chunk[..nl]);
                line(&self.partial);
                self.partial.clear();
            }
            chunk = &chunk[nl + 1..];
        }
        while self.partial.len() + chunk.len() > MAX_LINE {
            let take = MAX_LINE - self.partial.len();
            self.partial.extend_from_slice(&chunk[..take]);
            line(&self.partial);
            self.partial.clear();
            chunk = &chunk[take..];
        }
        self.partial.extend_from_slice(chunk);
    }

    /// The unfinished last line, if any (the text is over).
    pub fn finish(&mut self, line: impl FnOnce(&[u8])) {
        if !self.partial.is_empty() {
            line(&self.partial);
            self.partial.clear();
        }
    }

    fn clear(&mut self) {
        self.partial.clear();
    }
}

/// Renders one line through the emitter.
fn emit(emitter: &mut Emitter, line: &[u8], now: chrono::DateTime<chrono::Utc>, out: &mut Vec<u8>) {
    emitter.line(String::from_utf8_lossy(line).as_ref(), now, out);
}

/// Open handle plus where reading goes on.
struct Cursor {
    path: PathBuf,
    file: File,
    inode: u64,
    offset: u64,
    lines: Lines,
    buf: Vec<u8>,
}

impl Cursor {
    /// Reads the next chunk appended since the last call into `buf` (blocking): empty when
    /// there is nothing new. A truncated or replaced file starts over.
    fn read_chunk(&mut self) -> io::Result<()> {
        if let Ok(meta) = std::fs::metadata(&self.path)
            && meta.ino() != self.inode
            && let Ok(f) = File::open(&self.path)
        {
            self.inode = meta.ino();
            self.file = f;
            self.offset = 0;
            self.lines.clear();
        }
        let size = self.file.metadata()?.len();
        if size < self.offset {
            self.offset = 0;
            self.lines.clear();
        }
        let want = (size - self.offset).min(CHUNK as u64) as usize;
        self.buf.resize(want, 0);
        let n = self.file.read_at(&mut self.buf, self.offset)?;
        self.buf.truncate(n);
        self.offset += n as u64;
        Ok(())
    }

    /// One step of the follow (blocking): reads a chunk and renders its complete lines; the
    /// output, and whether the chunk was full (more is there to read at once).
    fn step(&mut self, emitter: &mut Emitter, last_pass: bool) -> io::Result<(Vec<u8>, bool)> {
        let now = chrono::Utc::now();
        let mut out = Vec::new();
        self.read_chunk()?;
        let full = self.buf.len() == CHUNK;
        let Cursor { lines, buf, .. } = self;
        lines.feed(buf, |line| emit(emitter, line, now, &mut out));
        if last_pass && !full {
            lines.finish(|line| emit(emitter, line, now, &mut out));
        }
        Ok((out, full))
    }
}

/// Opens `path` for following, positioned at its last `tail` lines (or its start). Blocking:
/// finding the tail reads the file (backwards, linearly); call it on the blocking pool.
pub fn open(path: &Path, tail: Option<u64>) -> io::Result<impl FnOnce(FollowArgs) -> FollowStream + Send + use<>> {
    let file = File::open(path)?;
    let inode = file.metadata()?.ino();
    let offset = match tail {
        Some(n) => tail_offset(&file, n)?,
        None => 0,
    };
    let cursor = Cursor {
        path: path.to_path_buf(),
        file,
        inode,
        offset,
        lines: Lines::default(),
        buf: Vec::with_capacity(CHUNK),
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
        let FollowArgs { emitter, still_running, shutdown, guard } = args;
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
        let mut state = (cursor, emitter);
        let mut last_pass = false;
        loop {
            // A chunk at a time, read and rendered on the blocking pool; the stream yields
            // each chunk's output before the next is read (the client's pace sets ours).
            let (s, stepped) = tokio::task::spawn_blocking(move || {
                let (mut cursor, mut emitter) = state;
                let r = cursor.step(&mut emitter, last_pass);
                ((cursor, emitter), r)
            })
            .await
            .map_err(io::Error::other)?;
            state = s;
            let (out, more) = stepped?;
            if !out.is_empty() {
                yield Bytes::from(out);
            }
            if state.1.done() || (last_pass && !more) {
                break;
            }
            if more {
                continue;
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
    fn lines_split_across_chunks_and_long_lines_are_cut() {
        let text = b"one\ntwo\nthree and more\nfour";
        for step in [1, 2, 3, 5, 7, 100] {
            let mut lines = Lines::default();
            let mut got: Vec<String> = Vec::new();
            for chunk in text.chunks(step) {
                lines.feed(chunk, |l| got.push(String::from_utf8_lossy(l).into_owned()));
            }
            lines.finish(|l| got.push(String::from_utf8_lossy(l).into_owned()));
            assert_eq!(got, ["one", "two", "three and more", "four"], "step {step}");
        }
        // A line with no end holds at most MAX_LINE bytes.
        let mut lines = Lines::default();
        let mut got = Vec::new();
        for _ in 0..5 {
            lines.feed(&vec![b'x'; MAX_LINE / 2 + 1], |l| got.push(l.len()));
        }
        assert_eq!(got, [MAX_LINE, MAX_LINE]);
        assert!(lines.partial.len() <= MAX_LINE);
    }

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
        // Across a chunk boundary, and the rules of `lines::tail_start` (which it must agree
        // with: the same tail either way).
        for n in [1, 2, 7_000, 19_999, 20_000, 20_001] {
            let off = tail_offset(&f, n).unwrap() as usize;
            assert_eq!(off, super::super::lines::tail_start(text.as_bytes(), n), "{n}");
        }
        std::fs::write(&p, "a\nb").unwrap();
        let f = File::open(&p).unwrap();
        assert_eq!(tail_offset(&f, 1).unwrap(), 2, "an unterminated last line");
        std::fs::write(&p, "").unwrap();
        assert_eq!(tail_offset(&File::open(&p).unwrap(), 3).unwrap(), 0);
    }
}
