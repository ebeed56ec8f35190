//! Who holds each VM name on this node: the pod that created the VM of that name or first
//! adopted it. The name's VM, its local snapshots (`<name>`, `fork-<name>`) and its hibernated
//! state go with it, so a pod may only adopt, delete, restore or serve a VM whose name it holds.
//! A pod recreated with the same namespace and name is the same holder: a released seat woken
//! again, a pod the operator recreated for a new spec.
//!
//! The record outlives the daemon: one small JSON file per name in the state directory
//! (`<dir>/<vm-name>`; VM names are checked by cocoon's rule before they get here, so a name is
//! always a plain file name), written to a temporary file and renamed into place. A record that
//! cannot be read back names an unknown holder, which no pod matches: the name stays refused
//! until an operator removes the file (fail closed).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::kubelet::PodKey;
use crate::model::names;

/// The pod holding a name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub namespace: String,
    pub pod: String,
    /// The incarnation that took the name.
    pub uid: String,
}

impl Holder {
    pub fn new(key: &str, uid: &str) -> Self {
        let (namespace, pod) = key.split_once('/').unwrap_or(("", key));
        Self {
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            uid: uid.to_string(),
        }
    }

    /// `namespace/pod`: the key of every pod of this namespace and name.
    pub fn key(&self) -> PodKey {
        PodKey::from(format!("{}/{}", self.namespace, self.pod))
    }

    /// The holder a record that cannot be read stands for: no pod has this key.
    fn unknown() -> Self {
        Self {
            namespace: String::new(),
            pod: String::new(),
            uid: String::new(),
        }
    }
}

/// The names held, and where they are kept.
#[derive(Debug, Default)]
pub struct Holders {
    names: HashMap<String, Holder>,
    /// `None`: in memory only (a table built without a state directory).
    dir: Option<PathBuf>,
}

impl Holders {
    /// Loads every record of `dir` (created 0700 when missing).
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        restrict(dir)?;
        let mut names = HashMap::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !names::is_vm_name(&name) {
                // A temporary file of an interrupted write, or something that is not ours.
                continue;
            }
            let holder = std::fs::read(entry.path())
                .map_err(|e| e.to_string())
                .and_then(|bytes| serde_json::from_slice::<Holder>(&bytes).map_err(|e| e.to_string()))
                .unwrap_or_else(|error| {
                    tracing::error!(
                        file = %entry.path().display(), %error,
                        "unreadable vm holder record: the name stays refused to every pod until the file is fixed or removed"
                    );
                    Holder::unknown()
                });
            names.insert(name, holder);
        }
        Ok(Self {
            names,
            dir: Some(dir.to_path_buf()),
        })
    }

    pub fn get(&self, name: &str) -> Option<&Holder> {
        self.names.get(name)
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Records `holder` for `name` (replacing an earlier one).
    pub fn put(&mut self, name: &str, holder: Holder) {
        if self.names.get(name) == Some(&holder) {
            return;
        }
        if let Some(dir) = &self.dir
            && let Err(error) = write_record(dir, name, &holder)
        {
            // Kept in memory: the name is protected until the daemon restarts.
            tracing::error!(vm = name, dir = %dir.display(), %error, "could not persist the vm holder record");
        }
        self.names.insert(name.to_string(), holder);
    }

    /// Forgets the holder of `name`.
    pub fn release(&mut self, name: &str) {
        if self.names.remove(name).is_none() {
            return;
        }
        if let Some(dir) = &self.dir {
            match std::fs::remove_file(dir.join(name)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => tracing::error!(vm = name, %error, "could not remove the vm holder record"),
            }
        }
    }
}

fn restrict(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

fn write_record(dir: &Path, name: &str, holder: &Holder) -> std::io::Result<()> {
    let mut file = tempfile::Builder::new().prefix(".holder-").tempfile_in(dir)?;
    file.write_all(&serde_json::to_vec(holder).map_err(std::io::Error::other)?)?;
    file.persist(dir.join(name)).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_a_reopen_and_a_broken_one_holds_its_name_for_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("holders");
        let mut h = Holders::open(&state).unwrap();
        h.put("vk-a-0", Holder::new("a/web-0", "u1"));
        h.put("vk-b-0", Holder::new("b/web-0", "u2"));
        h.release("vk-b-0");
        std::fs::write(state.join("vk-c-0"), b"{not json").unwrap();
        std::fs::write(state.join(".holder-x1"), b"{}").unwrap();

        let h = Holders::open(&state).unwrap();
        assert_eq!(h.get("vk-a-0"), Some(&Holder::new("a/web-0", "u1")));
        assert_eq!(h.get("vk-a-0").unwrap().key(), "a/web-0");
        assert_eq!(h.get("vk-b-0"), None);
        let broken = h.get("vk-c-0").expect("an unreadable record still holds its name");
        assert_eq!(broken.key(), "/", "a key no pod has");
        assert_eq!(h.len(), 2, "temporary files are not records");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&state).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }
}
