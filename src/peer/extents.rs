//! Which byte ranges of a snapshot file a peer sends: the file's data
//! extents (SEEK_DATA / SEEK_HOLE), holes of at most [`MAX_COALESCED_HOLE`] merged into the
//! surrounding data (one request beats two for a small gap), then cut into slices of at most
//! [`MAX_SLICE`]. The pure part ([`slices`]) is separate from the syscalls ([`data_extents`]).

use std::fs::File;
use std::io;

use super::protocol::Slice;
use crate::host;

/// Holes up to this size are sent as zeros instead of splitting the slice.
pub const MAX_COALESCED_HOLE: u64 = 4 << 20;
/// The largest slice a plan names.
pub const MAX_SLICE: u64 = 256 << 20;

/// The plan's slices for a file whose data lies in `extents` (`(offset, length)`, sorted,
/// non-overlapping).
pub fn slices(extents: &[(u64, u64)], max_hole: u64, max_slice: u64) -> Vec<Slice> {
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for &(offset, length) in extents.iter().filter(|(_, l)| *l > 0) {
        match merged.last_mut() {
            Some((start, len)) if offset.saturating_sub(*start + *len) <= max_hole => {
                *len = (offset + length).max(*start + *len) - *start;
            }
            _ => merged.push((offset, length)),
        }
    }
    let mut out = Vec::new();
    for (mut offset, mut length) in merged {
        while length > 0 {
            let take = length.min(max_slice);
            out.push(Slice { offset, length: take });
            offset += take;
            length -= take;
        }
    }
    out
}

/// The data extents of `file` (apparent size `size`), as the filesystem reports them. A
/// filesystem without SEEK_DATA support reports the whole file as data (correct, not sparse).
pub fn data_extents(file: &File, size: u64) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut pos: u64 = 0;
    while pos < size {
        let data = match host::fs::next_data(file, pos) {
            Ok(d) => d,
            // ENXIO: no data at or after `pos`.
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && pos == 0 => return Ok(vec![(0, size)]),
            Err(e) => return Err(e),
        };
        if data >= size {
            break;
        }
        let hole = host::fs::next_hole(file, data)?.min(size);
        out.push((data, hole - data));
        pos = hole;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::io::{Seek, SeekFrom, Write};

    use super::*;

    fn s(offset: u64, length: u64) -> Slice {
        Slice { offset, length }
    }

    #[test]
    fn small_holes_are_coalesced_and_large_ones_split_slices() {
        let mib = 1 << 20;
        // A 4 MiB hole merges; a 4 MiB + 1 hole does not.
        let ext = [(0, mib), (5 * mib, mib), (10 * mib + 1, mib)];
        assert_eq!(
            slices(&ext, MAX_COALESCED_HOLE, MAX_SLICE),
            vec![s(0, 6 * mib), s(10 * mib + 1, mib)]
        );
        assert_eq!(slices(&[], MAX_COALESCED_HOLE, MAX_SLICE), vec![]);
        assert_eq!(slices(&[(7, 0)], MAX_COALESCED_HOLE, MAX_SLICE), vec![]);
    }

    #[test]
    fn long_extents_are_cut_at_the_slice_cap() {
        let ext = [(100, 600)];
        assert_eq!(slices(&ext, 0, 256), vec![s(100, 256), s(356, 256), s(612, 88)]);
        // Coalescing happens before cutting: the cap applies to the merged run.
        assert_eq!(slices(&[(0, 200), (210, 200)], 16, 256), vec![s(0, 256), s(256, 154)]);
    }

    #[test]
    fn the_filesystem_reports_a_sparse_files_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cow.raw");
        let mut f = File::create(&path).unwrap();
        let block = vec![7u8; 64 << 10];
        f.write_all(&block).unwrap();
        f.seek(SeekFrom::Start(32 << 20)).unwrap();
        f.write_all(&block).unwrap();
        f.set_len(64 << 20).unwrap();
        drop(f);
        let f = File::open(&path).unwrap();
        let ext = data_extents(&f, 64 << 20).unwrap();
        let data: u64 = ext.iter().map(|(_, l)| l).sum();
        // The filesystem's block granularity may round the extents up, never down; the
        // 32 MiB hole in the middle is seen.
        assert!((128 << 10..32 << 20).contains(&data), "{ext:?}");
        assert_eq!(ext[0].0, 0);
        assert!(ext.iter().any(|(o, _)| *o >= 16 << 20), "{ext:?}");
        let empty = File::create(dir.path().join("empty")).unwrap();
        assert_eq!(data_extents(&empty, 0).unwrap(), vec![]);
    }
}
