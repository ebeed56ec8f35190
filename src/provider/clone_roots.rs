//! `VK_CLONE_FROM_DIR_ROOTS`: the directories a `vm.cocoonstack.io/clone-from-dir` may point
//! below. `cocoon vm clone --from-dir` runs as root and reads whatever directory it is given —
//! guest memory and disks included — so a pod may only name a directory an operator set aside
//! for exported snapshots (`cocoon snapshot export --to-dir`). The default is
//! `<COCOON_ROOT_DIR>/exports`; `none` turns clone-from-dir off.
//!
//! The staging directory is not a root: the daemon sweeps it at every start, and the peer tier
//! stages other pods' hibernated guests there.

use std::path::{Path, PathBuf};

pub const ENV: &str = "VK_CLONE_FROM_DIR_ROOTS";

/// A `VK_CLONE_FROM_DIR_ROOTS` entry that is not an absolute directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an absolute directory")]
pub struct NotAbsolute(pub String);

/// Why a pod's `vm.cocoonstack.io/clone-from-dir` is refused: each says what the pod's author
/// or the node's operator can do.
#[derive(Debug, thiserror::Error)]
pub enum DirRefused {
    #[error("vm.cocoonstack.io/clone-from-dir {dir:?}: clone-from-dir is turned off on this node ({ENV}=none)")]
    Off { dir: String },
    #[error(
        "vm.cocoonstack.io/clone-from-dir {dir:?} is not below a directory this node exports snapshots from ({roots}); put the export there, or ask the node's operator to list its directory in {ENV}"
    )]
    Outside { dir: String, roots: String },
    /// The directory cannot be resolved (missing, unreadable): the same advice, with the reason.
    #[error(
        "vm.cocoonstack.io/clone-from-dir {dir:?} is not below a directory this node exports snapshots from ({roots}); put the export there, or ask the node's operator to list its directory in {ENV}: {source}"
    )]
    Unresolvable {
        dir: String,
        roots: String,
        #[source]
        source: std::io::Error,
    },
}

/// The allowed roots (none: clone-from-dir is off).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloneRoots(Vec<PathBuf>);

impl CloneRoots {
    /// `none`, or absolute directories separated by commas.
    pub fn parse(value: &str) -> Result<Self, NotAbsolute> {
        if value.trim() == "none" {
            return Ok(Self(Vec::new()));
        }
        value
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                let path = PathBuf::from(s);
                if path.is_absolute() {
                    Ok(path)
                } else {
                    Err(NotAbsolute(s.to_string()))
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    pub fn default_for(root_dir: &Path) -> Self {
        Self(vec![root_dir.join("exports")])
    }

    /// `dir` resolved (symlinks followed) when it lies strictly below one of the roots, also
    /// resolved; what cocoon is then given is the resolved path.
    pub fn admit(&self, dir: &str) -> Result<PathBuf, DirRefused> {
        if self.0.is_empty() {
            return Err(DirRefused::Off { dir: dir.to_string() });
        }
        let roots = || {
            let roots: Vec<String> = self.0.iter().map(|r| r.display().to_string()).collect();
            roots.join(", ")
        };
        let outside = || DirRefused::Outside {
            dir: dir.to_string(),
            roots: roots(),
        };
        let resolved = std::fs::canonicalize(dir).map_err(|source| DirRefused::Unresolvable {
            dir: dir.to_string(),
            roots: roots(),
            source,
        })?;
        let inside = self
            .0
            .iter()
            .any(|root| std::fs::canonicalize(root).is_ok_and(|root| resolved != root && resolved.starts_with(&root)));
        if inside { Ok(resolved) } else { Err(outside()) }
    }
}

impl std::fmt::Display for CloneRoots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        let roots: Vec<String> = self.0.iter().map(|r| r.display().to_string()).collect();
        f.write_str(&roots.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_directories_below_a_root_are_admitted_and_links_are_followed() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("exports");
        std::fs::create_dir_all(root.join("golden")).unwrap();
        std::fs::create_dir_all(base.path().join("secret")).unwrap();
        std::os::unix::fs::symlink(base.path().join("secret"), root.join("sneaky")).unwrap();
        let roots = CloneRoots::default_for(base.path());

        let golden = root.join("golden");
        assert_eq!(
            roots.admit(golden.to_str().unwrap()).unwrap(),
            golden.canonicalize().unwrap()
        );
        for bad in [
            base.path().join("secret"),
            root.join("sneaky"),
            root.join("golden/../../secret"),
            root.clone(),
            PathBuf::from("/"),
            root.join("missing"),
        ] {
            let err = roots.admit(bad.to_str().unwrap()).unwrap_err().to_string();
            assert!(
                err.contains("is not below a directory this node exports"),
                "{bad:?}: {err}"
            );
        }
        let off = CloneRoots::parse("none").unwrap();
        assert!(
            off.admit(golden.to_str().unwrap())
                .unwrap_err()
                .to_string()
                .contains("turned off")
        );
        assert!(CloneRoots::parse("relative/dir").is_err());
        assert_eq!(
            CloneRoots::parse("/a, /b").unwrap(),
            CloneRoots(vec!["/a".into(), "/b".into()])
        );
    }
}
