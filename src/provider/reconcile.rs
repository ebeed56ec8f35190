//! Pure decisions of the startup reconcile: the orphan policy,
//! the stale-create table, matching pods to VMs, and the work owed after a restart.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::runtime::{RuntimeError, StaleCreateOutcome, VmRecord, VmState};

/// What happens to a VM no pod claims: destroyed (the default), kept, or kept with an alert; a kept
/// one is indexed by name, so a later CreatePod for that name adopts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrphanPolicy {
    Destroy,
    Alert,
    Keep,
}

/// A `VK_ORPHAN_POLICY` that is none of the three.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("VK_ORPHAN_POLICY={0:?} is not one of destroy, alert, keep")]
pub struct UnknownOrphanPolicy(pub String);

impl OrphanPolicy {
    /// `VK_ORPHAN_POLICY`: unset or empty means destroy; an unknown value is a startup error.
    pub fn parse(value: Option<&str>) -> Result<Self, UnknownOrphanPolicy> {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("destroy") => Ok(Self::Destroy),
            Some("alert") => Ok(Self::Alert),
            Some("keep") => Ok(Self::Keep),
            Some(other) => Err(UnknownOrphanPolicy(other.to_string())),
        }
    }
}

/// What to do with a VM left in `creating` after `vm reconcile-stale-create` answered: only a VM
/// that turns out running is adopted; a gone one frees its name; anything still in flux is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaleStep {
    /// Gone (or collected): the name is free for a clean recreate.
    Drop,
    /// Still owned by someone or undecidable: not adopted now; watch it in the background.
    Watch,
    /// Re-inspect the record and decide with [`after_inspect`].
    Inspect,
}

/// `outcome` is `vm reconcile-stale-create`'s answer; any error is undecidable.
pub fn stale_step(outcome: &Result<StaleCreateOutcome, RuntimeError>) -> StaleStep {
    match outcome {
        Ok(StaleCreateOutcome::Collected | StaleCreateOutcome::NotFound) => StaleStep::Drop,
        Ok(StaleCreateOutcome::NotCreating) => StaleStep::Inspect,
        Ok(StaleCreateOutcome::Busy | StaleCreateOutcome::Other(_)) | Err(_) => StaleStep::Watch,
    }
}

/// Verdict on a re-inspected record (`not-creating` row).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InspectVerdict {
    Drop,
    Watch,
    /// Running: adoptable.
    Keep,
    /// A terminal record: the orphan policy decides.
    Orphan,
}

/// `inspect` = `Ok(Some(state))`, `Ok(None)` for NotFound, `Err` for an inconclusive error.
pub fn after_inspect(inspect: Result<Option<&VmState>, ()>) -> InspectVerdict {
    match inspect {
        Ok(None) => InspectVerdict::Drop,
        Err(()) => InspectVerdict::Watch,
        Ok(Some(VmState::Running)) => InspectVerdict::Keep,
        Ok(Some(VmState::Creating | VmState::Created)) => InspectVerdict::Watch,
        Ok(Some(_)) => InspectVerdict::Orphan,
    }
}

/// A pod as the reconcile sees it.
#[derive(Debug, Clone)]
pub struct PodView {
    pub key: String,
    pub vm_name: String,
    pub vm_id: String,
    pub hibernate: bool,
    pub managed: bool,
}

/// The outcome for one pod.
#[derive(Debug, Clone, PartialEq)]
pub enum PodMatch {
    /// Its `id` annotation names a listed VM.
    ById(VmRecord),
    /// No `id` annotation, but a VM of its name exists: adopt and repair the annotation.
    ByName(VmRecord),
    /// Hibernated: tracked without a VM; `clear_stale_id` when its `id` names a VM that is gone.
    Hibernated { clear_stale_id: bool },
    /// CreatePod will act (nothing to adopt).
    Skip { stale_id: bool },
}

impl PodMatch {
    /// The matched VM, if any (a pod that does not adopt it gives it back).
    pub fn into_vm(self) -> Option<VmRecord> {
        match self {
            Self::ById(vm) | Self::ByName(vm) => Some(vm),
            Self::Hibernated { .. } | Self::Skip { .. } => None,
        }
    }
}

