//! What this daemon knows of cocoon's local snapshots and images, so a warm create asks cocoon
//! only what it cannot know. Kept from the results of the daemon's own calls (every call goes
//! through [`super::recording`]): a full `snapshot list` (on each reclaimer pass, the first once
//! the startup reconcile is done; without the reclaimer, once after the startup reconcile, in the
//! background) sets the whole snapshot list; a save, import, inspect
//! or removal since then updates its name; a pull, import or inspect of an image marks it
//! present. Until the first full list lands, a name no call touched is unknown: it is asked.
//!
//! The rule it relies on: cocoon keeps no event stream of snapshots or images, so the list is
//! exact only against what this daemon does. A snapshot or image made or removed behind its
//! back is seen at the next full list. Callers therefore use it only where a wrong answer
//! costs a failed call that the retry corrects (a clone source gone, a fork snapshot left in
//! place) and never where it could lose data: the hibernate evidence of a VM name is always
//! asked (see `bring_up::gather`).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::runtime::SnapshotRecord;

/// What is known of one snapshot name.
#[derive(Debug, Clone, PartialEq)]
pub enum SnapshotFact {
    /// Present, with the record cocoon last gave for it.
    Present(Box<SnapshotRecord>),
    /// Known absent: not in the last full list and not made since.
    Absent,
    /// Present or not, its record unknown (made since the last list, or a call on it failed
    /// inconclusively, or no full list has been read yet): ask cocoon.
    Unknown,
}

#[derive(Debug, Clone)]
enum Entry {
    Present(Option<Box<SnapshotRecord>>),
    Absent,
    Unknown,
}

#[derive(Default)]
struct Inner {
    /// Names touched since the last full list, with the change number of their last change.
    snapshots: HashMap<String, (u64, Entry)>,
    /// The number of the last change, so a list that was running while a name changed leaves
    /// that name's newer fact alone.
    changes: u64,
    images: HashSet<String>,
}

/// The kept facts. One lock, never held across an await.
pub struct Known {
    inner: Mutex<Inner>,
    /// Whether a full list was read: only then is a name missing from the facts known absent.
    /// The one record of it, for the lookups and for whoever waits for it; set under the facts'
    /// lock, together with the facts the list brought (lock order: facts, then this).
    landed: tokio::sync::watch::Sender<bool>,
}

impl Default for Known {
    fn default() -> Self {
        Self {
            inner: Mutex::default(),
            landed: tokio::sync::watch::Sender::new(false),
        }
    }
}

/// The change number a full list started at ([`Known::list_started`]).
#[derive(Debug, Clone, Copy)]
pub struct ListStart(u64);

