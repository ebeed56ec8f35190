//! cocoon's snapshot tar format: `snapshot.json` first, then every regular file name-sorted;
//! files with holes carry the PAX records `COCOON.sparse.map` / `COCOON.sparse.size`.

use crate::model::Envelope;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::io::AsRawFd;
use std::path::Path;

pub const SPARSE_MAP: &str = "COCOON.sparse.map";
pub const SPARSE_SIZE: &str = "COCOON.sparse.size";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    #[serde(rename = "o")]
    pub offset: u64,
    #[serde(rename = "l")]
    pub len: u64,
}

/// Data extents of a file (SEEK_DATA/SEEK_HOLE). A file without holes gives one segment covering it.
pub fn data_segments(file: &File) -> std::io::Result<Vec<Segment>> {
    let size = file.metadata()?.len();
    let fd = file.as_raw_fd();
    let mut segs = Vec::new();
    let mut pos: i64 = 0;
    while (pos as u64) < size {
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole remains
            }
            if err.raw_os_error() == Some(libc::EINVAL) {
                unsafe { libc::lseek(fd, 0, libc::SEEK_SET) };
                return Ok(vec![Segment { offset: 0, len: size }]); // filesystem without SEEK_DATA
            }
            return Err(err);
        }
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        let hole = if hole < 0 { size as i64 } else { hole };
        segs.push(Segment {
            offset: data as u64,
            len: (hole - data) as u64,
        });
        pos = hole;
    }
    // lseek moved the shared file position; callers read the file sequentially afterwards.
    if unsafe { libc::lseek(fd, 0, libc::SEEK_SET) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(segs)
}

struct SegmentReader<'a> {
    file: &'a File,
    segs: &'a [Segment],
    idx: usize,
    done_in_seg: u64,
}

impl Read for SegmentReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        while let Some(seg) = self.segs.get(self.idx) {
            let left = seg.len - self.done_in_seg;
            if left == 0 {
                self.idx += 1;
                self.done_in_seg = 0;
                continue;
            }
            let want = buf.len().min(left as usize);
            let n = self.file.read_at(&mut buf[..want], seg.offset + self.done_in_seg)?;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "file shrank during export",
                ));
            }
            self.done_in_seg += n as u64;
            return Ok(n);
        }
        Ok(0)
    }
}

fn header(size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_size(size);
    h.set_mode(mode);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mtime(0);
    h
}

/// Writes the export tar of `dir` (which holds the data files, without `snapshot.json`) to `out`.
pub fn export<W: Write>(envelope: &Envelope, dir: &Path, out: W) -> std::io::Result<W> {
    let mut b = tar::Builder::new(out);
    let json = serde_json::to_vec_pretty(envelope).map_err(std::io::Error::other)?;
    b.append_data(&mut header(json.len() as u64, 0o644), "snapshot.json", json.as_slice())?;
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "snapshot.json")
        .collect();
    names.sort();
    for name in names {
        let file = File::open(dir.join(&name))?;
        let size = file.metadata()?.len();
        let segs = data_segments(&file)?;
        let dense = size == 0 || (segs.len() == 1 && segs[0] == Segment { offset: 0, len: size });
        if dense {
            b.append_data(&mut header(size, 0o640), &name, &file)?;
        } else {
            let map = serde_json::to_vec(&segs).map_err(std::io::Error::other)?;
            let size_s = size.to_string();
            b.append_pax_extensions([(SPARSE_MAP, map.as_slice()), (SPARSE_SIZE, size_s.as_bytes())])?;
            let total: u64 = segs.iter().map(|s| s.len).sum();
            let reader = SegmentReader {
                file: &file,
                segs: &segs,
                idx: 0,
                done_in_seg: 0,
            };
            b.append_data(&mut header(total, 0o640), &name, reader)?;
        }
    }
    b.into_inner()
}

/// Copies `dir` into `target` (the `--to-dir` format): data files keep their holes; `snapshot.json` is written last.
pub fn export_to_dir(envelope: &Envelope, dir: &Path, target: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(target)?;
    let mut names: Vec<_> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name())
        .collect();
    names.sort();
    for name in names {
        let src = File::open(dir.join(&name))?;
        let mut dst = File::create(target.join(&name))?;
        let size = src.metadata()?.len();
        for seg in data_segments(&src)? {
            copy_range(&src, &mut dst, seg)?;
        }
        dst.set_len(size)?;
    }
    std::fs::write(
        target.join("snapshot.json"),
        serde_json::to_vec_pretty(envelope).map_err(std::io::Error::other)?,
    )
}

fn copy_range(src: &File, dst: &mut File, seg: Segment) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0;
    while done < seg.len {
        let want = buf.len().min((seg.len - done) as usize);
        let n = src.read_at(&mut buf[..want], seg.offset + done)?;
        if n == 0 {
            break;
        }
        dst.write_all_at(&buf[..n], seg.offset + done)?;
        done += n as u64;
    }
    Ok(())
}

#[derive(Debug)]
pub enum ImportError {
    Io(std::io::Error),
    Invalid(String),
}

impl From<std::io::Error> for ImportError {
    fn from(e: std::io::Error) -> Self {
        ImportError::Io(e)
    }
}

