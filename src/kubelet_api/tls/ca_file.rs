//! A CA bundle the daemon trusts, read from a file and read again whenever the file changes, so
//! a rotated CA (a new cluster CA, a second one during a rotation) is trusted without a restart,
//! as the kubelet re-reads its client CA file. The file is checked by its metadata (modified
//! time, size, inode), which also notices a Secret or ConfigMap volume swapping the symlinked
//! file underneath. A changed file that does not parse (half written, or a mistake) keeps the
//! trusted roots as they were and is reported once; it is tried again when it changes again.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rustls::RootCertStore;
use tokio_util::sync::CancellationToken;

use super::certs;

/// How often a trusted CA file is checked for a change.
pub const CHECK_EVERY: Duration = Duration::from_secs(30);

/// The CA certificates of a PEM bundle.
pub fn roots_of(pem: &str) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in certs::parse_chain(pem).map_err(|e| e.to_string())? {
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    Ok(roots)
}

/// The CA certificates of the PEM bundle at `path`.
fn read_roots(path: &Path) -> Result<RootCertStore, String> {
    let pem = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    roots_of(&pem)
}

/// What tells one version of the file from another without reading it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: (u64, u64),
}

fn stamp_of(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
        inode: (meta.dev(), meta.ino()),
    })
}

/// One trusted CA file, and the version of it last looked at.
#[derive(Debug, Clone)]
pub struct CaFile {
    path: PathBuf,
    /// The file's setting, for the logs.
    setting: &'static str,
    /// The version last read, installed or refused (`None`: there was no file to stamp): only
    /// a version other than this one is read again.
    seen: Option<Stamp>,
}

/// What one look at the file found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// The version last looked at: the one in force, or one already refused.
    Unchanged,
    /// A new version, installed: its certificate count.
    Installed(usize),
    /// A new version that did not load or that the install refused: why.
    Refused(String),
}

impl CaFile {
    /// Reads the file at `path`: the roots to trust now, and the file to follow. The file is
    /// stamped before it is read, so a change made while it was read shows at the first check.
    pub fn load(path: PathBuf, setting: &'static str) -> Result<(Self, RootCertStore), String> {
        let seen = stamp_of(&path);
        let roots = read_roots(&path)?;
        Ok((Self { path, setting, seen }, roots))
    }

    /// Reads the file again if it changed, and hands a new version that parses to `install`;
    /// `install` failing counts as the version not loading, and the roots in force stay.
    pub fn check(&mut self, install: &mut impl FnMut(RootCertStore) -> Result<(), String>) -> Checked {
        let now = stamp_of(&self.path);
        if now == self.seen {
            return Checked::Unchanged;
        }
        self.seen = now;
        let loaded = read_roots(&self.path).and_then(|roots| {
            let count = roots.len();
            install(roots).map(|()| count)
        });
        match loaded {
            Ok(count) => Checked::Installed(count),
            Err(error) => Checked::Refused(error),
        }
    }

    /// Checks the file every `every` until `shutdown`, installing each new version that loads.
    pub async fn watch(
        mut self,
        every: Duration,
        shutdown: CancellationToken,
        mut install: impl FnMut(RootCertStore) -> Result<(), String>,
    ) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.cancelled() => return,
            }
            let checked = self.check(&mut install);
            let (setting, file) = (self.setting, self.path.display());
            match checked {
                Checked::Unchanged => {}
                Checked::Installed(certificates) => tracing::info!(
                    setting,
                    %file,
                    certificates,
                    "the CA file changed: new connections are checked against it"
                ),
                Checked::Refused(error) => tracing::warn!(
                    setting,
                    %file,
                    %error,
                    "the changed CA file does not load; the CA already trusted stays in force until the file changes again"
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

    use super::*;

    fn ca_pem(name: &str) -> String {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.self_signed(&key).unwrap().pem()
    }

    /// Writes `pem` beside `path` and renames it into place, as a Secret volume replaces a file.
    fn replace(path: &Path, pem: &str) {
        let next = path.with_extension("next");
        std::fs::write(&next, pem).unwrap();
        std::fs::rename(&next, path).unwrap();
    }

    fn accept_all(_: RootCertStore) -> Result<(), String> {
        Ok(())
    }

    #[test]
    fn a_rotated_ca_file_is_installed_once_and_a_broken_one_keeps_the_roots_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, ca_pem("first")).unwrap();
        let (mut file, roots) = CaFile::load(path.clone(), "VK_TEST_CA_FILE").unwrap();
        assert_eq!(roots.len(), 1);
        assert_eq!(
            file.check(&mut accept_all),
            Checked::Unchanged,
            "the loaded version is in force"
        );

        // A rotation: the old CA and the new one side by side.
        replace(&path, &format!("{}{}", ca_pem("first"), ca_pem("second")));
        assert_eq!(file.check(&mut accept_all), Checked::Installed(2));
        assert_eq!(file.check(&mut accept_all), Checked::Unchanged);

        // Half written: refused, reported once, and the next good version is installed.
        std::fs::write(&path, "-----BEGIN CERTIFICATE-----\nMIIB").unwrap();
        assert!(matches!(file.check(&mut accept_all), Checked::Refused(_)));
        assert_eq!(
            file.check(&mut accept_all),
            Checked::Unchanged,
            "a refused version is not retried"
        );
        replace(&path, &ca_pem("third"));
        assert_eq!(file.check(&mut accept_all), Checked::Installed(1));

        // A file that is gone keeps the roots in force too.
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(file.check(&mut accept_all), Checked::Refused(e) if e.contains("No such file")));
    }

    #[test]
    fn roots_the_install_refuses_stay_out_until_the_file_changes_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, ca_pem("first")).unwrap();
        let (mut file, _) = CaFile::load(path.clone(), "VK_TEST_CA_FILE").unwrap();
        replace(&path, &ca_pem("second"));
        let mut refuse = |_: RootCertStore| Err::<(), _>("cannot build the configuration".to_string());
        assert_eq!(
            file.check(&mut refuse),
            Checked::Refused("cannot build the configuration".into())
        );
        assert_eq!(file.check(&mut accept_all), Checked::Unchanged);
        replace(&path, &ca_pem("third"));
        assert_eq!(file.check(&mut accept_all), Checked::Installed(1));
    }
}