impl Known {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("known facts lock")
    }

    /// What is known of snapshot `name`.
    pub fn snapshot(&self, name: &str) -> SnapshotFact {
        let s = self.lock();
        match s.snapshots.get(name) {
            Some((_, Entry::Present(Some(record)))) => SnapshotFact::Present(record.clone()),
            Some((_, Entry::Present(None) | Entry::Unknown)) => SnapshotFact::Unknown,
            Some((_, Entry::Absent)) => SnapshotFact::Absent,
            None if *self.landed.borrow() => SnapshotFact::Absent,
            None => SnapshotFact::Unknown,
        }
    }

    fn set(&self, name: &str, entry: Entry) {
        let mut s = self.lock();
        s.changes += 1;
        let n = s.changes;
        s.snapshots.insert(name.to_string(), (n, entry));
    }

    /// cocoon gave `record` for its name.
    pub fn snapshot_seen(&self, record: &SnapshotRecord) {
        self.set(&record.name, Entry::Present(Some(Box::new(record.clone()))));
    }

    /// `name` was made (saved or imported) just now; its record is not read yet.
    pub fn snapshot_made(&self, name: &str) {
        self.set(name, Entry::Present(None));
    }

    /// `name` is gone (removed, or cocoon said it does not exist).
    pub fn snapshot_gone(&self, name: &str) {
        self.set(name, Entry::Absent);
    }

    /// A call on `name` failed in a way that leaves its state unknown.
    pub fn snapshot_unsure(&self, name: &str) {
        self.set(name, Entry::Unknown);
    }

    /// Marks the start of a full `snapshot list`.
    pub fn list_started(&self) -> ListStart {
        ListStart(self.lock().changes)
    }

    /// A full list that started at `start` returned `records`: every name is as listed, except
    /// one changed while the list ran (its change is newer than the list).
    pub fn listed(&self, start: ListStart, records: &[SnapshotRecord]) {
        let mut s = self.lock();
        let mut fresh: HashMap<String, (u64, Entry)> = s.snapshots.drain().filter(|(_, (n, _))| *n > start.0).collect();
        for record in records {
            fresh
                .entry(record.name.clone())
                .or_insert_with(|| (start.0, Entry::Present(Some(Box::new(record.clone())))));
        }
        s.snapshots = fresh;
        // Still under the lock: a lookup sees the listed facts and "listed" together.
        self.landed.send_replace(true);
    }

    /// Whether a full list has landed (before it, a name no call touched is unknown).
    pub fn list_landed(&self) -> bool {
        *self.landed.borrow()
    }

    /// Returns once a full list has landed.
    pub async fn until_listed(&self) {
        // The sender lives in `self`, so the wait ends only by the list landing.
        let _ = self.landed.subscribe().wait_for(|landed| *landed).await;
    }

    /// Image `reference` (a name or a digest) is present.
    pub fn image_present(&self, reference: &str) {
        self.lock().images.insert(reference.to_string());
    }

    /// cocoon said image `reference` is not there.
    pub fn image_gone(&self, reference: &str) {
        self.lock().images.remove(reference);
    }

    /// Image `reference` is known present (false: ask).
    pub fn has_image(&self, reference: &str) -> bool {
        self.lock().images.contains(reference)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(name: &str, id: &str) -> SnapshotRecord {
        SnapshotRecord {
            name: name.into(),
            id: id.into(),
            ..Default::default()
        }
    }

    fn present(name: &str, id: &str) -> SnapshotFact {
        SnapshotFact::Present(Box::new(rec(name, id)))
    }

    #[test]
    fn nothing_is_known_absent_before_a_full_list() {
        let k = Known::default();
        assert_eq!(k.snapshot("base"), SnapshotFact::Unknown);
        k.snapshot_gone("fork-a");
        assert_eq!(k.snapshot("fork-a"), SnapshotFact::Absent, "a removal is known");
        assert!(!k.list_landed());
        k.listed(k.list_started(), &[rec("base", "S1")]);
        assert!(k.list_landed());
        assert_eq!(k.snapshot("base"), present("base", "S1"));
        assert_eq!(k.snapshot("other"), SnapshotFact::Absent);
    }

    #[test]
    fn a_made_snapshot_is_asked_about_until_its_record_is_read() {
        let k = Known::default();
        k.listed(k.list_started(), &[]);
        k.snapshot_made("vm-a");
        assert_eq!(k.snapshot("vm-a"), SnapshotFact::Unknown);
        k.snapshot_seen(&rec("vm-a", "S2"));
        assert_eq!(k.snapshot("vm-a"), present("vm-a", "S2"));
        k.snapshot_unsure("vm-a");
        assert_eq!(k.snapshot("vm-a"), SnapshotFact::Unknown);
    }

    #[test]
    fn a_change_made_while_a_list_ran_outlives_the_list() {
        let k = Known::default();
        let start = k.list_started();
        // Removed and made while the list was reading the older state.
        k.snapshot_gone("old");
        k.snapshot_made("new");
        k.listed(start, &[rec("old", "S1")]);
        assert_eq!(k.snapshot("old"), SnapshotFact::Absent);
        assert_eq!(k.snapshot("new"), SnapshotFact::Unknown);
        // A later list settles both.
        k.listed(k.list_started(), &[rec("new", "S3")]);
        assert_eq!(k.snapshot("old"), SnapshotFact::Absent);
        assert_eq!(k.snapshot("new"), present("new", "S3"));
    }

    #[test]
    fn images_are_known_only_once_seen() {
        let k = Known::default();
        assert!(!k.has_image("sha256:aa"));
        k.image_present("sha256:aa");
        assert!(k.has_image("sha256:aa"));
        k.image_gone("sha256:aa");
        assert!(!k.has_image("sha256:aa"));
    }
}
