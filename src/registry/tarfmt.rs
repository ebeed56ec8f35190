//! cocoon's import/export tar (`snapshot.json` first, then every file), on top of the `tar` crate:
//! the header bytes of one entry (with the `COCOON.sparse.*` PAX records), padding, the
//! end-of-archive marker, and reading an entry's metadata from the export stream.

use super::manifest::FilePlan;

pub const BLOCK: u64 = 512;
pub const SPARSE_MAP: &str = "COCOON.sparse.map";
pub const SPARSE_SIZE: &str = "COCOON.sparse.size";
/// Two zero blocks end a tar archive.
pub const END_OF_ARCHIVE: [u8; 1024] = [0u8; 1024];

/// Metadata of one entry of the export stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryMeta {
    pub name: String,
    pub mode: u32,
    /// The body size (packed data for sparse files).
    pub size: u64,
    pub sparse_map: Option<String>,
    pub sparse_size: Option<u64>,
}

/// The header bytes (PAX extension header when sparse, then the ustar header) for a file entry.
pub fn entry_header(
    name: &str,
    mode: u32,
    size: u64,
    sparse_map: Option<&str>,
    sparse_size: Option<u64>,
) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::with_capacity(2048));
    if let Some(map) = sparse_map {
        let size_text = sparse_size.map(|s| s.to_string());
        let mut recs: Vec<(&str, &[u8])> = vec![(SPARSE_MAP, map.as_bytes())];
        if let Some(s) = &size_text {
            recs.push((SPARSE_SIZE, s.as_bytes()));
        }
        b.append_pax_extensions(recs)?;
    }
    let mut h = tar::Header::new_ustar();
    h.set_path(name)?;
    h.set_mode(mode);
    h.set_size(size);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mtime(0);
    h.set_cksum();
    // An empty body: `append` writes only the header (no padding for zero bytes).
    b.append(&h, std::io::empty())?;
    let bytes = b.get_ref().clone();
    // Dropping the builder would write the end marker into its own buffer, which we no longer use.
    Ok(bytes)
}

/// Header bytes of a planned file.
pub fn plan_header(p: &FilePlan) -> std::io::Result<Vec<u8>> {
    entry_header(&p.title, p.mode, p.size, p.sparse_map.as_deref(), p.sparse_size)
}

/// Zero bytes that pad a body of `size` bytes to a block boundary.
pub fn padding(size: u64) -> usize {
    ((BLOCK - size % BLOCK) % BLOCK) as usize
}

/// Reads the metadata of an entry of the export stream (name, mode, size, sparse PAX records).
pub fn entry_meta<R: std::io::Read>(e: &mut tar::Entry<'_, R>) -> std::io::Result<EntryMeta> {
    let name = e.path()?.to_string_lossy().into_owned();
    let mode = e.header().mode()?;
    let size = e.size();
    let mut sparse_map = None;
    let mut sparse_size = None;
    if let Some(exts) = e.pax_extensions()? {
        for ext in exts {
            let ext = ext?;
            match ext.key() {
                Ok(SPARSE_MAP) => sparse_map = Some(String::from_utf8_lossy(ext.value_bytes()).into_owned()),
                Ok(SPARSE_SIZE) => {
                    sparse_size = Some(ext.value().ok().and_then(|v| v.trim().parse().ok()).ok_or_else(|| {
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("{name}: {SPARSE_SIZE} is not a number"),
                        )
                    })?)
                }
                _ => {}
            }
        }
    }
    Ok(EntryMeta {
        name,
        mode,
        size,
        sparse_map,
        sparse_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn headers_round_trip_through_the_tar_reader() {
        let mut stream = Vec::new();
        let body = b"hello sparse";
        stream.extend(
            entry_header(
                "cow.raw",
                0o640,
                body.len() as u64,
                Some("[{\"o\":4096,\"l\":12}]"),
                Some(1 << 20),
            )
            .unwrap(),
        );
        stream.extend_from_slice(body);
        stream.extend(std::iter::repeat_n(0u8, padding(body.len() as u64)));
        stream.extend(entry_header("state.json", 0o600, 3, None, None).unwrap());
        stream.extend_from_slice(b"{}\n");
        stream.extend(std::iter::repeat_n(0u8, padding(3)));
        stream.extend_from_slice(&END_OF_ARCHIVE);
        assert_eq!(stream.len() % 512, 0);

        let mut a = tar::Archive::new(stream.as_slice());
        let mut it = a.entries().unwrap();
        let mut e = it.next().unwrap().unwrap();
        let m = entry_meta(&mut e).unwrap();
        assert_eq!(
            m,
            EntryMeta {
                name: "cow.raw".into(),
                mode: 0o640,
                size: 12,
                sparse_map: Some("[{\"o\":4096,\"l\":12}]".into()),
                sparse_size: Some(1 << 20)
            }
        );
        let mut s = String::new();
        e.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello sparse");
        let mut e = it.next().unwrap().unwrap();
        assert_eq!(
            entry_meta(&mut e).unwrap(),
            EntryMeta {
                name: "state.json".into(),
                mode: 0o600,
                size: 3,
                sparse_map: None,
                sparse_size: None
            }
        );
        assert!(it.next().is_none());
    }

    #[test]
    fn padding_to_blocks() {
        assert_eq!(padding(0), 0);
        assert_eq!(padding(1), 511);
        assert_eq!(padding(512), 0);
        assert_eq!(padding(513), 511);
    }
}
