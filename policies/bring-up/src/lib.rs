//! Default `bring-up` policy: choose how CreatePod brings a pod's VM up, or refuse. Both an
//! explicit restore marker and a restore derived from hibernate evidence fail closed when the
//! evidence cannot be read and refuse an image ref other than the one the hibernate push recorded
//! (`src/provider/DECISIONS.md`, row 4).
//!
//! Rows, first match wins: adopt a VM that already runs here; adopt an unmanaged pod's
//! pre-assigned VM; validate `clone-from-dir`; restore a hibernated guest (explicit marker or
//! evidence) behind its guards; then the fresh paths: clone-from-dir, fork, run, clone. A
//! hibernated guest is never overwritten by a fresh boot: missing or unavailable evidence for a
//! managed pod fails closed.
//!
//! Tenancy: whatever the row, a plan that reaches a VM (or its saved state) held by a pod of
//! another namespace is refused (`VMOwnedByAnotherPod`): the namespace is the tenant line, as
//! Kubernetes' own authorization draws it. Within a namespace the operator's flows work as they
//! are (sub-agents forking their main agent, a released seat woken by its recreated pod). A
//! single-tenant node that wants otherwise swaps this policy.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;

// Natively the bindings also derive serde, so the benchmark can hand this crate the host's
// facts (same JSON shape: both sides are generated from the same WIT).
#[cfg(target_arch = "wasm32")]
wit_bindgen::generate!({ world: "bring-up-policy", path: "../../wit", additional_derives: [PartialEq] });
#[cfg(not(target_arch = "wasm32"))]
wit_bindgen::generate!({
    world: "bring-up-policy",
    path: "../../wit",
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});

use cocoonstack::vk_policy::types::{
    Backend, BootMode, EventReason, GuestOs, Holder, Refusal, RefusalKind, RestoreMode, VmSpec,
};
pub use exports::cocoonstack::vk_policy::bring_up::{
    CloneFromDirPlan, CloneOptions, ClonePlan, Decision, EvidenceSource, Facts, ForkPlan, HibernateEvidence, Outcome,
    Plan, RestorePlan, RunPlan, UnmanagedAdoption,
};
use vk_policy_support::naming::{fork_snapshot_name, local_snapshot_name, parse_ref};
use vk_policy_support::path::is_absolute_and_clean;

pub struct Policy;

impl exports::cocoonstack::vk_policy::bring_up::Guest for Policy {
    fn decide(facts: Facts) -> Decision {
        decide(&facts)
    }
}

// Component exports exist only in the wasm build (export names contain `:`, which native
// linkers reject); natively the crate is a plain library for tests and benchmarks.
#[cfg(target_arch = "wasm32")]
export!(Policy);

pub fn decide(facts: &Facts) -> Decision {
    let decision = choose(facts);
    match &decision.outcome {
        Outcome::Proceed(plan) => match foreign_holder(facts, plan) {
            Some(holder) => refuse(
                RefusalKind::Permanent,
                EventReason::VmOwnedByAnotherPod,
                "vm-owned-by-another-pod",
                format!(
                    "vm {}: the plan ({}) would reach a VM held by pod {holder} of another namespace; a pod may only use the VMs of its own namespace",
                    facts.spec.vm_name, decision.reason
                ),
            ),
            None => decision,
        },
        Outcome::Refuse(_) => decision,
    }
}

/// The pod of another namespace whose VM (or saved state) `plan` reaches, as `namespace/pod`.
fn foreign_holder(facts: &Facts, plan: &Plan) -> Option<String> {
    let namespace = facts.pod.namespace.as_str();
    let foreign = |holder: &Option<Holder>| {
        holder
            .as_ref()
            .filter(|h| h.namespace != namespace)
            .map(|h| format!("{}/{}", h.namespace, h.pod))
    };
    let recorded = || match &facts.evidence {
        HibernateEvidence::Found(found) => {
            let owner = found.recorded_owner.as_str();
            let owner_namespace = owner.split('/').next().unwrap_or_default();
            (!owner.is_empty() && owner_namespace != namespace).then(|| String::from(owner))
        }
        _ => None,
    };
    let source = match plan {
        Plan::AdoptUnmanaged(_) => foreign(&facts.preassigned_holder),
        Plan::Fork(_) => foreign(&facts.fork_source_holder),
        Plan::Clone(_) => foreign(&facts.image_holder),
        Plan::RestoreFromHibernate(_) => recorded(),
        Plan::AdoptExisting(_) | Plan::CloneFromDir(_) | Plan::Run(_) => None,
    };
    source.or_else(|| foreign(&facts.previous_holder))
}