/// Reads an export tar into `target` (created) and returns its envelope. Sparse entries are re-expanded.
pub fn import<R: Read>(input: R, target: &Path) -> Result<Envelope, ImportError> {
    std::fs::create_dir_all(target)?;
    let mut archive = tar::Archive::new(input);
    let mut envelope = None;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
        if name.is_empty() || path.components().count() != 1 || name == ".." {
            return Err(ImportError::Invalid(format!(
                "invalid snapshot archive: unexpected entry {}",
                path.display()
            )));
        }
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let mut map = None;
        let mut apparent = None;
        if let Some(exts) = entry.pax_extensions()? {
            for ext in exts {
                let ext = ext?;
                match ext.key() {
                    Ok(SPARSE_MAP) => {
                        map = Some(serde_json::from_slice::<Vec<Segment>>(ext.value_bytes()).map_err(|e| {
                            ImportError::Invalid(format!("invalid snapshot archive: {name}: bad {SPARSE_MAP}: {e}"))
                        })?)
                    }
                    Ok(SPARSE_SIZE) => {
                        apparent = Some(ext.value().ok().and_then(|v| v.trim().parse::<u64>().ok()).ok_or_else(
                            || ImportError::Invalid(format!("invalid snapshot archive: {name}: bad {SPARSE_SIZE}")),
                        )?)
                    }
                    _ => {}
                }
            }
        }
        if name == "snapshot.json" {
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes)?;
            envelope = Some(
                serde_json::from_slice::<Envelope>(&bytes)
                    .map_err(|e| ImportError::Invalid(format!("invalid snapshot archive: snapshot.json: {e}")))?,
            );
            continue;
        }
        let mut out = File::create(target.join(&name))?;
        match map {
            None => {
                std::io::copy(&mut entry, &mut out)?;
            }
            Some(segs) => {
                let size = apparent.ok_or_else(|| {
                    ImportError::Invalid(format!(
                        "invalid snapshot archive: {name}: {SPARSE_MAP} without {SPARSE_SIZE}"
                    ))
                })?;
                out.set_len(size)?;
                for seg in segs {
                    if seg.offset + seg.len > size {
                        return Err(ImportError::Invalid(format!(
                            "invalid snapshot archive: {name}: segment beyond apparent size"
                        )));
                    }
                    out.seek(SeekFrom::Start(seg.offset))?;
                    let n = std::io::copy(&mut (&mut entry).take(seg.len), &mut out)?;
                    if n != seg.len {
                        return Err(ImportError::Invalid(format!(
                            "invalid snapshot archive: {name}: truncated sparse data"
                        )));
                    }
                }
            }
        }
    }
    let env =
        envelope.ok_or_else(|| ImportError::Invalid("invalid snapshot archive: snapshot.json not found".into()))?;
    if env.version != 1 {
        return Err(ImportError::Invalid(format!(
            "unsupported snapshot archive version {}",
            env.version
        )));
    }
    Ok(env)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SnapshotConfig;

    #[test]
    fn sparse_round_trip_keeps_contents_and_holes() {
        let src = tempfile::tempdir().unwrap();
        let dense: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(src.path().join("memory-ranges"), &dense).unwrap();
        {
            use std::os::unix::fs::FileExt;
            let f = File::create(src.path().join("cow.raw")).unwrap();
            f.set_len(64 << 20).unwrap();
            f.write_all_at(&[7u8; 8192], 0).unwrap();
            f.write_all_at(&[9u8; 8192], 32 << 20).unwrap();
        }
        let env = Envelope {
            config: SnapshotConfig {
                name: "s".into(),
                hypervisor: "cloud-hypervisor".into(),
                ..Default::default()
            },
            version: 1,
        };
        let tar_bytes = export(&env, src.path(), Vec::new()).unwrap();
        assert!(
            tar_bytes.len() < 1 << 20,
            "sparse file must not be expanded in the tar: {}",
            tar_bytes.len()
        );
        // snapshot.json is the first entry.
        let mut a = tar::Archive::new(tar_bytes.as_slice());
        let first = a.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(first.path().unwrap().to_str(), Some("snapshot.json"));

        let dst = tempfile::tempdir().unwrap();
        let back = import(tar_bytes.as_slice(), dst.path()).unwrap();
        assert_eq!(back.config.name, "s");
        assert_eq!(std::fs::read(dst.path().join("memory-ranges")).unwrap(), dense);
        let cow = std::fs::read(dst.path().join("cow.raw")).unwrap();
        assert_eq!(cow.len(), 64 << 20);
        assert!(cow[..8192].iter().all(|b| *b == 7));
        assert!(cow[32 << 20..(32 << 20) + 8192].iter().all(|b| *b == 9));
        assert!(cow[8192..32 << 20].iter().all(|b| *b == 0));
    }

    #[test]
    fn missing_envelope_is_rejected() {
        let mut b = tar::Builder::new(Vec::new());
        b.append_data(&mut header(3, 0o640), "mem", &b"abc"[..]).unwrap();
        let bytes = b.into_inner().unwrap();
        let dst = tempfile::tempdir().unwrap();
        match import(bytes.as_slice(), dst.path()) {
            Err(ImportError::Invalid(m)) => assert_eq!(m, "invalid snapshot archive: snapshot.json not found"),
            other => panic!("unexpected {other:?}"),
        }
    }
}
