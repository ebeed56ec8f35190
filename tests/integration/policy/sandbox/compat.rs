//! Components built against older contracts keep working: the five default policies exactly as
//! the daemon embedded them at 0.1.0 and at 0.2.0 (`tests/compat/v<version>/*.wasm`, rebuilt
//! bit for bit by each folder's `rebuild.sh`) load, say which contract they speak, and decide
//! every case of today's tables as the current defaults do — except the cases where a later
//! contract changed a rule on purpose, each listed below with what the older build still
//! answers (what its host acted on).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use vk_cocoon::policy::cases::{CaseTable, decision_json, subset_difference};
use vk_cocoon::policy::input::{DecisionInput, facts_for, merge_contract};
use vk_cocoon::policy::{
    ContractVersion, LoadedPolicy, Origin, PolicyEngine, PolicySlot, SandboxLimits, Slot, SlotVisitor, with_slot,
};

fn dir(version: ContractVersion) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/compat/v{}", version.as_str()))
}

pub fn component_of(version: ContractVersion, slot: Slot) -> Vec<u8> {
    let path = dir(version).join(format!("{slot}.wasm"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The tenancy cases of 0.3.0: an older build cannot see who holds a VM, so its host keeps its
/// plan to the pod's namespace with its own message (`policy::slots::bring_up`); the decision
/// is the current default's.
fn tenancy_differences() -> Vec<(Slot, &'static str, Value)> {
    let foreign = json!({
        "outcome": {"Refuse": {"kind": "Permanent", "event": "VmOwnedByAnotherPod"}},
        "reason": "vm-owned-by-another-pod",
    });
    [
        "a fork of another namespace's VM is refused",
        "a VM another namespace's pod held is not adopted, even after that pod is gone",
        "a clone of another namespace's VM state is refused",
        "a hibernated guest another namespace pushed is not restored",
        "an unmanaged pod does not take over another namespace's VM",
    ]
    .into_iter()
    .map(|case| (Slot::BringUp, case, foreign.clone()))
    .collect()
}

/// The console addresses of 0.3.0 (a Windows guest's static NICs set at its serial console): an
/// older build sets none, and is not asked after a run (its host answers for it).
fn console_differences() -> Vec<(Slot, &'static str, Value)> {
    let not_asked = json!({"outcome": "None", "reason": "not-needed"});
    vec![
        (
            Slot::GuestFixup,
            "a windows clone's static NICs get their addresses at the console after the reset",
            json!({"outcome": {"Run": {"kind": "Windows", "console-addresses": []}}, "reason": "windows"}),
        ),
        (
            Slot::GuestFixup,
            "a windows run with a static NIC sets its address at the console and runs nothing",
            not_asked.clone(),
        ),
        (Slot::GuestFixup, "a linux run needs nothing", not_asked),
    ]
}

/// Where the current defaults and the 0.2.0 builds differ on purpose.
fn differences_from_0_2_0() -> Vec<(Slot, &'static str, Value)> {
    tenancy_differences().into_iter().chain(console_differences()).collect()
}

/// Where the current defaults and the 0.1.0 builds differ on purpose: (slot, case name, what the
/// 0.1.0 build answers, as a subset of its adapted decision).
fn differences_from_0_1_0() -> Vec<(Slot, &'static str, Value)> {
    let permanent = |event: &str| json!({"Refuse": {"kind": "Permanent", "event": event}});
    vec![
        // The current default runs managed macOS guests through cocoon-macos;
        // the 0.1.0 build treated them as Linux guests.
        (
            Slot::BringUp,
            "a managed macOS guest is run from its image, whatever the mode",
            json!({"reason": "fork"}),
        ),
        (
            Slot::BringUp,
            "a macOS guest without an image is refused",
            json!({"reason": "missing-image"}),
        ),
        (
            Slot::BringUp,
            "a macOS guest is never restored from hibernate evidence (cocoon-macos has no memory snapshots)",
            json!({"reason": "restore-derived"}),
        ),
        // 0.2.0: the operator settles these (delete the tag, bring the snapshot); 0.1.0 failed the pod.
        (
            Slot::BringUp,
            "derived evidence conflicts with fork-from",
            json!({"outcome": permanent("HibernateSourceConflict")}),
        ),
        (
            Slot::BringUp,
            "derived evidence conflicts with clone-from-dir",
            json!({"outcome": permanent("HibernateSourceConflict")}),
        ),
        (
            Slot::BringUp,
            "the source conflict is checked before the image guard",
            json!({"outcome": permanent("HibernateSourceConflict")}),
        ),
        (
            Slot::BringUp,
            "derived evidence from another image ref is refused",
            json!({"outcome": permanent("HibernateImageConflict")}),
        ),
        (
            Slot::BringUp,
            "the explicit marker also applies the image guard (decision 4)",
            json!({"outcome": permanent("HibernateImageConflict")}),
        ),
        (
            Slot::BringUp,
            "the explicit marker without any hibernate snapshot is refused, not booted fresh",
            json!({"outcome": permanent("HibernateSnapshotMissing")}),
        ),
        // 0.1.0 retried this one with backoff; 0.2.0 waits for the operator.
        (
            Slot::BringUp,
            "a missing snapshot with no registry is refused",
            json!({"outcome": {"Refuse": {"kind": "RetryLater", "event": "CreateBringUpFailed"}}}),
        ),
        // 0.2.0 names bad annotations InvalidVMSpec; 0.1.0's events said CreateBringUpFailed.
        (
            Slot::BringUp,
            "an unmanaged pod without a pre-assigned IP is refused",
            json!({"outcome": permanent("CreateBringUpFailed")}),
        ),
        (
            Slot::BringUp,
            "an unmanaged pod without a pre-assigned VMID is refused",
            json!({"outcome": permanent("CreateBringUpFailed")}),
        ),
        (
            Slot::BringUp,
            "a relative clone-from-dir is refused",
            json!({"outcome": permanent("CreateBringUpFailed")}),
        ),
        (
            Slot::BringUp,
            "an unclean clone-from-dir is refused even with hibernate evidence",
            json!({"outcome": permanent("CreateBringUpFailed")}),
        ),
        (
            Slot::BringUp,
            "a trailing slash is not clean",
            json!({"outcome": permanent("CreateBringUpFailed")}),
        ),
        (
            Slot::BringUp,
            "clone-from-dir conflicts with mode=run",
            json!({"outcome": permanent("CreateBringUpFailed")}),
        ),
        (
            Slot::BringUp,
            "clone-from-dir conflicts with fork-from",
            json!({"outcome": permanent("CreateBringUpFailed")}),
        ),
        (
            Slot::BringUp,
            "mode run without an image is refused",
            json!({"outcome": permanent("CreateBringUpFailed")}),
        ),
        (
            Slot::BringUp,
            "a clone without an image is refused",
            json!({"outcome": permanent("CreateBringUpFailed")}),
        ),
        // 0.1.0 compared the mode exactly and case-insensitively, untrimmed: " Run " was clone.
        (
            Slot::BringUp,
            "mode ignores case and surrounding blanks (the host's one decoding rule)",
            json!({"outcome": {"Proceed": {"Clone": {}}}, "reason": "clone"}),
        ),
        // 0.1.0 knew no unknown values: it planned whatever was asked (and its host booted
        // "qemu" as cloud-hypervisor). Adapted, a plan naming an unknown backend is invalid:
        // the fail-safe refusal.
        (
            Slot::BringUp,
            "an unknown backend is refused for good, naming the value",
            json!({"outcome": {"Refuse": {"kind": "RetryLater", "event": "BringUpPolicyFailed"}}, "reason": "policy-failed"}),
        ),
        (
            Slot::BringUp,
            "an unknown OS is refused for good",
            json!({"outcome": {"Proceed": {"Clone": {}}}, "reason": "clone"}),
        ),
        (
            Slot::BringUp,
            "an unknown backend of a hibernated guest is refused before any restore",
            json!({"outcome": {"Refuse": {"kind": "RetryLater", "event": "BringUpPolicyFailed"}}, "reason": "policy-failed"}),
        ),
        // 0.1.0 read the OS exactly: " Windows" was no Windows guest.
        (
            Slot::GuestFixup,
            "os and backend ignore case and surrounding blanks (the host's one decoding rule)",
            json!({"outcome": "None", "reason": "not-needed"}),
        ),
        // 0.2.0: an unclassified node is the operator's to fix; 0.1.0 failed the pod.
        (
            Slot::CpuClassAdmission,
            "a classified pod waits for an operator to classify the node",
            json!({"verdict": {"Reject": {"kind": "Permanent", "event": "SnapshotCpuClassMismatch"}}}),
        ),
        // 0.1.0 compared the snapshot policy exactly: " Never " was always.
        (
            Slot::SnapshotBeforeDestroy,
            "the policy ignores case and surrounding blanks (the host's one rule)",
            json!({"outcome": {"Snapshot": {"tag": "latest"}}, "reason": "snapshot"}),
        ),
    ]
    .into_iter()
    .chain(tenancy_differences())
    .chain(console_differences())
    .collect()
}

/// Every case of `slot`'s default table, run through the older build and the current default.
struct Compare<'a> {
    engine: &'a PolicyEngine,
    version: ContractVersion,
    differences: &'a [(Slot, &'static str, Value)],
}

