//! Who holds each VM name on this node: the pod that created the VM of that name or first
//! adopted it. The name's VM, its local snapshots (`<name>`, `fork-<name>`) and its hibernated
//! state go with it, so a pod may only adopt, delete, restore or serve a VM whose name it holds.
//! A pod recreated with the same namespace and name is the same holder: a released seat woken
//! again, a pod the operator recreated for a new spec.
//!
//! The record outlives the daemon: one small JSON file per name in the state directory
//! (`<dir>/<vm-name>`; VM names are checked by cocoon's rule before they get here, so a name is
//! always a plain file name), written to a synced temporary file and renamed into place, so a
//! crash or a power loss leaves the old record or the new one ([`NameRecords`], which also keeps
//! [`WokenFrom`]). A record that cannot be read back anyway (a damaged disk, a hand edit) names
//! an unknown holder, which no pod matches: the name stays refused until an operator removes the
//! file (fail closed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::host::fs::write_atomically;
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

    /// Whether `key` (`namespace/pod`) is this holder's key; compares without building the key
    /// (the startup asks this for every listed pod).
    pub fn is(&self, key: &str) -> bool {
        // Exactly `self.key() == key`.
        key.strip_prefix(self.namespace.as_str())
            .and_then(|rest| rest.strip_prefix('/'))
            == Some(self.pod.as_str())
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

/// Records by VM name, one small JSON file each in a directory of the state directory
/// (`<dir>/<vm-name>`), replaced atomically and durably; `None` for the
/// directory keeps them in memory only.
#[derive(Debug)]
pub struct NameRecords<T> {
    records: HashMap<String, T>,
    dir: Option<PathBuf>,
}

impl<T> Default for NameRecords<T> {
    fn default() -> Self {
        Self {
            records: HashMap::new(),
            dir: None,
        }
    }
}

impl<T: Serialize + DeserializeOwned + PartialEq> NameRecords<T> {
    /// Loads every record of `dir` (created 0700 when missing); a record that cannot be read
    /// back is `unreadable`'s value, logged with `meaning` (what that value does until the file
    /// is fixed or removed).
    pub fn open(dir: &Path, unreadable: impl Fn() -> T, meaning: &str) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        restrict(dir)?;
        let mut records = HashMap::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !names::is_vm_name(&name) {
                // A temporary file of an interrupted write, or something that is not ours.
                continue;
            }
            let record = std::fs::read(entry.path())
                .map_err(|e| e.to_string())
                .and_then(|bytes| serde_json::from_slice::<T>(&bytes).map_err(|e| e.to_string()))
                .unwrap_or_else(|error| {
                    tracing::error!(file = %entry.path().display(), %error, "unreadable record: {meaning} until the file is fixed or removed");
                    unreadable()
                });
            records.insert(name, record);
        }
        Ok(Self {
            records,
            dir: Some(dir.to_path_buf()),
        })
    }

    pub fn get(&self, name: &str) -> Option<&T> {
        self.records.get(name)
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Records `value` for `name` (replacing an earlier one).
    pub fn put(&mut self, name: &str, value: T) {
        if self.records.get(name) == Some(&value) {
            return;
        }
        if let Some(dir) = &self.dir
            && let Err(error) = write_record(dir, name, &value)
        {
            // Kept in memory: it holds until the daemon restarts.
            tracing::error!(vm = name, dir = %dir.display(), %error, "could not persist the record");
        }
        self.records.insert(name.to_string(), value);
    }

    /// Forgets the record of `name`.
    pub fn release(&mut self, name: &str) {
        if self.records.remove(name).is_none() {
            return;
        }
        if let Some(dir) = &self.dir {
            match std::fs::remove_file(dir.join(name)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => tracing::error!(vm = name, %error, "could not remove the record"),
            }
        }
    }
}

/// Who holds each VM name. A record that cannot be read back names an unknown holder, which no
/// pod matches: the name stays refused until an operator removes the file (fail closed).
pub type Holders = NameRecords<Holder>;

impl Holders {
    pub fn open_holders(dir: &Path) -> std::io::Result<Self> {
        Self::open(dir, Holder::unknown, "the VM name stays refused to every pod")
    }
}

/// The `:hibernate` snapshot id each VM name's guest was last woken from on this node: the
/// guest moved on into a VM since, so a tag still holding that snapshot is no hibernated state
/// (the operator does not always drop the tag after a resume). A record that cannot be read
/// back is an id no tag has.
pub type WokenFrom = NameRecords<String>;

impl WokenFrom {
    pub fn open_woken(dir: &Path) -> std::io::Result<Self> {
        Self::open(
            dir,
            String::new,
            "a :hibernate tag of this VM name counts as hibernated state even if this node woke it",
        )
    }
}

fn restrict(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

fn write_record<T: Serialize>(dir: &Path, name: &str, value: &T) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    write_atomically(&dir.join(name), &bytes, 0o600)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_exactly_the_key_it_was_made_from() {
        let h = Holder::new("ns/web-0", "u1");
        assert!(h.is("ns/web-0"));
        for other in ["ns/web-1", "ns/web-0x", "nsx/web-0", "ns", "web-0", "", "/web-0", "ns/"] {
            assert_eq!(h.is(other), h.key() == other, "{other}");
            assert!(!h.is(other), "{other}");
        }
        // The holder an unreadable record stands for is no pod's.
        assert!(!Holder::unknown().is(""));
        assert!(Holder::unknown().is("/"), "as its key says: no pod has this key");
    }

    #[test]
    fn records_survive_a_reopen_and_a_broken_one_holds_its_name_for_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("holders");
        let mut h = Holders::open_holders(&state).unwrap();
        h.put("vk-a-0", Holder::new("a/web-0", "u1"));
        h.put("vk-b-0", Holder::new("b/web-0", "u2"));
        h.release("vk-b-0");
        std::fs::write(state.join("vk-c-0"), b"{not json").unwrap();
        std::fs::write(state.join(".holder-x1"), b"{}").unwrap();

        let h = Holders::open_holders(&state).unwrap();
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
