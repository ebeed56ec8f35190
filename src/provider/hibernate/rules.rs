//! The pure rules of a hibernate (and of a pod that asks to stay hibernated): what a VM that is
//! not running, a failed `vm rm` and the hibernate evidence mean. No I/O; the saga in
//! [`super`] runs the steps they choose.

use std::collections::BTreeMap;

use crate::policy::contract::bring_up::HibernateEvidence;
use crate::provider::bring_up::SavedSnapshotError;

/// Where a guest's saved state stands, from the hibernate evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::provider) enum SavedGuest {
    /// A hibernate snapshot holds it.
    Saved,
    /// The evidence could not be read (the registry or cocoon failed): retry, never guess.
    Unknown(String),
    /// No hibernate snapshot exists.
    Absent,
}

pub(in crate::provider) fn saved_guest(evidence: HibernateEvidence) -> SavedGuest {
    match evidence {
        HibernateEvidence::Found(_) => SavedGuest::Saved,
        HibernateEvidence::Unavailable(error) => SavedGuest::Unknown(error),
        HibernateEvidence::None | HibernateEvidence::NotChecked => SavedGuest::Absent,
    }
}

/// What a hibernate does with a VM that is not running (a retried or resumed hibernate after a
/// host restart).
#[derive(Debug)]
pub(super) enum NotRunning {
    /// Its own save is the hibernate snapshot: just remove it. Saving it again would put a
    /// cold guest over the saved one.
    RemoveSaved { snapshot: String },
    /// Boot it and save it: its disk is newer than any snapshot.
    StartThenSave,
    /// The hibernate snapshot cannot be checked: retry.
    Retry(SavedSnapshotError),
}

/// `saved_id` is the id of the snapshot under the hibernate tag (or the local one without a
/// registry); `own_snapshots` are the snapshot ids the VM record lists as its own saves.
pub(super) fn not_running<V>(
    saved_id: Result<Option<String>, SavedSnapshotError>,
    own_snapshots: &BTreeMap<String, V>,
) -> NotRunning {
    match saved_id {
        Ok(Some(id)) if own_snapshots.contains_key(&id) => NotRunning::RemoveSaved { snapshot: id },
        Ok(_) => NotRunning::StartThenSave,
        Err(error) => NotRunning::Retry(error),
    }
}

/// What a failed `vm rm` after the save leaves, from a re-inspect of the VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FailedRemove {
    /// The VM is gone after all (the remove answered late): hibernated.
    Gone,
    /// The VM still runs and holds the state: withdraw the tag (no wake may restore a stale
    /// copy) and undo the rest.
    StillRunning,
    /// Stopped, or it cannot be told: keep the tag, it may be the only copy.
    Unknown,
}

/// `inspect`: `Ok(running)` for a record, `Err(true)` for vm-not-found, `Err(false)` for any
/// other error.
pub(super) fn failed_remove(inspect: Result<bool, bool>) -> FailedRemove {
    match inspect {
        Err(true) => FailedRemove::Gone,
        Ok(true) => FailedRemove::StillRunning,
        Ok(false) | Err(false) => FailedRemove::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::contract::bring_up::{EvidenceSource, FoundEvidence};

    #[test]
    fn saved_guest_table() {
        let found = HibernateEvidence::Found(FoundEvidence {
            source: EvidenceSource::Registry,
            recorded_image: String::new(),
            recorded_owner: String::new(),
        });
        assert_eq!(saved_guest(found), SavedGuest::Saved);
        assert_eq!(
            saved_guest(HibernateEvidence::Unavailable("registry 503".into())),
            SavedGuest::Unknown("registry 503".into())
        );
        assert_eq!(saved_guest(HibernateEvidence::None), SavedGuest::Absent);
        assert_eq!(saved_guest(HibernateEvidence::NotChecked), SavedGuest::Absent);
    }

    #[test]
    fn not_running_table() {
        let own: BTreeMap<String, ()> = [("snap-1".to_string(), ())].into();
        assert!(matches!(
            not_running(Ok(Some("snap-1".into())), &own),
            NotRunning::RemoveSaved { snapshot } if snapshot == "snap-1"
        ));
        // Another VM's save (or an older one) under the tag: the disk is newer; boot and save.
        assert!(matches!(
            not_running(Ok(Some("snap-0".into())), &own),
            NotRunning::StartThenSave
        ));
        assert!(matches!(not_running(Ok(None), &own), NotRunning::StartThenSave));
        assert!(matches!(
            not_running(Ok(Some("snap-1".into())), &BTreeMap::<String, ()>::new()),
            NotRunning::StartThenSave
        ));
        let down = crate::runtime::RuntimeError::Timeout {
            verb: "snapshot inspect".into(),
            after: std::time::Duration::from_secs(30),
        };
        assert!(matches!(
            not_running(Err(down.into()), &own),
            NotRunning::Retry(SavedSnapshotError::Runtime(
                crate::runtime::RuntimeError::Timeout { .. }
            ))
        ));
    }

    #[test]
    fn failed_remove_table() {
        assert_eq!(failed_remove(Err(true)), FailedRemove::Gone);
        assert_eq!(failed_remove(Ok(true)), FailedRemove::StillRunning);
        assert_eq!(failed_remove(Ok(false)), FailedRemove::Unknown);
        assert_eq!(failed_remove(Err(false)), FailedRemove::Unknown);
    }
}