impl SlotVisitor for Compare<'_> {
    type Output = (usize, Vec<String>);

    fn visit<S: PolicySlot>(self) -> Self::Output {
        let old = LoadedPolicy::<S>::load(
            self.engine,
            None,
            Origin::File(format!("{}.wasm", S::SLOT).into()),
            &component_of(self.version, S::SLOT),
        )
        .expect("the older build loads");
        assert_eq!(old.version(), self.version);
        let v = self.version.as_str();
        let now = LoadedPolicy::<S>::builtin(self.engine, None).expect("the default loads");
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("policies")
            .join(S::NAME)
            .join(format!("{}.cases.yaml", S::NAME));
        let table = CaseTable::load(&path).expect("the default table");
        let mut problems = Vec::new();
        for case in &table.cases {
            let mut pod = table.defaults.pod.clone();
            if !case.pod.is_null() {
                json_patch::merge(&mut pod, &case.pod);
            }
            let mut host = table.defaults.host.clone();
            if !case.host.is_null() {
                merge_contract(&mut host, &case.host);
            }
            let facts = facts_for::<S>(&DecisionInput { pod, host }).expect("the table's input");
            let was = decision_json(self.engine, &old, &facts);
            let is = decision_json(self.engine, &now, &facts);
            let intended = self
                .differences
                .iter()
                .find(|(slot, name, _)| *slot == S::SLOT && *name == case.name);
            match intended {
                None if was != is => problems.push(format!(
                    "{}: {}: the {v} build decided {was}, the current default {is}",
                    S::SLOT,
                    case.name
                )),
                Some((_, _, old_answer)) => {
                    if let Some(diff) = subset_difference(old_answer, &was, "") {
                        problems.push(format!("{}: {}: the {v} build: {diff}", S::SLOT, case.name));
                    }
                    if was == is {
                        problems.push(format!(
                            "{}: {}: listed as an intended difference but both decide {is}",
                            S::SLOT,
                            case.name
                        ));
                    }
                }
                None => {}
            }
        }
        (table.cases.len(), problems)
    }
}