fn choose(facts: &Facts) -> Decision {
    let spec = &facts.spec;
    let vm = spec.vm_name.as_str();
    if facts.vm_exists_locally {
        return proceed(
            Plan::AdoptExisting(vm.into()),
            "adopt-existing",
            format!("vm {vm} already exists on this node: adopting it"),
        );
    }
    if !spec.managed {
        return adopt_unmanaged(facts);
    }
    if spec.os == GuestOs::Macos {
        return macos(spec);
    }
    let clone_dir = spec.clone_from_dir.trim();
    if !clone_dir.is_empty() && !is_absolute_and_clean(clone_dir) {
        return invalid(
            "invalid-clone-from-dir",
            format!(
                "vm.cocoonstack.io/clone-from-dir \"{clone_dir}\" must be an absolute, clean path (no trailing slash, `.` or `..`)"
            ),
        );
    }
    if let Some(decision) = unsupported(spec) {
        return decision;
    }
    if let Some(decision) = restore_from_hibernate(facts) {
        return decision;
    }
    fresh_boot(facts, clone_dir)
}

/// A managed macOS guest (`os=macos`) boots through cocoon-macos from its image: `run`
/// (an existing VM of that name was adopted above; the host starts a stopped one). No snapshot,
/// fork or clone path exists for it.
fn macos(spec: &VmSpec) -> Decision {
    let vm = spec.vm_name.as_str();
    let image = spec.image.trim();
    if image.is_empty() {
        return invalid(
            "macos-image-missing",
            format!(
                "vm {vm}: a macOS guest boots from an image and none is set: add the cocoonset.cocoonstack.io/image annotation (e.g. ghcr.io/cocoonstack/cocoon-macos/tahoe:26)"
            ),
        );
    }
    proceed(
        Plan::Run(RunPlan {
            vm_name: vm.into(),
            image: image.into(),
            force_pull: spec.force_pull,
            network: spec.network.clone(),
            backend: Backend::Unspecified,
            windows: false,
            no_direct_io: false,
        }),
        "macos-run",
        format!("running macOS vm {vm} from image {image} through cocoon-macos"),
    )
}

/// A backend or OS value outside the contract's domains: nothing this node can boot right.
fn unsupported(spec: &VmSpec) -> Option<Decision> {
    if let Backend::Unknown(raw) = &spec.backend {
        return Some(invalid(
            "unknown-backend",
            format!(
                "vm.cocoonstack.io/backend \"{raw}\" of vm {} is not a backend this node boots (cloud-hypervisor, firecracker, or unset)",
                spec.vm_name
            ),
        ));
    }
    if let GuestOs::Unknown(raw) = &spec.os {
        return Some(invalid(
            "unknown-os",
            format!(
                "cocoonset.cocoonstack.io/os \"{raw}\" of vm {} is not one of linux, windows, android, macos",
                spec.vm_name
            ),
        ));
    }
    None
}

fn adopt_unmanaged(facts: &Facts) -> Decision {
    let vm = facts.spec.vm_name.as_str();
    if facts.preassigned_vm_id.is_empty() || facts.preassigned_ip.is_empty() {
        return invalid(
            "missing-preassigned-runtime",
            format!(
                "unmanaged vm {vm} missing pre-assigned IP/VMID: the operator must write vm.cocoonstack.io/id and vm.cocoonstack.io/ip"
            ),
        );
    }
    // A malformed port means "none", as cocoon-common's VMRuntime reader does.
    let vnc_port = facts.preassigned_vnc_port.parse::<u32>().unwrap_or(0);
    proceed(
        Plan::AdoptUnmanaged(UnmanagedAdoption {
            vm_id: facts.preassigned_vm_id.clone(),
            ip: facts.preassigned_ip.clone(),
            vnc_port,
        }),
        "adopt-unmanaged",
        format!(
            "vm {vm} is unmanaged: adopting pre-assigned id {} and ip {}",
            facts.preassigned_vm_id, facts.preassigned_ip
        ),
    )
}

