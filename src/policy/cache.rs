//! On-disk cache of compiled policy components, keyed by the component's content digest and
//! the engine's compatibility key, so a restart loads native code instead of recompiling.
//!
//! Entries are written atomically (temp file + rename) with a SHA-256 of the compiled bytes
//! beside them; an entry whose digest does not match, or that wasmtime refuses, is recompiled.
//!
//! Loading an entry runs its code with the daemon's privileges, and the checksum beside it is
//! no protection against whoever can write both. So the cache is used only while its directory
//! belongs to the daemon's effective user and neither its group nor others may write to it
//! (and each entry likewise). Otherwise it is bypassed, with a warning: nothing is loaded from
//! it and nothing written to it, and every start compiles its policies in the worker. Bypassing
//! rather than refusing to start: the cache only saves a compile, so a permission mistake on it
//! costs start time, not the node.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use sha2::{Digest, Sha256};
use tracing::{debug, warn};

use crate::host::fs::write_atomically;

/// Where compiled components are kept.
#[derive(Debug)]
pub struct CompileCache {
    dir: PathBuf,
    /// Whether the bypass warning was given (once per cache).
    warned: AtomicBool,
}

impl Clone for CompileCache {
    fn clone(&self) -> Self {
        CompileCache::new(self.dir.clone())
    }
}

/// What makes `meta` (of `what`) untrustworthy for native code, if anything: another owner
/// than the daemon's effective user, or write permission for the group or others.
fn untrusted(meta: &fs::Metadata, what: &Path) -> Option<String> {
    let (owner, mode) = (meta.uid(), meta.mode() & 0o7777);
    if owner != crate::host::process::effective_uid() {
        return Some(format!(
            "{} belongs to uid {owner}, not to the daemon's uid {}",
            what.display(),
            crate::host::process::effective_uid()
        ));
    }
    if mode & 0o022 != 0 {
        return Some(format!(
            "{} is writable by its group or others (mode {mode:o})",
            what.display()
        ));
    }
    None
}

impl CompileCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        CompileCache {
            dir: dir.into(),
            warned: AtomicBool::new(false),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn entry(&self, digest: &str, compat: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{compat}.cwasm"))
    }

    /// Why the directory cannot be trusted now, if it cannot (checked on every use: its
    /// permissions can change while the daemon runs). A missing directory is trusted: the
    /// daemon creates it 0700.
    fn bypassed(&self) -> bool {
        let problem = match fs::metadata(&self.dir) {
            Ok(meta) if !meta.is_dir() => Some(format!("{} is not a directory", self.dir.display())),
            Ok(meta) => untrusted(&meta, &self.dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => Some(format!("{}: {e}", self.dir.display())),
        };
        let Some(problem) = problem else {
            return false;
        };
        if !self.warned.swap(true, Ordering::Relaxed) {
            warn!(
                dir = %self.dir.display(),
                %problem,
                "VK_POLICY_CACHE_DIR is not used: compiled policies are native code the daemon runs, so only a directory of the daemon's own that no one else may write holds them; every start compiles instead (fix: chown it to the daemon's user and chmod 700)"
            );
        }
        true
    }

    /// The compiled bytes for (`digest`, `compat`), if a sound entry exists in a trusted
    /// directory.
    pub fn get(&self, digest: &str, compat: &str) -> Option<Vec<u8>> {
        if self.bypassed() {
            return None;
        }
        let path = self.entry(digest, compat);
        let bytes = read_trusted(&path)?;
        let expected = read_trusted(&path.with_extension("sha256"))?;
        if sha256_hex(&bytes).as_bytes() != expected.trim_ascii() {
            warn!(path = %path.display(), "compiled policy cache entry is corrupt; recompiling");
            return None;
        }
        debug!(path = %path.display(), "compiled policy loaded from cache");
        Some(bytes)
    }

    /// Stores compiled bytes in a trusted directory; failures only cost a recompile next time,
    /// so they are logged.
    pub fn put(&self, digest: &str, compat: &str, compiled: &[u8]) {
        if self.bypassed() {
            return;
        }
        if let Err(error) = self.try_put(digest, compat, compiled) {
            warn!(dir = %self.dir.display(), %error, "cannot write the compiled policy cache; the next start recompiles");
        }
    }

    fn try_put(&self, digest: &str, compat: &str, compiled: &[u8]) -> std::io::Result<()> {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.dir)?;
        let path = self.entry(digest, compat);
        write_atomically(&path.with_extension("sha256"), sha256_hex(compiled).as_bytes(), 0o600)?;
        write_atomically(&path, compiled, 0o600)
    }
}

/// The bytes of a cache file: a regular file (not through a symbolic link) of the daemon's
/// own that no one else may write; `None` otherwise (or when absent).
fn read_trusted(path: &Path) -> Option<Vec<u8>> {
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    if let Some(problem) = untrusted(&meta, path) {
        warn!(%problem, "a compiled policy cache entry is not the daemon's own; recompiling");
        return None;
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.read_to_end(&mut bytes).ok()?;
    Some(bytes)
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

    #[test]
    fn a_cache_directory_others_can_write_is_not_loaded_from() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache::new(dir.path());
        cache.put("d", "c", b"compiled by the daemon");
        // Anyone may now write there: an entry planted with a matching checksum is native code
        // the daemon would run.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o777)).unwrap();
        fs::write(dir.path().join("d-c.cwasm"), b"planted").unwrap();
        fs::write(dir.path().join("d-c.sha256"), sha256_hex(b"planted")).unwrap();
        assert_eq!(
            cache.get("d", "c"),
            None,
            "an entry of a world-writable cache was loaded"
        );
        // Nor is anything written there.
        cache.put("e", "c", b"compiled");
        assert!(!dir.path().join("e-c.cwasm").exists());
        // The daemon's own again: used again.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
        cache.put("e", "c", b"compiled");
        assert_eq!(cache.get("e", "c").as_deref(), Some(&b"compiled"[..]));
    }

    #[test]
    fn an_entry_others_can_write_or_a_link_is_not_loaded() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache::new(dir.path().join("cache"));
        cache.put("d", "c", b"compiled");
        let mode = fs::metadata(cache.dir()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the daemon creates its cache directory private");
        let entry = cache.dir().join("d-c.cwasm");
        fs::set_permissions(&entry, fs::Permissions::from_mode(0o666)).unwrap();
        assert_eq!(cache.get("d", "c"), None);
        fs::remove_file(&entry).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        fs::write(&elsewhere, b"compiled").unwrap();
        std::os::unix::fs::symlink(&elsewhere, &entry).unwrap();
        assert_eq!(cache.get("d", "c"), None, "an entry is never read through a link");
    }
}
