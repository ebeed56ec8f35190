//! A peer's copy of a snapshot checked against what the registry says the snapshot is
//! ([`crate::registry::content`]): the same files with the same sizes before anything is
//! fetched, then every byte of data hashed against the registry's blob digests once the copy
//! is staged. A slice's CRC-32C only catches accidents: whoever sends the bytes can send a
//! matching checksum. The digests come from the registry, so a peer that changes one byte can
//! only make the restore fall back to a registry pull, never change the guest that boots.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use sha2::{Digest, Sha256};

use super::arrivals::{Aborted, Arrivals};
use super::protocol::Plan;
use crate::registry::content::FileContent;

/// Bytes hashed per read.
const READ_CHUNK: usize = 1 << 20;

/// The plan names exactly the registry's files, each with its apparent size.
pub fn check_plan(plan: &Plan, files: &[FileContent]) -> Result<(), String> {
    let want: BTreeMap<&str, u64> = files.iter().map(|f| (f.name.as_str(), f.apparent_size)).collect();
    let got: BTreeMap<&str, u64> = plan.files.iter().map(|f| (f.name.as_str(), f.size)).collect();
    if let Some(extra) = got.keys().find(|n| !want.contains_key(*n)) {
        return Err(format!(
            "the peer offers file {extra:?}, which the registry's artifact does not have"
        ));
    }
    if let Some(missing) = want.keys().find(|n| !got.contains_key(*n)) {
        return Err(format!(
            "the peer does not offer file {missing:?} of the registry's artifact"
        ));
    }
    for (name, size) in &got {
        if want[name] != *size {
            return Err(format!(
                "the peer's {name:?} is {size} bytes, the registry's is {}",
                want[name]
            ));
        }
    }
    Ok(())
}

/// What one hashing task checks in a staged file.
enum Job {
    /// One blob's share: where its bytes lie and the digest they must have.
    Part {
        path: PathBuf,
        file: String,
        index: usize,
        pieces: Vec<(u64, u64)>,
        sha256: [u8; 32],
        /// Set while the file is still arriving: the ranges to wait for before reading.
        landing: Option<Arc<Arrivals>>,
    },
    /// Every byte outside the registry's data segments must be zero (a hole): a peer could
    /// otherwise put data where the registry has none, and no digest covers it.
    Holes {
        path: PathBuf,
        file: String,
        apparent_size: u64,
        segments: Vec<(u64, u64)>,
    },
}

/// The staged files still arriving, by name.
pub type Landing = BTreeMap<String, Arc<Arrivals>>;

/// Hashes every registry part of `files` in `dir` against its digest: the parts in file order,
/// `parallel` at a time, each reading its bytes as `landing` reports them on disk (a file not in
/// `landing` is read at once). Run beside the transfer, this ends shortly after it.
pub async fn hash_parts(dir: &Path, files: &[FileContent], landing: &Landing, parallel: usize) -> Result<(), String> {
    let mut jobs = Vec::new();
    for f in files {
        for (index, pieces) in pieces_of(f).into_iter().enumerate() {
            jobs.push(Job::Part {
                path: dir.join(&f.name),
                file: f.name.clone(),
                index,
                pieces,
                sha256: f.parts[index].sha256,
                landing: landing.get(&f.name).cloned(),
            });
        }
    }
    run(jobs, parallel).await
}

/// Checks that each staged file has the registry's apparent size.
pub fn check_sizes(dir: &Path, files: &[FileContent]) -> Result<(), String> {
    for f in files {
        let meta = std::fs::symlink_metadata(dir.join(&f.name)).map_err(|e| format!("staged {}: {e}", f.name))?;
        if !meta.is_file() || meta.len() != f.apparent_size {
            return Err(format!(
                "staged {} is {} bytes, the registry's is {}",
                f.name,
                meta.len(),
                f.apparent_size
            ));
        }
    }
    Ok(())
}

/// Checks that every byte of the staged files outside the registry's data segments is zero.
pub async fn check_holes_of(dir: &Path, files: &[FileContent], parallel: usize) -> Result<(), String> {
    let jobs = files
        .iter()
        .map(|f| Job::Holes {
            path: dir.join(&f.name),
            file: f.name.clone(),
            apparent_size: f.apparent_size,
            segments: f.segments.clone(),
        })
        .collect();
    run(jobs, parallel).await
}

async fn run(jobs: Vec<Job>, parallel: usize) -> Result<(), String> {
    // `buffered` starts the jobs in order: the parts nearest the front of the transfer first.
    let mut checks = futures::stream::iter(jobs.into_iter().map(|job| async move {
        tokio::task::spawn_blocking(move || match &job {
            Job::Part {
                path,
                file,
                index,
                pieces,
                sha256,
                landing,
            } => check_part(path, file, *index, pieces, sha256, landing.as_deref()),
            Job::Holes {
                path,
                file,
                apparent_size,
                segments,
            } => check_holes(path, file, *apparent_size, segments),
        })
        .await
        .map_err(|e| format!("the hashing task failed: {e}"))?
    }))
    .buffered(parallel.max(1));
    while let Some(result) = checks.next().await {
        result?;
    }
    Ok(())
}