/// What [`match_pods`] made of the listed VMs.
#[derive(Debug)]
pub struct Matched {
    /// The outcome of each pod, in the order of the pods.
    pub per_pod: Vec<PodMatch>,
    /// The VMs nobody claimed, not named after a pod, whose name nobody holds.
    pub orphans: Vec<VmRecord>,
    /// The other VMs nobody claimed: named after a pod, or of a name some pod holds.
    pub unclaimed: Vec<VmRecord>,
}

/// Matches every pod to the listed VMs; every VM ends in exactly one place of the result.
///
/// A pod's annotations are its own to write, so they are not enough to claim a VM:
/// - a VM whose name `held_by(name, pod key)` says another pod holds (`Some(false)`; `None`:
///   nobody holds it) is never matched to this pod;
/// - an `id` match needs the VM to carry the pod's VM name too (or no name at all: very old
///   cocoon), so an `id` copied from another pod matches nothing;
/// - a VM goes to one pod: `id` matches first, then name matches of the VMs still free.
///
/// The VMs are moved, never copied, into the outcome (a startup matches 10,000 of them).
pub fn match_pods(pods: &[PodView], vms: Vec<VmRecord>, held_by: impl Fn(&str, &str) -> Option<bool>) -> Matched {
    enum Slot {
        Id(usize),
        Name(usize),
        Hibernated { clear_stale_id: bool },
        Skip { stale_id: bool },
    }
    let mut taken = vec![false; vms.len()];
    let mut slots: Vec<Option<Slot>> = (0..pods.len()).map(|_| None).collect();
    {
        let by_id: HashMap<&str, usize> = vms.iter().enumerate().map(|(i, v)| (v.id.as_str(), i)).collect();
        let by_name: HashMap<&str, usize> = vms
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.name().is_empty())
            .map(|(i, v)| (v.name(), i))
            .collect();
        let may_hold = |pod: &PodView, vm: &VmRecord| {
            let name = if vm.name().is_empty() {
                pod.vm_name.as_str()
            } else {
                vm.name()
            };
            held_by(name, &pod.key).unwrap_or(true)
        };
        for (i, pod) in pods.iter().enumerate().filter(|(_, p)| !p.vm_id.is_empty()) {
            let found = by_id.get(pod.vm_id.as_str()).copied().filter(|&v| {
                let vm = &vms[v];
                (vm.name().is_empty() || vm.name() == pod.vm_name) && may_hold(pod, vm) && !taken[v]
            });
            slots[i] = Some(match found {
                Some(v) => {
                    taken[v] = true;
                    Slot::Id(v)
                }
                None if pod.hibernate => Slot::Hibernated { clear_stale_id: true },
                None => Slot::Skip { stale_id: true },
            });
        }
        for (i, pod) in pods.iter().enumerate().filter(|(_, p)| p.vm_id.is_empty()) {
            let found = by_name
                .get(pod.vm_name.as_str())
                .copied()
                .filter(|_| !pod.vm_name.is_empty())
                .filter(|&v| may_hold(pod, &vms[v]) && !taken[v]);
            slots[i] = Some(match found {
                Some(v) => {
                    taken[v] = true;
                    Slot::Name(v)
                }
                None if pod.hibernate => Slot::Hibernated { clear_stale_id: false },
                None => Slot::Skip { stale_id: false },
            });
        }
    }
    let mut records: Vec<Option<VmRecord>> = vms.into_iter().map(Some).collect();
    let mut take = |v: usize| records[v].take().expect("a VM is matched to one pod");
    let per_pod = slots
        .into_iter()
        .map(|slot| match slot.expect("every pod is matched in one of the passes") {
            Slot::Id(v) => PodMatch::ById(take(v)),
            Slot::Name(v) => PodMatch::ByName(take(v)),
            Slot::Hibernated { clear_stale_id } => PodMatch::Hibernated { clear_stale_id },
            Slot::Skip { stale_id } => PodMatch::Skip { stale_id },
        })
        .collect();
    // A pod without an id whose VM was not listed under its name may still be being created;
    // its name also protects a same-named VM.
    let names: HashSet<&str> = pods
        .iter()
        .map(|p| p.vm_name.as_str())
        .filter(|n| !n.is_empty())
        .collect();
    let (orphans, unclaimed) = records
        .into_iter()
        .flatten()
        .partition(|v| !names.contains(v.name()) && held_by(v.name(), "").is_none());
    Matched {
        per_pod,
        orphans,
        unclaimed,
    }
}

