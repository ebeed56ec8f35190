//! The state directory: `state.json` (VMs, snapshots, images) guarded by an exclusive `flock` on `state.lock`.

use crate::model::{ImageRecord, SnapshotEntry, VmEntry};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct State {
    #[serde(default)]
    pub vms: BTreeMap<String, VmEntry>,
    #[serde(default)]
    pub snapshots: BTreeMap<String, SnapshotEntry>,
    /// Keyed by image name (the ref given to `image pull` / `image import`).
    #[serde(default)]
    pub images: BTreeMap<String, ImageRecord>,
    #[serde(default)]
    pub seq: u64,
    #[serde(default)]
    pub next_ip: u32,
}

impl State {
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}

/// Handle on a simulator root directory.
#[derive(Debug, Clone)]
pub struct Store {
    pub root: PathBuf,
}

/// Holds the exclusive lock until dropped.
pub struct Locked {
    _file: File,
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Store { root: root.into() }
    }

    /// Root from `COCOON_SIM_ROOT`, else `--root-dir`-less default `/tmp/cocoon-sim`.
    pub fn from_env() -> Self {
        let root = std::env::var_os("COCOON_SIM_ROOT")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/tmp/cocoon-sim"));
        Store::new(root)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    pub fn ensure_dirs(&self) -> std::io::Result<()> {
        for d in ["", "snapshots", "procs", "logs"] {
            std::fs::create_dir_all(self.root.join(d))?;
        }
        Ok(())
    }

    /// Takes the exclusive lock on `state.lock` (blocking).
    pub fn lock(&self) -> std::io::Result<Locked> {
        self.ensure_dirs()?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(self.path("state.lock"))?;
        file.lock()?;
        Ok(Locked { _file: file })
    }

    fn load_unlocked(&self) -> std::io::Result<State> {
        match std::fs::read(self.path("state.json")) {
            Ok(bytes) if bytes.is_empty() => Ok(State::default()),
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(std::io::Error::other),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(e) => Err(e),
        }
    }

    fn save_unlocked(&self, state: &State) -> std::io::Result<()> {
        write_atomic(
            &self.path("state.json"),
            &serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?,
        )
    }

    /// Reads the state under the lock.
    pub fn read<R>(&self, f: impl FnOnce(&State) -> R) -> std::io::Result<R> {
        let _g = self.lock()?;
        let state = self.load_unlocked()?;
        Ok(f(&state))
    }

    /// Read-modify-write under the lock. The state is written back only when `f` returns `Ok`.
    pub fn update<R, E: From<std::io::Error>>(&self, f: impl FnOnce(&mut State) -> Result<R, E>) -> Result<R, E> {
        let _g = self.lock()?;
        let mut state = self.load_unlocked()?;
        let before = Presence::of(&state);
        let r = f(&mut state)?;
        self.save_unlocked(&state)?;
        self.journal_unlocked(&before, &Presence::of(&state))?;
        Ok(r)
    }

    /// Appends to `journal.log` one line per VM or (registered) snapshot that came or went in a
    /// state change, on the monotonic clock: the record a crash test replays to tell where a
    /// guest's state was at every moment. The caller holds the lock.
    fn journal_unlocked(&self, before: &Presence, after: &Presence) -> std::io::Result<()> {
        let mut lines = Vec::new();
        let at = crate::util::monotonic_ns();
        let argv: Vec<String> = std::env::args().skip(1).collect();
        for (kind, b, a) in [
            ("vm", &before.vms, &after.vms),
            ("snapshot", &before.snapshots, &after.snapshots),
        ] {
            for (id, (name, mac)) in a.iter().filter(|(id, _)| !b.contains_key(*id)) {
                lines.push(JournalLine::new(at, kind, "add", id, name, mac, &argv));
            }
            for (id, (name, mac)) in b.iter().filter(|(id, _)| !a.contains_key(*id)) {
                lines.push(JournalLine::new(at, kind, "remove", id, name, mac, &argv));
            }
        }
        if lines.is_empty() {
            return Ok(());
        }
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("journal.log"))?;
        let mut out = Vec::new();
        for l in lines {
            out.extend(serde_json::to_vec(&l).map_err(std::io::Error::other)?);
            out.push(b'\n');
        }
        f.write_all(&out)
    }

    /// Appends one JSON line to a log file under the lock.
    pub fn append_jsonl(&self, rel: &str, value: &impl Serialize) -> std::io::Result<()> {
        let _g = self.lock()?;
        let mut f = OpenOptions::new().create(true).append(true).open(self.path(rel))?;
        let mut line = serde_json::to_vec(value).map_err(std::io::Error::other)?;
        line.push(b'\n');
        f.write_all(&line)
    }

    pub fn read_jsonl<T: for<'de> Deserialize<'de>>(&self, rel: &str) -> std::io::Result<Vec<T>> {
        let _g = self.lock()?;
        let text = match std::fs::read_to_string(self.path(rel)) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(std::io::Error::other))
            .collect()
    }

    pub fn snapshot_dir(&self, id: &str) -> PathBuf {
        self.path("snapshots").join(id)
    }
}

/// The VMs (id → name, first MAC) and the registered (not pending) snapshots (id → name) of a
/// state.
struct Presence {
    vms: BTreeMap<String, (String, String)>,
    snapshots: BTreeMap<String, (String, String)>,
}

impl Presence {
    fn of(state: &State) -> Self {
        Presence {
            vms: state
                .vms
                .iter()
                .map(|(id, e)| {
                    let mac = e.vm.network_configs.first().map(|n| n.mac.clone()).unwrap_or_default();
                    (id.clone(), (e.vm.config.name.clone(), mac))
                })
                .collect(),
            snapshots: state
                .snapshots
                .iter()
                .filter(|(_, e)| !e.pending)
                .map(|(id, e)| (id.clone(), (e.record.config.name.clone(), String::new())))
                .collect(),
        }
    }
}

/// One line of `journal.log`: a VM or snapshot that came (`add`) or went (`remove`), when (the
/// monotonic clock, ns), and the argv of the invocation that changed it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JournalLine {
    pub at: u64,
    pub kind: String,
    pub op: String,
    pub id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    pub argv: Vec<String>,
}

impl JournalLine {
    fn new(at: u64, kind: &str, op: &str, id: &str, name: &str, mac: &str, argv: &[String]) -> Self {
        JournalLine {
            at,
            kind: kind.into(),
            op: op.into(),
            id: id.into(),
            name: name.into(),
            mac: mac.into(),
            argv: argv.to_vec(),
        }
    }
}

pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Resolves a ref: exact key → name → unique key prefix of ≥3 chars.
pub enum Resolved {
    Found(String),
    NotFound,
    Ambiguous,
}

pub fn resolve<'a>(reference: &str, entries: impl Iterator<Item = (&'a String, &'a str)> + Clone) -> Resolved {
    if let Some((id, _)) = entries.clone().find(|(id, _)| id.as_str() == reference) {
        return Resolved::Found(id.clone());
    }
    if let Some((id, _)) = entries.clone().find(|(_, name)| !name.is_empty() && *name == reference) {
        return Resolved::Found(id.clone());
    }
    if reference.len() >= 3 {
        let matches: Vec<_> = entries.filter(|(id, _)| id.starts_with(reference)).collect();
        match matches.len() {
            0 => {}
            1 => return Resolved::Found(matches[0].0.clone()),
            _ => return Resolved::Ambiguous,
        }
    }
    Resolved::NotFound
}