/// The file ranges each part covers: the data segments laid end to end, cut at the parts'
/// lengths (a v2 chunk may end inside a segment).
fn pieces_of(f: &FileContent) -> Vec<Vec<(u64, u64)>> {
    let mut segments = f.segments.iter().copied();
    let mut current: Option<(u64, u64)> = None;
    f.parts
        .iter()
        .map(|part| {
            let mut need = part.length;
            let mut pieces = Vec::new();
            while need > 0 {
                let (offset, length) = match current.take().or_else(|| segments.next()) {
                    Some(s) => s,
                    // `content_of` checked the parts carry exactly the data.
                    None => break,
                };
                let take = length.min(need);
                pieces.push((offset, take));
                need -= take;
                if take < length {
                    current = Some((offset + take, length - take));
                }
            }
            pieces
        })
        .collect()
}

fn check_part(
    path: &Path,
    file: &str,
    index: usize,
    pieces: &[(u64, u64)],
    sha256: &[u8; 32],
    landing: Option<&Arrivals>,
) -> Result<(), String> {
    let f = std::fs::File::open(path).map_err(|e| format!("open staged {file}: {e}"))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; READ_CHUNK];
    for &(offset, length) in pieces {
        read_range(&f, file, offset, length, &mut buf, landing, |bytes| {
            hasher.update(bytes)
        })?;
    }
    let got: [u8; 32] = hasher.finalize().into();
    if &got != sha256 {
        return Err(format!(
            "{file} (blob {index} of the file) hashes to sha256:{}, the registry's blob is sha256:{}",
            hex::encode(got),
            hex::encode(sha256)
        ));
    }
    Ok(())
}

/// Reads only what the filesystem holds as data outside `segments`: the staging writer leaves
/// all-zero chunks as holes, so this is little more than the coalesced gaps between extents.
fn check_holes(path: &Path, file: &str, apparent_size: u64, segments: &[(u64, u64)]) -> Result<(), String> {
    let f = std::fs::File::open(path).map_err(|e| format!("open staged {file}: {e}"))?;
    let extents = super::extents::data_extents(&f, apparent_size).map_err(|e| format!("map staged {file}: {e}"))?;
    let mut buf = vec![0u8; READ_CHUNK];
    for (offset, length) in outside(&extents, segments) {
        let mut nonzero = None;
        let mut at = offset;
        read_range(&f, file, offset, length, &mut buf, None, |bytes| {
            if nonzero.is_none() {
                nonzero = bytes.iter().position(|&b| b != 0).map(|i| at + i as u64);
            }
            at += bytes.len() as u64;
        })?;
        if let Some(at) = nonzero {
            return Err(format!(
                "{file} has data at byte {at}, where the registry's artifact has a hole"
            ));
        }
    }
    Ok(())
}

/// The parts of `extents` that no segment covers (both sorted, non-overlapping).
fn outside(extents: &[(u64, u64)], segments: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(start, length) in extents {
        let end = start + length;
        let mut at = start;
        for &(s, l) in segments {
            let s_end = s + l;
            if s_end <= at || l == 0 {
                continue;
            }
            if s >= end {
                break;
            }
            if s > at {
                out.push((at, s - at));
            }
            at = at.max(s_end);
            if at >= end {
                break;
            }
        }
        if at < end {
            out.push((at, end - at));
        }
    }
    out
}