/// The restore row: `Some` when the pod must restore (or must be refused), `None` for a fresh boot.
fn restore_from_hibernate(facts: &Facts) -> Option<Decision> {
    let spec = &facts.spec;
    let vm = spec.vm_name.as_str();
    let explicit = spec.restore_from_hibernate;
    let found = match &facts.evidence {
        HibernateEvidence::Unavailable(error) => {
            return Some(refuse(
                RefusalKind::RetryLater,
                EventReason::HibernateEvidenceUnavailable,
                "hibernate-evidence-unavailable",
                format!("hibernate evidence for {vm}: {error} (refusing fresh boot); retry once the registry answers"),
            ));
        }
        HibernateEvidence::NotChecked => {
            return Some(refuse(
                RefusalKind::RetryLater,
                EventReason::HibernateEvidenceUnavailable,
                "hibernate-evidence-not-checked",
                format!("hibernate evidence for managed vm {vm} was not gathered (refusing fresh boot)"),
            ));
        }
        // The tag may still arrive (a cross-node wake racing its push), or the operator clears
        // the marker: either way it is theirs to settle, re-checked until then.
        HibernateEvidence::None if explicit => {
            return Some(refuse(
                RefusalKind::NeedsOperator,
                EventReason::HibernateSnapshotMissing,
                "hibernate-snapshot-missing",
                format!(
                    "pod asks to restore vm {vm} from hibernate but no hibernate snapshot exists; clear vm.cocoonstack.io/restore-from-hibernate to boot it fresh"
                ),
            ));
        }
        HibernateEvidence::None => return None,
        HibernateEvidence::Found(found) => found,
    };
    // The conflicts need the operator: delete the tag (discarding the guest) or change the pod.
    if !explicit && has_explicit_clone_source(spec) {
        return Some(refuse(
            RefusalKind::NeedsOperator,
            EventReason::HibernateSourceConflict,
            "source-conflict",
            format!(
                "vm {vm} has a hibernate snapshot but the pod requests an explicit clone source; delete the hibernate tag to discard the hibernated state, or drop fork-from / clone-from-dir"
            ),
        ));
    }
    if !found.recorded_image.is_empty() && found.recorded_image != spec.image {
        return Some(refuse(
            RefusalKind::NeedsOperator,
            EventReason::HibernateImageConflict,
            "image-conflict",
            format!(
                "vm {vm} was hibernated from image {} but the pod requests {}; delete the hibernate tag to discard the hibernated state, or request the recorded image",
                found.recorded_image, spec.image
            ),
        ));
    }
    let (reason, how) = if explicit {
        ("restore-explicit", "the operator marked it")
    } else {
        ("restore-derived", "a hibernate snapshot exists")
    };
    Some(proceed(
        Plan::RestoreFromHibernate(RestorePlan {
            options: clone_options(facts, false),
            derived: !explicit,
        }),
        reason,
        format!(
            "restoring vm {vm} from its hibernate snapshot ({how} via {})",
            match found.source {
                EvidenceSource::Registry => "registry",
                EvidenceSource::LocalSnapshot => "local-snapshot",
            }
        ),
    ))
}

