//! On-disk cache of compiled policy components, keyed by the component's content digest and
//! the engine's compatibility key, so a restart loads native code instead of recompiling.
//!
//! Entries are written atomically (temp file + rename) with a SHA-256 of the compiled bytes
//! beside them; an entry whose digest does not match, or that wasmtime refuses, is recompiled.
//! The directory must be writable only by the daemon: loading an entry runs its code.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tracing::{debug, warn};

/// Where compiled components are kept.
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: PathBuf,
}

impl CompileCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CompileCache { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn entry(&self, digest: &str, compat: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{compat}.cwasm"))
    }

    /// The compiled bytes for (`digest`, `compat`), if a sound entry exists.
    pub fn get(&self, digest: &str, compat: &str) -> Option<Vec<u8>> {
        let path = self.entry(digest, compat);
        let bytes = fs::read(&path).ok()?;
        let expected = fs::read_to_string(path.with_extension("sha256")).ok()?;
        if sha256_hex(&bytes) != expected.trim() {
            warn!(path = %path.display(), "compiled policy cache entry is corrupt; recompiling");
            return None;
        }
        debug!(path = %path.display(), "compiled policy loaded from cache");
        Some(bytes)
    }

    /// Stores compiled bytes; failures only cost a recompile next time, so they are logged.
    pub fn put(&self, digest: &str, compat: &str, compiled: &[u8]) {
        if let Err(error) = self.try_put(digest, compat, compiled) {
            warn!(dir = %self.dir.display(), %error, "cannot write the compiled policy cache; the next start recompiles");
        }
    }

    fn try_put(&self, digest: &str, compat: &str, compiled: &[u8]) -> std::io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let path = self.entry(digest, compat);
        write_atomically(&path.with_extension("sha256"), sha256_hex(compiled).as_bytes())?;
        write_atomically(&path, compiled)
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Lower-case hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_corruption_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache::new(dir.path());
        assert_eq!(cache.get("d", "c"), None);
        cache.put("d", "c", b"compiled");
        assert_eq!(cache.get("d", "c").as_deref(), Some(&b"compiled"[..]));
        assert_eq!(cache.get("d", "other-engine"), None);
        fs::write(dir.path().join("d-c.cwasm"), b"tampered").unwrap();
        assert_eq!(cache.get("d", "c"), None);
    }
}