/// Hands `each` the bytes of `[offset, offset + length)` in order. With `landing` (the file is
/// still arriving) it first waits until each stretch has landed, then takes what the arrivals
/// kept of it and reads only the rest from disk.
fn read_range(
    f: &std::fs::File,
    file: &str,
    offset: u64,
    length: u64,
    buf: &mut [u8],
    landing: Option<&Arrivals>,
    mut each: impl FnMut(&[u8]),
) -> Result<(), String> {
    let step = buf.len() as u64;
    let mut from_disk = |at: u64, n: u64, each: &mut dyn FnMut(&[u8])| {
        let n = n as usize;
        f.read_exact_at(&mut buf[..n], at)
            .map_err(|e| format!("read staged {file} at {at}: {e}"))?;
        each(&buf[..n]);
        Ok::<(), String>(())
    };
    let end = offset + length;
    let mut at = offset;
    while at < end {
        // Never more than the buffer: a gap between kept pieces is read in one go.
        let stop = end.min(at + step);
        let kept = match landing {
            Some(arrivals) => {
                arrivals
                    .wait(at, stop - at)
                    .map_err(|Aborted| format!("the transfer of {file} stopped before byte {at}"))?;
                arrivals.take(at, stop)
            }
            None => Vec::new(),
        };
        for (from, bytes) in kept {
            if from > at {
                from_disk(at, from - at, &mut each)?;
            }
            each(&bytes);
            at = from + bytes.len() as u64;
        }
        if at < stop {
            from_disk(at, stop - at, &mut each)?;
        }
        at = stop;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::arrivals::{HOLD_LIMIT, HoldBudget};
    use super::super::protocol::{PlanFile, Slice};
    use super::*;
    use crate::registry::content::ContentPart;

    fn sha(bytes: &[u8]) -> [u8; 32] {
        Sha256::digest(bytes).into()
    }

    fn plan(files: &[(&str, u64)]) -> Plan {
        Plan {
            snapshot_id: "S".into(),
            files: files
                .iter()
                .map(|&(name, size)| PlanFile {
                    name: name.into(),
                    size,
                    slices: vec![Slice { offset: 0, length: 1 }],
                })
                .collect(),
        }
    }

    fn content(name: &str, apparent: u64, segments: &[(u64, u64)], parts: &[&[u8]]) -> FileContent {
        FileContent {
            name: name.into(),
            apparent_size: apparent,
            segments: segments.to_vec(),
            parts: parts
                .iter()
                .map(|p| ContentPart {
                    length: p.len() as u64,
                    sha256: sha(p),
                })
                .collect(),
        }
    }

    /// [`hash_parts`] over `files` in `dir`, on a task of its own, two parts at a time.
    fn hashing_in_background(
        dir: &Path,
        files: &[FileContent],
        landing: &Landing,
    ) -> tokio::task::JoinHandle<Result<(), String>> {
        let (dir, files, landing) = (dir.to_path_buf(), files.to_vec(), landing.clone());
        tokio::spawn(async move { hash_parts(&dir, &files, &landing, 2).await })
    }

    /// The three checks the client runs, on a staged copy already whole.
    async fn check_dir(dir: &Path, files: &[FileContent], parallel: usize) -> Result<(), String> {
        check_sizes(dir, files)?;
        hash_parts(dir, files, &Landing::new(), parallel).await?;
        check_holes_of(dir, files, parallel).await
    }

    #[test]
    fn the_plan_must_offer_exactly_the_registrys_files_and_sizes() {
        let files = [
            content("a", 10, &[(0, 10)], &[&[0; 10]]),
            content("b", 3, &[(0, 3)], &[b"xyz"]),
        ];
        assert_eq!(check_plan(&plan(&[("a", 10), ("b", 3)]), &files), Ok(()));
        let extra = check_plan(&plan(&[("a", 10), ("b", 3), ("disk2.raw", 1)]), &files).unwrap_err();
        assert!(extra.contains("disk2.raw"), "{extra}");
        let missing = check_plan(&plan(&[("a", 10)]), &files).unwrap_err();
        assert!(missing.contains("\"b\""), "{missing}");
        let size = check_plan(&plan(&[("a", 11), ("b", 3)]), &files).unwrap_err();
        assert!(size.contains("11 bytes"), "{size}");
    }

    #[tokio::test]
    async fn a_staged_copy_passes_only_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        // A sparse file: data at 0..4 and 100..106, cut into blobs of 3 and 7 bytes (a chunk
        // ends inside the first segment).
        let mut disk = vec![0u8; 200];
        disk[..4].copy_from_slice(b"abcd");
        disk[100..106].copy_from_slice(b"efghij");
        std::fs::write(dir.path().join("cow.raw"), &disk).unwrap();
        std::fs::write(dir.path().join("config.json"), b"{}").unwrap();
        let files = [
            content("cow.raw", 200, &[(0, 4), (100, 6)], &[b"abc", b"defghij"]),
            content("config.json", 2, &[(0, 2)], &[b"{}"]),
        ];
        assert_eq!(check_dir(dir.path(), &files, 2).await, Ok(()));
        // One byte rewritten inside the data.
        disk[102] ^= 0x40;
        std::fs::write(dir.path().join("cow.raw"), &disk).unwrap();
        let e = check_dir(dir.path(), &files, 2).await.unwrap_err();
        assert!(e.contains("cow.raw (blob 1 of the file)"), "{e}");
        // Data where the registry has a hole changes no digest, but the guest would read it.
        disk[102] ^= 0x40;
        disk[50] = 1;
        std::fs::write(dir.path().join("cow.raw"), &disk).unwrap();
        let e = check_dir(dir.path(), &files, 2).await.unwrap_err();
        assert!(e.contains("data at byte 50"), "{e}");
        disk[50] = 0;
        std::fs::write(dir.path().join("cow.raw"), &disk[..150]).unwrap();
        let e = check_dir(dir.path(), &files, 2).await.unwrap_err();
        assert!(e.contains("150 bytes"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn parts_are_hashed_as_their_bytes_land_and_never_before() {
        const MIB: usize = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3 * MIB).map(|i| (i % 251) as u8 + 1).collect();
        let file = std::fs::File::create(dir.path().join("memory-ranges")).unwrap();
        file.set_len(data.len() as u64).unwrap();
        let files = [content(
            "memory-ranges",
            data.len() as u64,
            &[(0, data.len() as u64)],
            &[&data],
        )];
        let arrivals = Arc::new(Arrivals::default());
        let landing = Landing::from([("memory-ranges".to_string(), arrivals.clone())]);
        let hashing = hashing_in_background(dir.path(), &files, &landing);
        // Out of order, each MiB written just before it is reported: a hasher that read ahead
        // of the reports would hash zeros and fail.
        for i in [2, 0, 1] {
            file.write_all_at(&data[i * MIB..(i + 1) * MIB], (i * MIB) as u64)
                .unwrap();
            arrivals.land((i * MIB) as u64, MIB as u64);
        }
        assert_eq!(hashing.await.unwrap(), Ok(()));

        // A range the peer never sent reads as zeros once the transfer is over: a mismatch.
        let arrivals = Arc::new(Arrivals::default());
        let landing = Landing::from([("memory-ranges".to_string(), arrivals.clone())]);
        file.write_all_at(&vec![0; MIB], MIB as u64).unwrap();
        arrivals.land(0, MIB as u64);
        arrivals.land(2 * MIB as u64, MIB as u64);
        arrivals.finish();
        let e = hash_parts(dir.path(), &files, &landing, 2).await.unwrap_err();
        assert!(e.contains("memory-ranges (blob 0 of the file) hashes to"), "{e}");

        // An aborted transfer stops the hasher waiting.
        let arrivals = Arc::new(Arrivals::default());
        let landing = Landing::from([("memory-ranges".to_string(), arrivals.clone())]);
        arrivals.abort();
        let e = hash_parts(dir.path(), &files, &landing, 2).await.unwrap_err();
        assert!(e.contains("the transfer of memory-ranges stopped before byte 0"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kept_bytes_are_hashed_from_memory_and_the_rest_read_from_disk() {
        const MIB: usize = 1 << 20;
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..4 * MIB).map(|i| (i % 253) as u8 + 1).collect();
        let file = std::fs::File::create(dir.path().join("memory-ranges")).unwrap();
        file.set_len(data.len() as u64).unwrap();
        // Two blobs, the first ending inside the second MiB.
        let cut = MIB + 4096;
        let files = [content(
            "memory-ranges",
            data.len() as u64,
            &[(0, data.len() as u64)],
            &[&data[..cut], &data[cut..]],
        )];
        let budget = HoldBudget::new(HOLD_LIMIT);
        let restore = budget.enter();
        let arrivals = Arc::new(Arrivals::keeping(files[0].segments.clone(), budget.clone()));
        let landing = Landing::from([("memory-ranges".to_string(), arrivals.clone())]);
        let hashing = hashing_in_background(dir.path(), &files, &landing);
        // Every MiB lands as a chunk; only the third is written to disk, so the check passes
        // only if it hashed the others from the chunks it was handed.
        for i in [3, 1, 0, 2] {
            let range = i * MIB..(i + 1) * MIB;
            if i == 2 {
                file.write_all_at(&data[range.clone()], range.start as u64).unwrap();
                arrivals.land(range.start as u64, MIB as u64);
                continue;
            }
            let mut chunk = arrivals.buffer(MIB).expect("the budget has room");
            chunk.fill(&data[range.clone()]);
            arrivals.land_chunk(range.start as u64, chunk);
        }
        assert_eq!(hashing.await.unwrap(), Ok(()));
        assert!(
            arrivals.take(0, data.len() as u64).is_empty(),
            "every kept byte was hashed"
        );
        drop(restore);
        assert_eq!(budget.held(), 0, "and every buffer given back");
    }

    #[test]
    fn what_lies_outside_the_segments() {
        assert_eq!(outside(&[(0, 200)], &[(0, 4), (100, 6)]), vec![(4, 96), (106, 94)]);
        assert_eq!(outside(&[(0, 4), (100, 6)], &[(0, 4), (100, 6)]), vec![]);
        assert_eq!(outside(&[(50, 10)], &[(0, 4), (100, 6)]), vec![(50, 10)]);
        assert_eq!(outside(&[(0, 10)], &[]), vec![(0, 10)]);
        assert_eq!(outside(&[(2, 10)], &[(0, 4), (8, 2)]), vec![(4, 4), (10, 2)]);
    }
}