fn the_builds_are_the_committed_reproducible_bytes(version: ContractVersion) {
    let sums = std::fs::read_to_string(dir(version).join("SHA256SUMS")).unwrap();
    for slot in Slot::ALL {
        let want = sums
            .lines()
            .find_map(|l| l.strip_suffix(&format!("  {slot}.wasm")))
            .unwrap_or_else(|| panic!("SHA256SUMS lists {slot}.wasm"));
        assert_eq!(
            hex::encode(Sha256::digest(component_of(version, slot))),
            want,
            "{version} {slot}"
        );
    }
}

fn the_builds_decide_as_the_current_defaults(version: ContractVersion, differences: &[(Slot, &'static str, Value)]) {
    let engine = PolicyEngine::new(SandboxLimits::default()).unwrap();
    let mut problems = Vec::new();
    let mut compared = 0;
    for slot in Slot::ALL {
        let (cases, found) = with_slot(
            slot,
            Compare {
                engine: &engine,
                version,
                differences,
            },
        );
        compared += cases;
        problems.extend(found);
    }
    assert!(compared > 100, "every default table was compared ({compared} cases)");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_0_1_0_and_0_2_0_builds_are_the_committed_reproducible_bytes() {
    the_builds_are_the_committed_reproducible_bytes(ContractVersion::V0_1_0);
    the_builds_are_the_committed_reproducible_bytes(ContractVersion::V0_2_0);
}

#[test]
fn the_0_1_0_defaults_load_and_decide_as_the_current_defaults_except_where_a_later_contract_changed_a_rule() {
    the_builds_decide_as_the_current_defaults(ContractVersion::V0_1_0, &differences_from_0_1_0());
}

#[test]
fn the_0_2_0_defaults_load_and_decide_as_the_current_defaults_except_where_0_3_0_changed_a_rule() {
    the_builds_decide_as_the_current_defaults(ContractVersion::V0_2_0, &differences_from_0_2_0());
}