/// Work a restart owes a pod (the Go daemon's `owedOpFor`), read from its annotations: a hibernate
/// to run or finish, or the guest work of a boot (fixup, lease wait, a Windows clone to classify).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwedOp {
    None,
    /// A hibernate was requested and the VM still exists: hibernate it (a stopped VM is booted
    /// and saved, unless its own save already is the hibernate snapshot).
    Hibernate,
    /// A hibernate got as far as removing the VM: confirm the snapshot and report `hibernated`.
    FinishHibernate,
    /// A guest fixup ran, or may be needed (the guest-fixup policy decides), then the lease wait.
    PostClone,
    /// The fixup is done (or none applies): wait for the lease, then Ready.
    ReadyWait,
    /// A cloud-hypervisor Windows clone without a marker: restored (lease wait) or fresh (fixup)?
    /// The hibernate evidence tells.
    ClassifyDropNic,
}

impl OwedOp {
    /// `startup_resume_total{op}`.
    pub fn label(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Hibernate => "hibernate",
            Self::FinishHibernate => "finish_hibernate",
            Self::PostClone => "post_clone",
            Self::ReadyWait => "ready_wait",
            Self::ClassifyDropNic => "classify_drop_nic",
        }
    }
}

/// What the pod looks like to [`owed_op`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwedFacts<'a> {
    pub deleting: bool,
    pub has_vm: bool,
    /// The host-written markers (lifecycle state, fixup progress).
    pub annotations: &'a BTreeMap<String, String>,
    /// The pod asks to be hibernated.
    pub hibernate: bool,
    /// The guest hibernates without its NIC (a host invariant).
    pub drop_nic: bool,
    /// The VM came from a snapshot (a host invariant).
    pub cloned: bool,
}

/// [`owed_op`] for a pod as the apiserver has it (a VM of it is tracked or not), `spec` its
/// decoded annotations.
pub fn owed_for(pod: &k8s_openapi::api::core::v1::Pod, spec: &crate::model::VmSpec, has_vm: bool) -> OwedOp {
    let none = BTreeMap::new();
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&none);
    owed_op(OwedFacts {
        deleting: pod.metadata.deletion_timestamp.is_some(),
        has_vm,
        annotations,
        hibernate: spec.hibernate,
        drop_nic: super::invariants::nic_less_hibernate(spec),
        cloned: super::invariants::cloned_boot(spec),
    })
}

