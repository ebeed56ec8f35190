//! The VM table: one row per VM the provider knows, by name (cocoon names are unique), with an id
//! index for the event watcher. A row is owned by the pod whose VM it is, or by nobody (a VM named
//! after a pod at startup, an orphan kept by the orphan policy) until a CreatePod adopts it. The
//! watcher's memory of a VM (its last restart in place, a recheck or an event being handled) lives
//! on its row and goes with it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::kubelet::PodKey;
use crate::runtime::VmRecord;

#[derive(Debug, Clone)]
pub struct VmRow {
    pub record: VmRecord,
    /// The pod whose VM this is (`None`: indexed for adoption).
    pub owner: Option<PodKey>,
    /// When the watcher last started it again in place.
    pub last_restart: Option<Instant>,
    /// A deferred inspect recheck is running.
    pub rechecking: bool,
    /// An event of it is being handled (the stream may repeat one).
    pub handling: bool,
}

#[derive(Debug, Default)]
pub struct VmTable {
    rows: HashMap<String, VmRow>,
    by_id: HashMap<String, String>,
}

impl VmTable {
    /// Inserts or replaces the row of `name`, keeping the watcher's memory of the same VM id.
    pub fn put(&mut self, name: &str, record: VmRecord, owner: Option<PodKey>) {
        let kept = self.rows.get(name).filter(|r| r.record.id == record.id).cloned();
        self.remove(name);
        if !record.id.is_empty() {
            self.by_id.insert(record.id.clone(), name.to_string());
        }
        self.rows.insert(
            name.to_string(),
            VmRow {
                record,
                owner,
                last_restart: kept.as_ref().and_then(|r| r.last_restart),
                rechecking: kept.as_ref().is_some_and(|r| r.rechecking),
                handling: kept.as_ref().is_some_and(|r| r.handling),
            },
        );
    }

    pub fn remove(&mut self, name: &str) -> Option<VmRow> {
        let row = self.rows.remove(name)?;
        if self.by_id.get(&row.record.id).is_some_and(|n| n == name) {
            self.by_id.remove(&row.record.id);
        }
        Some(row)
    }

    pub fn get(&self, name: &str) -> Option<&VmRow> {
        self.rows.get(name)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut VmRow> {
        self.rows.get_mut(name)
    }

    /// The row of VM id `id`.
    pub fn by_id_mut(&mut self, id: &str) -> Option<&mut VmRow> {
        let name = self.by_id.get(id)?;
        self.rows.get_mut(name)
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Every row, by name.
    pub fn rows(&self) -> impl Iterator<Item = (&str, &VmRow)> {
        self.rows.iter().map(|(name, row)| (name.as_str(), row))
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Forgets restart times older than `age` (the rows stay).
    pub fn gc_restarts(&mut self, now: Instant, age: Duration) {
        for row in self.rows.values_mut() {
            if row
                .last_restart
                .is_some_and(|at| now.saturating_duration_since(at) >= age)
            {
                row.last_restart = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(id: &str) -> VmRecord {
        VmRecord {
            id: id.into(),
            ..Default::default()
        }
    }

    #[test]
    fn rows_are_found_by_name_and_id_and_keep_the_watchers_memory_of_the_same_vm() {
        let mut t = VmTable::default();
        t.put("vm-a", vm("id1"), None);
        let now = Instant::now();
        t.by_id_mut("id1").unwrap().last_restart = Some(now);
        t.put("vm-a", vm("id1"), Some("ns/p".into()));
        assert_eq!(
            t.get("vm-a").unwrap().last_restart,
            Some(now),
            "a refresh of the same VM"
        );
        assert_eq!(t.get("vm-a").unwrap().owner.as_ref().map(PodKey::as_str), Some("ns/p"));
        t.put("vm-a", vm("id2"), None);
        assert!(t.get("vm-a").unwrap().last_restart.is_none(), "another VM of the name");
        assert!(t.by_id_mut("id1").is_none());
        t.gc_restarts(now, Duration::ZERO);
        assert_eq!(t.len(), 1);
        t.remove("vm-a");
        assert!(t.is_empty() && t.by_id_mut("id2").is_none());
    }
}