fn fresh_boot(facts: &Facts, clone_dir: &str) -> Decision {
    let spec = &facts.spec;
    let vm = spec.vm_name.as_str();
    let run_mode = spec.mode == BootMode::Run;
    if !clone_dir.is_empty() {
        if run_mode {
            return invalid(
                "clone-from-dir-conflict",
                format!("vm.cocoonstack.io/clone-from-dir {clone_dir} is incompatible with mode=run"),
            );
        }
        if !spec.fork_from.is_empty() {
            return invalid(
                "clone-from-dir-conflict",
                format!(
                    "vm.cocoonstack.io/clone-from-dir {clone_dir} is incompatible with fork-from {}",
                    spec.fork_from
                ),
            );
        }
        return proceed(
            Plan::CloneFromDir(CloneFromDirPlan {
                options: clone_options(facts, true),
                dir: clone_dir.into(),
            }),
            "clone-from-dir",
            format!("cloning vm {vm} from the exported snapshot in {clone_dir}"),
        );
    }
    if !spec.fork_from.is_empty() {
        let source = spec.fork_from.as_str();
        return proceed(
            Plan::Fork(ForkPlan {
                options: clone_options(facts, true),
                source_vm: source.into(),
                fork_snapshot: fork_snapshot_name(source),
            }),
            "fork",
            format!("forking vm {vm} from vm {source} through snapshot fork-{source}"),
        );
    }
    if spec.image.is_empty() {
        return invalid(
            "missing-image",
            format!(
                "vm {vm} names no image: set cocoonset.cocoonstack.io/image to a snapshot (clone) or base image (run)"
            ),
        );
    }
    if run_mode {
        return proceed(
            Plan::Run(RunPlan {
                vm_name: vm.into(),
                image: spec.image.clone(),
                force_pull: spec.force_pull,
                network: spec.network.clone(),
                backend: spec.backend.clone(),
                windows: spec.os == GuestOs::Windows,
                no_direct_io: spec.no_direct_io,
            }),
            "run",
            format!("booting vm {vm} from image {}", spec.image),
        );
    }
    clone_snapshot(facts)
}

fn clone_snapshot(facts: &Facts) -> Decision {
    let spec = &facts.spec;
    let vm = spec.vm_name.as_str();
    let (repo, tag) = parse_ref(&spec.image);
    let local = local_snapshot_name(repo, tag);
    match facts.local_snapshots.iter().find(|s| s.name == local) {
        Some(snapshot)
            if snapshot.hypervisor != Backend::Unspecified
                && spec.backend != Backend::Unspecified
                && snapshot.hypervisor != spec.backend =>
        {
            return refuse(
                RefusalKind::Permanent,
                EventReason::SnapshotBackendMismatch,
                "backend-mismatch",
                format!(
                    "snapshot {local} was taken with {} but CocoonSet requests {}",
                    backend_name(&snapshot.hypervisor),
                    backend_name(&spec.backend)
                ),
            );
        }
        Some(_) => {}
        // Someone must bring the snapshot here (or configure a registry): re-checked until then.
        None if !facts.registry_configured => {
            return refuse(
                RefusalKind::NeedsOperator,
                EventReason::SnapshotUnavailable,
                "snapshot-unavailable",
                format!("snapshot {local} is not on this node and no registry is configured to pull {repo}:{tag} from"),
            );
        }
        None => {}
    }
    proceed(
        Plan::Clone(ClonePlan {
            options: clone_options(facts, true),
            local_snapshot: local.clone(),
            repository: repo.into(),
            tag: tag.into(),
            expected_backend: spec.backend.clone(),
        }),
        "clone",
        format!("cloning vm {vm} from snapshot {local}"),
    )
}

fn clone_options(facts: &Facts, fresh: bool) -> CloneOptions {
    let spec = &facts.spec;
    CloneOptions {
        vm_name: spec.vm_name.clone(),
        network: spec.network.clone(),
        no_direct_io: spec.no_direct_io,
        backend: spec.backend.clone(),
        restore_mode: Some(restore_mode(spec, facts.node_restore_mode)),
        drop_own_fork_snapshot: fresh,
    }
}

/// `restoreModeFor`: Windows guests always restore by copy.
fn restore_mode(spec: &VmSpec, node_mode: RestoreMode) -> RestoreMode {
    if spec.os == GuestOs::Windows {
        RestoreMode::Copy
    } else {
        node_mode
    }
}

fn backend_name(backend: &Backend) -> &str {
    match backend {
        Backend::Unspecified => "an unspecified backend",
        Backend::CloudHypervisor => "cloud-hypervisor",
        Backend::Firecracker => "firecracker",
        Backend::Unknown(raw) => raw,
    }
}

