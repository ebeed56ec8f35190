//! Filesystem space, the data extents of sparse files, pipe buffers, durable file replacement.

use std::io::{self, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use rustix::fs::SeekFrom;

/// The space of the filesystem holding a path (`statvfs`), in bytes and inodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    pub total: u64,
    /// Free to unprivileged users (`f_bavail`).
    pub available: u64,
    /// In use: total less the free blocks (`f_bfree`, which counts the root reserve as free).
    pub used: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

/// `statvfs(path)`.
pub fn space(path: &Path) -> io::Result<FsSpace> {
    let s = rustix::fs::statvfs(path)?;
    Ok(FsSpace {
        total: s.f_blocks.saturating_mul(s.f_frsize),
        available: s.f_bavail.saturating_mul(s.f_frsize),
        used: s.f_blocks.saturating_sub(s.f_bfree).saturating_mul(s.f_frsize),
        inodes: s.f_files,
        inodes_free: s.f_ffree,
    })
}

/// The offset of the first data byte at or after `offset` (`SEEK_DATA`); `ENXIO` past the last.
pub fn next_data(file: &impl AsFd, offset: u64) -> io::Result<u64> {
    Ok(rustix::fs::seek(file, SeekFrom::Data(offset))?)
}

/// The offset of the first hole at or after `offset` (`SEEK_HOLE`; the end of the file counts).
pub fn next_hole(file: &impl AsFd, offset: u64) -> io::Result<u64> {
    Ok(rustix::fs::seek(file, SeekFrom::Hole(offset))?)
}

/// Asks for a 1 MiB pipe buffer (Linux `F_SETPIPE_SZ`). Best effort: a smaller buffer only costs
/// throughput, so a refusal is ignored.
pub fn widen_pipe(pipe: &impl AsFd) {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl(F_SETPIPE_SZ) only resizes the kernel buffer of a descriptor the caller
    // holds open for the duration of the call.
    unsafe {
        libc::fcntl(pipe.as_fd().as_raw_fd(), libc::F_SETPIPE_SZ, 1 << 20);
    }
}

/// Replaces `path` with `bytes`, so that a crash or a power loss at any point leaves either the
/// old file or the whole new one, never a part (a state record cut short would read back as
/// garbage). The bytes go to a temporary file beside it (a dot name, created `0600` and then
/// given `mode` before any byte is written), which is synced, renamed over `path`, and the
/// directory synced so the rename itself is on disk.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir)?;
    tmp.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, Write};

    use super::*;

    #[test]
    fn a_replaced_file_has_the_new_bytes_and_mode_and_leaves_nothing_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record");
        std::fs::write(&path, b"old and longer").unwrap();
        write_atomically(&path, b"new", 0o640).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["record"], "no temporary file is left behind");
        let missing_dir = dir.path().join("missing").join("record");
        assert!(write_atomically(&missing_dir, b"x", 0o600).is_err());
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"new",
            "a failed write elsewhere touches nothing"
        );
    }

    #[test]
    fn the_space_of_a_filesystem_adds_up() {
        let dir = tempfile::tempdir().unwrap();
        let s = space(dir.path()).unwrap();
        assert!(s.total > 0 && s.available <= s.total && s.used <= s.total, "{s:?}");
        assert!(space(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn data_and_holes_of_a_sparse_file_are_found() {
        let mut f = tempfile::tempfile().unwrap();
        f.seek(std::io::SeekFrom::Start(4 << 20)).unwrap();
        f.write_all(&[1u8; 4096]).unwrap();
        f.set_len(8 << 20).unwrap();
        let data = next_data(&f, 0).unwrap();
        assert!(data <= 4 << 20, "data found at {data}");
        assert!(next_hole(&f, 4 << 20).unwrap() > 4 << 20);
        let mut dense = tempfile::tempfile().unwrap();
        dense.write_all(&[1u8; 8192]).unwrap();
        assert_eq!(next_hole(&dense, 0).unwrap(), 8192, "the end counts as a hole");
    }
}