pub fn owed_op(f: OwedFacts<'_>) -> OwedOp {
    if f.deleting {
        return OwedOp::None;
    }
    let lifecycle = f
        .annotations
        .get(super::lifecycle::STATE)
        .map(String::as_str)
        .unwrap_or("");
    if f.hibernate {
        return match (f.has_vm, lifecycle) {
            (true, _) => OwedOp::Hibernate,
            (false, "hibernating") => OwedOp::FinishHibernate,
            (false, _) => OwedOp::None,
        };
    }
    if !f.has_vm || !matches!(lifecycle, "" | "creating") {
        return OwedOp::None;
    }
    match f
        .annotations
        .get(crate::model::annotations::POST_CLONE_STATE)
        .map(String::as_str)
    {
        Some("failed") => OwedOp::None,
        Some("running") => OwedOp::PostClone,
        Some("done") => OwedOp::ReadyWait,
        _ if f.drop_nic && f.cloned => OwedOp::ClassifyDropNic,
        _ if f.cloned => OwedOp::PostClone,
        _ => OwedOp::ReadyWait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::parse::VmConfig;

    fn vm(id: &str, name: &str) -> VmRecord {
        VmRecord {
            id: id.into(),
            state: VmState::Running,
            config: VmConfig {
                name: name.into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn pod(key: &str, vm_name: &str, vm_id: &str, hibernate: bool) -> PodView {
        PodView {
            key: key.into(),
            vm_name: vm_name.into(),
            vm_id: vm_id.into(),
            hibernate,
            managed: true,
        }
    }

    #[test]
    fn orphan_policy_parsing() {
        assert_eq!(OrphanPolicy::parse(None), Ok(OrphanPolicy::Destroy));
        assert_eq!(OrphanPolicy::parse(Some("")), Ok(OrphanPolicy::Destroy));
        assert_eq!(OrphanPolicy::parse(Some(" Alert ")), Ok(OrphanPolicy::Alert));
        assert_eq!(OrphanPolicy::parse(Some("keep")), Ok(OrphanPolicy::Keep));
        assert!(
            OrphanPolicy::parse(Some("nuke"))
                .unwrap_err()
                .to_string()
                .contains("nuke")
        );
    }

    #[test]
    fn stale_create_table() {
        assert_eq!(stale_step(&Ok(StaleCreateOutcome::Collected)), StaleStep::Drop);
        assert_eq!(stale_step(&Ok(StaleCreateOutcome::NotFound)), StaleStep::Drop);
        assert_eq!(stale_step(&Ok(StaleCreateOutcome::Busy)), StaleStep::Watch);
        let failed = RuntimeError::Command {
            verb: "vm reconcile-stale-create".into(),
            code: Some(1),
            stderr: "unknown command".into(),
        };
        assert_eq!(stale_step(&Err(failed)), StaleStep::Watch);
        assert_eq!(stale_step(&Ok(StaleCreateOutcome::NotCreating)), StaleStep::Inspect);
        assert_eq!(after_inspect(Ok(None)), InspectVerdict::Drop);
        assert_eq!(after_inspect(Err(())), InspectVerdict::Watch);
        assert_eq!(after_inspect(Ok(Some(&VmState::Running))), InspectVerdict::Keep);
        assert_eq!(after_inspect(Ok(Some(&VmState::Created))), InspectVerdict::Watch);
        assert_eq!(after_inspect(Ok(Some(&VmState::Error))), InspectVerdict::Orphan);
    }

    #[test]
    fn pods_match_by_id_then_by_name_and_the_rest_are_orphans() {
        let vms = vec![
            vm("id-a", "vm-a"),
            vm("id-b", "vm-b"),
            vm("id-x", "vm-x"),
            vm("id-h", "vm-h"),
        ];
        let pods = vec![
            pod("ns/a", "vm-a", "id-a", false),
            pod("ns/b", "vm-b", "", false),
            pod("ns/c", "vm-c", "id-gone", false),
            pod("ns/d", "vm-d", "id-gone2", true),
            pod("ns/e", "vm-e", "", true),
            pod("ns/f", "vm-f", "", false),
        ];
        let Matched {
            per_pod: m,
            orphans,
            unclaimed,
        } = match_pods(&pods, vms.clone(), |_, _| None);
        assert_eq!(m[0], PodMatch::ById(vms[0].clone()));
        assert_eq!(m[1], PodMatch::ByName(vms[1].clone()));
        assert_eq!(m[2], PodMatch::Skip { stale_id: true });
        assert_eq!(m[3], PodMatch::Hibernated { clear_stale_id: true });
        assert_eq!(m[4], PodMatch::Hibernated { clear_stale_id: false });
        assert_eq!(m[5], PodMatch::Skip { stale_id: false });
        let ids: Vec<&str> = orphans.iter().map(|v| v.id.as_str()).collect();
        assert_eq!(ids, vec!["id-x", "id-h"]);
        assert!(unclaimed.is_empty(), "{unclaimed:?}");
    }

    #[test]
    fn a_pod_claims_only_a_vm_it_may_hold_and_a_vm_goes_to_one_pod() {
        let vms = vec![vm("id-a", "vm-a"), vm("id-b", "vm-b"), vm("id-x", "vm-x")];
        let holders = BTreeMap::from([("vm-a", "ns/a"), ("vm-x", "gone/x")]);
        let pods = vec![
            // The holder's pod, by id.
            pod("ns/a", "vm-a", "id-a", false),
            // Another tenant copying its id (and naming the VM): nothing.
            pod("evil/p", "vm-a", "id-a", false),
            // ... or naming it without an id: nothing either.
            pod("evil/q", "vm-a", "", false),
            // An id whose VM carries another name: not this pod's VM.
            pod("evil/r", "vm-r", "id-b", false),
            // vm-b is unheld (an upgrade from a daemon that kept no holders): first by id wins,
            // then by name, and a VM goes to one pod only.
            pod("ns/b", "vm-b", "", false),
            pod("ns/b2", "vm-b", "", false),
        ];
        let Matched {
            per_pod: m,
            orphans,
            unclaimed,
        } = match_pods(&pods, vms.clone(), |name, key| holders.get(name).map(|k| *k == key));
        assert_eq!(m[0], PodMatch::ById(vms[0].clone()));
        assert_eq!(m[1], PodMatch::Skip { stale_id: true });
        assert_eq!(m[2], PodMatch::Skip { stale_id: false });
        assert_eq!(m[3], PodMatch::Skip { stale_id: true });
        assert_eq!(m[4], PodMatch::ByName(vms[1].clone()));
        assert_eq!(m[5], PodMatch::Skip { stale_id: false });
        // vm-x is held by a pod that is gone: kept for the policy to rule on, never an orphan.
        assert!(orphans.is_empty(), "{orphans:?}");
        let ids: Vec<&str> = unclaimed.iter().map(|v| v.id.as_str()).collect();
        assert_eq!(ids, vec!["id-x"], "every VM ends in one place");
    }

    #[test]
    fn owed_work() {
        use crate::model::annotations::{HIBERNATE, POST_CLONE_STATE};
        use crate::provider::lifecycle::STATE;
        let a = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let owed =
            |deleting: bool, has_vm: bool, annotations: &BTreeMap<String, String>, drop_nic: bool, cloned: bool| {
                owed_op(OwedFacts {
                    deleting,
                    has_vm,
                    annotations,
                    hibernate: crate::model::vm_spec::decode(annotations).hibernate,
                    drop_nic,
                    cloned,
                })
            };
        // Deleting or VM-less pods owe nothing (a hibernate in its last step excepted).
        assert_eq!(owed(true, true, &a(&[]), false, true), OwedOp::None);
        assert_eq!(owed(false, false, &a(&[]), false, true), OwedOp::None);
        assert_eq!(
            owed(false, true, &a(&[(HIBERNATE, "true"), (STATE, "ready")]), false, true),
            OwedOp::Hibernate
        );
        assert_eq!(
            owed(
                false,
                true,
                &a(&[(HIBERNATE, "true"), (STATE, "hibernating")]),
                false,
                true
            ),
            OwedOp::Hibernate,
            "an interrupted hibernate is resumed"
        );
        assert_eq!(
            owed(
                false,
                false,
                &a(&[(HIBERNATE, "true"), (STATE, "hibernating")]),
                false,
                true
            ),
            OwedOp::FinishHibernate
        );
        assert_eq!(
            owed(
                false,
                false,
                &a(&[(HIBERNATE, "true"), (STATE, "hibernated")]),
                false,
                true
            ),
            OwedOp::None
        );
        // Only a create that had not finished is resumed.
        assert_eq!(owed(false, true, &a(&[(STATE, "ready")]), false, true), OwedOp::None);
        assert_eq!(owed(false, true, &a(&[(STATE, "failed")]), false, true), OwedOp::None);
        assert_eq!(
            owed(
                false,
                true,
                &a(&[(STATE, "creating"), (POST_CLONE_STATE, "failed")]),
                false,
                true
            ),
            OwedOp::None,
            "a failed fixup stays parked"
        );
        assert_eq!(
            owed(
                false,
                true,
                &a(&[(STATE, "creating"), (POST_CLONE_STATE, "running")]),
                false,
                true
            ),
            OwedOp::PostClone
        );
        assert_eq!(
            owed(
                false,
                true,
                &a(&[(STATE, "creating"), (POST_CLONE_STATE, "done")]),
                false,
                true
            ),
            OwedOp::ReadyWait
        );
        assert_eq!(
            owed(false, true, &a(&[(STATE, "creating")]), true, true),
            OwedOp::ClassifyDropNic
        );
        assert_eq!(owed(false, true, &a(&[]), false, true), OwedOp::PostClone);
        assert_eq!(
            owed(false, true, &a(&[(STATE, "creating")]), false, false),
            OwedOp::ReadyWait,
            "a run-mode VM needs no fixup"
        );
    }
}