fn has_explicit_clone_source(spec: &VmSpec) -> bool {
    !spec.clone_from_dir.trim().is_empty() || !spec.fork_from.is_empty()
}

fn proceed(plan: Plan, reason: &str, message: String) -> Decision {
    Decision {
        outcome: Outcome::Proceed(plan),
        reason: reason.into(),
        message,
    }
}

fn refuse(kind: RefusalKind, event: EventReason, reason: &str, message: String) -> Decision {
    Decision {
        outcome: Outcome::Refuse(Refusal { kind, event }),
        reason: reason.into(),
        message,
    }
}

/// The pod's annotations describe no VM this node can boot: the pod must change.
fn invalid(reason: &str, message: String) -> Decision {
    refuse(RefusalKind::Permanent, EventReason::InvalidVmSpec, reason, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cocoonstack::vk_policy::types::{PodFacts, PodPhase, ReadinessProbe, SnapshotPolicy};
    use exports::cocoonstack::vk_policy::bring_up::FoundEvidence;

    fn facts() -> Facts {
        Facts {
            pod: PodFacts {
                namespace: "ns".into(),
                name: "p".into(),
                uid: "u".into(),
                phase: PodPhase::Pending,
                annotations: vec![],
                labels: vec![],
                node_selector: vec![],
                owner_references: vec![],
            },
            spec: VmSpec {
                vm_name: "vm1".into(),
                image: "snap:v1".into(),
                mode: BootMode::Clone,
                os: GuestOs::Linux,
                storage: String::new(),
                network: String::new(),
                snapshot_policy: SnapshotPolicy::Always,
                fork_from: String::new(),
                clone_from_dir: String::new(),
                managed: true,
                force_pull: false,
                no_direct_io: false,
                conn_type: String::new(),
                backend: Backend::Unspecified,
                probe: ReadinessProbe::Icmp,
                restore_from_hibernate: false,
                hibernate: false,
                keep_snapshot_on_delete: false,
            },
            vm_exists_locally: false,
            evidence: HibernateEvidence::None,
            registry_configured: true,
            local_snapshots: vec![],
            node_restore_mode: RestoreMode::Mmap,
            preassigned_vm_id: String::new(),
            preassigned_ip: String::new(),
            preassigned_vnc_port: String::new(),
            previous_holder: None,
            fork_source_holder: None,
            image_holder: None,
            preassigned_holder: None,
        }
    }

    fn found(image: &str) -> HibernateEvidence {
        HibernateEvidence::Found(FoundEvidence {
            source: EvidenceSource::Registry,
            recorded_image: image.into(),
            recorded_owner: String::new(),
        })
    }

    fn holder(namespace: &str, live: bool) -> Option<Holder> {
        Some(Holder {
            namespace: namespace.into(),
            pod: "main-0".into(),
            uid: "u0".into(),
            live,
        })
    }

    fn refused_as_foreign(d: &Decision) -> bool {
        d.reason == "vm-owned-by-another-pod"
            && matches!(
                d.outcome,
                Outcome::Refuse(Refusal {
                    kind: RefusalKind::Permanent,
                    event: EventReason::VmOwnedByAnotherPod
                })
            )
    }

    #[test]
    fn a_plan_stays_within_the_pods_namespace() {
        // A sub-agent forks its own namespace's main agent; another namespace's is refused.
        let mut f = facts();
        f.spec.fork_from = "vm-main".into();
        f.fork_source_holder = holder("ns", true);
        assert_eq!(decide(&f).reason, "fork");
        f.fork_source_holder = holder("other", true);
        assert!(refused_as_foreign(&decide(&f)), "{:?}", decide(&f));
        // A VM name another namespace's (gone) pod held.
        let mut f = facts();
        f.vm_exists_locally = true;
        f.previous_holder = holder("other", false);
        assert!(refused_as_foreign(&decide(&f)));
        f.previous_holder = holder("ns", false);
        assert_eq!(decide(&f).reason, "adopt-existing");
        // A snapshot that is another namespace's VM state.
        let mut f = facts();
        f.image_holder = holder("other", true);
        assert!(refused_as_foreign(&decide(&f)));
        // A hibernated guest another namespace's pod pushed.
        let mut f = facts();
        f.evidence = HibernateEvidence::Found(FoundEvidence {
            source: EvidenceSource::Registry,
            recorded_image: "snap:v1".into(),
            recorded_owner: "other/main-0".into(),
        });
        assert!(refused_as_foreign(&decide(&f)));
        f.evidence = HibernateEvidence::Found(FoundEvidence {
            source: EvidenceSource::Registry,
            recorded_image: "snap:v1".into(),
            recorded_owner: "ns/p".into(),
        });
        assert_eq!(decide(&f).reason, "restore-derived");
        // An unmanaged pod pre-assigning another namespace's VM.
        let mut f = facts();
        f.spec.managed = false;
        f.preassigned_vm_id = "K7Q".into();
        f.preassigned_ip = "10.0.0.2".into();
        f.preassigned_holder = holder("other", false);
        assert!(refused_as_foreign(&decide(&f)));
    }

    #[test]
    fn fresh_clone_uses_the_tag_aware_local_name() {
        let d = decide(&facts());
        let Outcome::Proceed(Plan::Clone(plan)) = d.outcome else {
            panic!("{}", d.reason)
        };
        assert_eq!(
            (
                plan.local_snapshot.as_str(),
                plan.repository.as_str(),
                plan.tag.as_str()
            ),
            ("snap:v1", "snap", "v1")
        );
        assert!(plan.options.drop_own_fork_snapshot);
        assert_eq!(plan.options.restore_mode, Some(RestoreMode::Mmap));
    }

    #[test]
    fn refusals_say_who_can_clear_them() {
        let mut f = facts();
        f.evidence = HibernateEvidence::Unavailable("registry down".into());
        assert!(matches!(
            decide(&f).outcome,
            Outcome::Refuse(Refusal {
                kind: RefusalKind::RetryLater,
                event: EventReason::HibernateEvidenceUnavailable
            })
        ));
        f.evidence = found("snap:v2");
        assert!(matches!(
            decide(&f).outcome,
            Outcome::Refuse(Refusal {
                kind: RefusalKind::NeedsOperator,
                event: EventReason::HibernateImageConflict
            })
        ));
        let mut f = facts();
        f.spec.backend = Backend::Unknown("qemu".into());
        let d = decide(&f);
        assert_eq!(d.reason, "unknown-backend");
        assert!(matches!(
            d.outcome,
            Outcome::Refuse(Refusal {
                kind: RefusalKind::Permanent,
                event: EventReason::InvalidVmSpec
            })
        ));
    }

    #[test]
    fn windows_guests_restore_by_copy() {
        let mut f = facts();
        f.spec.os = GuestOs::Windows;
        f.evidence = found("snap:v1");
        let Outcome::Proceed(Plan::RestoreFromHibernate(plan)) = decide(&f).outcome else {
            panic!()
        };
        assert_eq!(plan.options.restore_mode, Some(RestoreMode::Copy));
    }

    #[test]
    fn evidence_guards() {
        let mut f = facts();
        f.evidence = HibernateEvidence::Unavailable("registry down".into());
        assert_eq!(decide(&f).reason, "hibernate-evidence-unavailable");
        f.evidence = found("snap:v1");
        assert_eq!(decide(&f).reason, "restore-derived");
        f.evidence = found("snap:v2");
        assert_eq!(decide(&f).reason, "image-conflict");
        f.evidence = found("snap:v1");
        f.spec.fork_from = "src".into();
        assert_eq!(decide(&f).reason, "source-conflict");
        // The explicit marker is exempt from the source conflict but keeps the image guard.
        f.spec.restore_from_hibernate = true;
        assert_eq!(decide(&f).reason, "restore-explicit");
        f.evidence = found("other");
        assert_eq!(decide(&f).reason, "image-conflict");
    }

    #[test]
    fn restore_keeps_the_fork_lineage() {
        let mut f = facts();
        f.evidence = found("");
        let Outcome::Proceed(Plan::RestoreFromHibernate(plan)) = decide(&f).outcome else {
            panic!()
        };
        assert!(!plan.options.drop_own_fork_snapshot);
        assert!(plan.derived);
    }
}
