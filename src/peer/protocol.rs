//! The peer snapshot protocol's documents (the plan, the slices) and the checks both ends make.
//! Pure: no I/O.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::extents::MAX_SLICE;

pub const PLAN_PATH: &str = "/v1/snapshot-plan";
pub const SLICE_PATH: &str = "/v1/snapshot-slice";
/// The trailer carrying the CRC-32C (Castagnoli) of a slice's bytes, lowercase hex.
pub const CRC_TRAILER: &str = "x-slice-crc32c";
/// The file the staging directory's completeness marker is written to; never served.
pub const ENVELOPE_FILE: &str = "snapshot.json";

/// `GET /v1/snapshot-plan` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub snapshot_id: String,
    pub files: Vec<PlanFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanFile {
    pub name: String,
    /// Apparent size (the staged file is truncated to it; holes stay holes).
    pub size: u64,
    pub slices: Vec<Slice>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slice {
    pub offset: u64,
    pub length: u64,
}

impl Plan {
    /// Bytes the plan sends.
    pub fn data_bytes(&self) -> u64 {
        self.files.iter().flat_map(|f| &f.slices).map(|s| s.length).sum()
    }
}

/// A name that is one path component: no separators, no `.`/`..`, no NUL, not empty.
pub fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && name.len() <= 255 && !name.contains(['/', '\\', '\0'])
}

/// Why a plan a peer sent cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("the peer's snapshot id {got:?} is not the registry's {want:?} (the peer holds another save)")]
    WrongSnapshot { got: String, want: String },
    #[error("the plan names file {0:?}, which is not a plain file name")]
    BadName(String),
    #[error("the plan names file {0:?} twice")]
    Duplicate(String),
    #[error("file {file:?}: slice {offset}+{length} is empty, overlaps the previous one or passes its size {size}")]
    BadSlice {
        file: String,
        offset: u64,
        length: u64,
        size: u64,
    },
    #[error("the plan has no files")]
    Empty,
}

/// The client's checks on a plan: the snapshot id is the registry's (the trust anchor), names
/// are plain and unique, slices are in order, non-empty, within the file and within the cap.
pub fn check_plan(plan: &Plan, want_id: &str) -> Result<(), PlanError> {
    if plan.snapshot_id != want_id {
        return Err(PlanError::WrongSnapshot {
            got: plan.snapshot_id.clone(),
            want: want_id.to_string(),
        });
    }
    if plan.files.is_empty() {
        return Err(PlanError::Empty);
    }
    let mut seen = HashSet::new();
    for f in &plan.files {
        if !plain_name(&f.name) || f.name == ENVELOPE_FILE {
            return Err(PlanError::BadName(f.name.clone()));
        }
        if !seen.insert(f.name.as_str()) {
            return Err(PlanError::Duplicate(f.name.clone()));
        }
        let mut end = 0u64;
        for s in &f.slices {
            let past = s.offset.checked_add(s.length);
            if s.length == 0 || s.length > MAX_SLICE || s.offset < end || past.is_none_or(|p| p > f.size) {
                return Err(PlanError::BadSlice {
                    file: f.name.clone(),
                    offset: s.offset,
                    length: s.length,
                    size: f.size,
                });
            }
            end = s.offset + s.length;
        }
    }
    Ok(())
}

/// The CRC trailer's text for `crc`.
pub fn crc_text(crc: u32) -> String {
    format!("{crc:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(files: Vec<PlanFile>) -> Plan {
        Plan {
            snapshot_id: "S1".into(),
            files,
        }
    }

    fn file(name: &str, size: u64, slices: &[(u64, u64)]) -> PlanFile {
        PlanFile {
            name: name.into(),
            size,
            slices: slices
                .iter()
                .map(|&(offset, length)| Slice { offset, length })
                .collect(),
        }
    }

    #[test]
    fn the_wire_form_is_the_go_daemons() {
        let p = plan(vec![file("memory-ranges", 10, &[(0, 10)])]);
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"snapshotId":"S1","files":[{"name":"memory-ranges","size":10,"slices":[{"offset":0,"length":10}]}]}"#
        );
        assert_eq!(crc_text(0xab), "000000ab");
    }

    #[test]
    fn plain_names_only() {
        for ok in ["cow.raw", "data-1.raw", "memory-ranges"] {
            assert!(plain_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "../x", "/etc/passwd", "a\\b", "a\0b"] {
            assert!(!plain_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_plan_is_checked_against_the_registry_id_and_its_own_bounds() {
        let good = plan(vec![
            file("cow.raw", 100, &[(0, 10), (50, 50)]),
            file("state.json", 0, &[]),
        ]);
        assert_eq!(check_plan(&good, "S1"), Ok(()));
        assert!(matches!(check_plan(&good, "S2"), Err(PlanError::WrongSnapshot { .. })));
        let cases = [
            plan(vec![file("cow.raw", 100, &[(0, 10), (5, 10)])]),
            plan(vec![file("cow.raw", 100, &[(95, 10)])]),
            plan(vec![file("cow.raw", 100, &[(0, 0)])]),
            plan(vec![file("cow.raw", u64::MAX, &[(u64::MAX - 1, 5)])]),
            plan(vec![file("cow.raw", u64::MAX, &[(0, MAX_SLICE + 1)])]),
        ];
        for c in cases {
            assert!(matches!(check_plan(&c, "S1"), Err(PlanError::BadSlice { .. })), "{c:?}");
        }
        assert!(matches!(
            check_plan(&plan(vec![file("../x", 1, &[])]), "S1"),
            Err(PlanError::BadName(_))
        ));
        assert!(matches!(
            check_plan(&plan(vec![file("snapshot.json", 1, &[])]), "S1"),
            Err(PlanError::BadName(_))
        ));
        assert!(matches!(
            check_plan(&plan(vec![file("a", 1, &[]), file("a", 1, &[])]), "S1"),
            Err(PlanError::Duplicate(_))
        ));
        assert_eq!(check_plan(&plan(vec![]), "S1"), Err(PlanError::Empty));
    }
}
