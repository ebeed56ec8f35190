//! Filesystem space, the data extents of sparse files, pipe buffers.

use std::io;
use std::os::fd::AsFd;
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

#[cfg(test)]
mod tests {
    use std::io::{Seek, Write};

    use super::*;

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
