//! Step 3 of a bring-up: carry out the plan the bring-up policy chose. One function per plan;
//! each fails with a [`Failure`] naming the cocoon step and the VM, and boots nothing it could
//! not finish (cocoon's clone and run verbs are atomic).

use k8s_openapi::api::core::v1::Pod;

use super::super::CocoonProvider;
use super::super::ensure::{ensure_base_image, ensure_fork_snapshot, ensure_run_image, ensure_snapshot};
use super::super::failure::Failure;
use super::super::guest::Finish;
use super::super::known::SnapshotFact;
use super::super::metrics::ProviderMetrics;
use super::super::plan;
use super::super::reconcile::{self, OwedOp};
use super::gather::{Ctx, hibernate_evidence};
use super::{BringUpError, BroughtUp, restore};
use crate::kubelet::{EventReason, EventType};
use crate::model::{VmSpec, first_container_resources};
use crate::policy::contract::bring_up::{
    CloneFromDirPlan, CloneOptions, ClonePlan, ForkPlan, HibernateEvidence, Plan, RestorePlan, RunPlan,
    UnmanagedAdoption,
};
use crate::policy::contract::guest_fixup::BootOrigin;
use crate::policy::contract::resource_translation::{self as translation, BootPath, GuestResources};
use crate::policy::slots::ResourceTranslation;
use crate::runtime::{CloneSource, CpuPolicy, RunSpec, SnapshotRecord, VmRecord, VmState};

/// `decided`: the translation policy's answer for the path `plan` boots by, decided in the
/// bring-up decision's hop; each plan takes it at the step where it needs the cgroup flags, so a
/// refusal still comes after the same cocoon calls as when it was asked there.
pub(super) async fn execute(
    p: &CocoonProvider,
    ctx: &Ctx<'_>,
    existing: Option<VmRecord>,
    image_snapshot: Option<SnapshotRecord>,
    plan: Plan,
    decided: Option<Decided>,
) -> Result<BroughtUp, BringUpError> {
    match plan {
        Plan::AdoptExisting(_) => adopt_existing(p, ctx, existing).await,
        Plan::AdoptUnmanaged(adoption) => Ok(adopt_unmanaged(&ctx.spec, &adoption)),
        Plan::RestoreFromHibernate(restore_plan) => {
            return restore_from_hibernate(p, ctx, restore_plan, decided)
                .await
                .map_err(BringUpError::Restore);
        }
        Plan::CloneFromDir(dir_plan) => clone_from_dir(p, ctx, dir_plan, decided).await,
        Plan::Fork(fork_plan) => fork(p, ctx, fork_plan, decided).await,
        Plan::Clone(clone_plan) => clone(p, ctx, clone_plan, image_snapshot, decided).await,
        Plan::Run(run_plan) => run(p, ctx, run_plan, decided).await,
    }
    .map_err(BringUpError::Execute)
}

/// The path a plan boots by, which is the one fact of the translation's the plan decides: a
/// restore, a clone from a directory, a fork and a clone all boot by `vm clone`, a run by
/// `vm run`; an adoption boots nothing and asks no translation.
pub(super) fn boot_path(plan: &Plan) -> Option<BootPath> {
    match plan {
        Plan::AdoptExisting(_) | Plan::AdoptUnmanaged(_) => None,
        Plan::RestoreFromHibernate(_) | Plan::CloneFromDir(_) | Plan::Fork(_) | Plan::Clone(_) => Some(BootPath::Clone),
        Plan::Run(_) => Some(BootPath::Run),
    }
}

/// A translation decision and the path it was asked for.
pub(in crate::provider) struct Decided {
    pub path: BootPath,
    pub decision: translation::Decision,
}

/// The translation policy's facts for the pod booting by `path`: nothing the bring-up step
/// gathers or decides but the path.
pub(super) fn translation_facts(ctx: &Ctx<'_>, path: BootPath) -> translation::Facts {
    translation::Facts {
        pod: ctx.facts.clone(),
        spec: ctx.spec.clone(),
        path,
        resources: first_container_resources(ctx.pod),
    }
}

async fn adopt_existing(p: &CocoonProvider, ctx: &Ctx<'_>, existing: Option<VmRecord>) -> Result<BroughtUp, Failure> {
    let vm = existing.ok_or_else(|| {
        Failure::transient(
            EventReason::CreateBringUpFailed,
            format!("bring-up policy adopts vm {} but none exists here", ctx.spec.vm_name),
        )
    })?;
    Ok(BroughtUp {
        vm,
        restoring: false,
        adopted: true,
        finish: adopted_finish(p, ctx.pod, &ctx.spec).await,
    })
}

/// An unmanaged VM the pod names by id and address: nothing to ask cocoon.
fn adopt_unmanaged(spec: &VmSpec, adoption: &UnmanagedAdoption) -> BroughtUp {
    let mut vm = VmRecord {
        id: adoption.vm_id.clone(),
        state: VmState::Running,
        ..Default::default()
    };
    vm.config.name = spec.vm_name.clone();
    vm.network_configs = vec![crate::runtime::parse::Nic {
        network: Some(crate::runtime::parse::NicNetwork {
            ip: adoption.ip.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }];
    BroughtUp {
        vm,
        restoring: false,
        adopted: true,
        finish: Finish::ReadyNow,
    }
}

async fn restore_from_hibernate(
    p: &CocoonProvider,
    ctx: &Ctx<'_>,
    restore_plan: RestorePlan,
    decided: Option<Decided>,
) -> Result<BroughtUp, Failure> {
    let vm_name = ctx.spec.vm_name.as_str();
    if restore_plan.derived {
        p.ports.events.record(
            ctx.pod,
            EventType::Warning,
            EventReason::HibernateSnapshotExists,
            format!("vm {vm_name} owns a hibernate snapshot: restoring it instead of booting fresh"),
        );
    }
    let (vm, label) = restore(p, ctx, &restore_plan.options, decided).await?;
    tracing::info!(pod = %ctx.facts.key(), vm = %vm_name, source = %label, "restored from hibernate");
    Ok(BroughtUp {
        vm,
        restoring: true,
        adopted: false,
        finish: super::restore_finish(&ctx.spec),
    })
}

async fn clone_from_dir(
    p: &CocoonProvider,
    ctx: &Ctx<'_>,
    plan: CloneFromDirPlan,
    decided: Option<Decided>,
) -> Result<BroughtUp, Failure> {
    let CloneFromDirPlan { options, dir } = plan;
    // Host invariant, whatever the policy chose: only a directory the node exports from.
    let dir = p
        .cfg
        .clone_roots
        .admit(&dir)
        .map_err(|m| Failure::permanent(EventReason::InvalidVmSpec, m))?
        .display()
        .to_string();
    drop_own_fork(p, &options).await;
    let cpu = translate(p, ctx, BootPath::Clone, decided).await?.0;
    let spec = clone_spec(&options, CloneSource::Dir(dir.clone()), true, cpu)?;
    let result = p.ports.runtime.clone_vm(&spec).await;
    ProviderMetrics::count(&p.metrics.clone_from_dir, result.is_ok());
    let vm = result.map_err(|e| {
        Failure::transient(
            EventReason::CloneFailed,
            format!("clone vm {} --from-dir {dir}: {e}", ctx.spec.vm_name),
        )
    })?;
    Ok(fresh(vm, BootOrigin::CloneFromDir, String::new()))
}

async fn fork(
    p: &CocoonProvider,
    ctx: &Ctx<'_>,
    plan: ForkPlan,
    decided: Option<Decided>,
) -> Result<BroughtUp, Failure> {
    let ForkPlan {
        options,
        source_vm,
        fork_snapshot,
    } = plan;
    drop_own_fork(p, &options).await;
    ensure_fork_snapshot(p, &source_vm, &fork_snapshot).await?;
    let cpu = translate(p, ctx, BootPath::Clone, decided).await?.0;
    let spec = clone_spec(&options, CloneSource::Snapshot(fork_snapshot.clone()), false, cpu)?;
    let vm = p.ports.runtime.clone_vm(&spec).await.map_err(|e| {
        Failure::transient(
            EventReason::CloneFailed,
            format!("fork vm {} from {fork_snapshot}: {e}", ctx.spec.vm_name),
        )
    })?;
    Ok(fresh(vm, BootOrigin::Fork, String::new()))
}

/// `known`: the snapshot record the gather step read moments ago, used when it is the one the
/// plan clones (one `snapshot inspect` fewer on a warm node).
async fn clone(
    p: &CocoonProvider,
    ctx: &Ctx<'_>,
    plan: ClonePlan,
    known: Option<SnapshotRecord>,
    decided: Option<Decided>,
) -> Result<BroughtUp, Failure> {
    let ClonePlan {
        options,
        local_snapshot,
        repository,
        tag,
        expected_backend,
    } = plan;
    drop_own_fork(p, &options).await;
    let snapshot = match known.filter(|s| s.name == local_snapshot) {
        Some(snapshot) => snapshot,
        None => ensure_snapshot(p, &local_snapshot, &repository, &tag).await?,
    };
    plan::assert_backend(&local_snapshot, &snapshot.hypervisor, &expected_backend)
        .map_err(|m| Failure::permanent(EventReason::SnapshotBackendMismatch, m))?;
    ensure_base_image(p, &snapshot).await?;
    let cpu = translate(p, ctx, BootPath::Clone, decided).await?.0;
    let pull = !snapshot.image.is_empty();
    let spec = clone_spec(&options, CloneSource::Snapshot(local_snapshot.clone()), pull, cpu)?;
    let vm = p.ports.runtime.clone_vm(&spec).await.map_err(|e| {
        Failure::transient(
            EventReason::CloneFailed,
            format!("clone vm {} from snapshot {local_snapshot}: {e}", ctx.spec.vm_name),
        )
    })?;
    Ok(fresh(vm, BootOrigin::Clone, snapshot.image.clone()))
}

async fn run(p: &CocoonProvider, ctx: &Ctx<'_>, plan: RunPlan, decided: Option<Decided>) -> Result<BroughtUp, Failure> {
    let RunPlan {
        vm_name: name,
        image,
        force_pull,
        network,
        backend,
        windows,
        no_direct_io,
    } = plan;
    let backend = plan::backend(&backend).map_err(|m| Failure::permanent(EventReason::CreateBringUpFailed, m))?;
    drop_fork_of(p, &name).await;
    let local_image = ensure_run_image(p, &image, force_pull).await?;
    let (cpu, guest) = translate(p, ctx, BootPath::Run, decided).await?;
    let guest = guest.unwrap_or(GuestResources {
        vcpus: None,
        memory_bytes: None,
        storage_bytes: None,
    });
    let run = RunSpec {
        name: Some(name.clone()),
        cpu: guest.vcpus,
        cpu_policy: cpu,
        memory: guest.memory_bytes.map(|b| b.to_string()),
        storage: guest.storage_bytes.map(|b| b.to_string()),
        nics: None,
        network: (!network.is_empty()).then_some(network),
        windows,
        backend,
        no_direct_io,
        image: local_image,
    };
    let vm =
        p.ports.runtime.run(&run).await.map_err(|e| {
            Failure::transient(EventReason::RunFailed, format!("run vm {name} from image {image}: {e}"))
        })?;
    // The guest-fixup policy is asked after a run too: a Windows guest's static addresses are set
    // at its console.
    Ok(BroughtUp {
        vm,
        restoring: false,
        adopted: false,
        finish: Finish::Fixup {
            origin: BootOrigin::Run,
            source_image: image,
        },
    })
}

/// A fresh clone: the guest-fixup policy decides what runs in it.
fn fresh(vm: VmRecord, origin: BootOrigin, source_image: String) -> BroughtUp {
    BroughtUp {
        vm,
        restoring: false,
        adopted: false,
        finish: Finish::Fixup { origin, source_image },
    }
}

/// The clone verb's spec for a fresh clone (one NIC per the snapshot's; a restore adds its own).
fn clone_spec(
    options: &CloneOptions,
    source: CloneSource,
    pull: bool,
    cpu: CpuPolicy,
) -> Result<crate::runtime::CloneSpec, Failure> {
    plan::clone_spec(options, source, pull, cpu, None)
        .map_err(|m| Failure::permanent(EventReason::CreateBringUpFailed, m))
}

/// What an adopted VM still needs, from the markers its pod carries (the owed-work rule a restart
/// uses: a fixup owed runs, a finished one waits for the lease, a Windows clone is classified by
/// its hibernate evidence; otherwise Ready at once).
pub(in crate::provider) async fn adopted_finish(p: &CocoonProvider, pod: &Pod, spec: &VmSpec) -> Finish {
    // The owed-work rule reads the pod's own annotations, as a restart does.
    match reconcile::owed_for(pod, &crate::model::vm_spec::of_pod(pod), true) {
        OwedOp::PostClone => Finish::resumed_fixup(),
        OwedOp::ReadyWait => Finish::resumed_lease_wait(spec),
        OwedOp::ClassifyDropNic => match hibernate_evidence(p, &spec.vm_name).await {
            HibernateEvidence::Found(_) => Finish::LeaseWait,
            HibernateEvidence::None => Finish::resumed_fixup(),
            // Whether it was restored cannot be told: a fresh clone's network reset would
            // disrupt a restored guest, while a lease wait is safe for both (a fresh clone that
            // needed the reset fails the wait, on the pod, instead).
            HibernateEvidence::Unavailable(error) => {
                tracing::warn!(vm = %spec.vm_name, %error, "adopting a VM whose hibernate evidence cannot be read: no fresh-clone fixup, waiting for its lease");
                Finish::LeaseWait
            }
            HibernateEvidence::NotChecked => Finish::LeaseWait,
        },
        OwedOp::None | OwedOp::Hibernate | OwedOp::FinishHibernate => Finish::ReadyNow,
    }
}

/// The translation policy: cgroup flags (every path) and guest resources (run path). Its answer
/// for `path` when it was `decided` already (in the bring-up decision's hop), else asked now.
pub(in crate::provider) async fn translate(
    p: &CocoonProvider,
    ctx: &Ctx<'_>,
    path: BootPath,
    decided: Option<Decided>,
) -> Result<(CpuPolicy, Option<GuestResources>), Failure> {
    let d = match decided {
        Some(decided) if decided.path == path => decided.decision,
        _ => {
            let facts = translation_facts(ctx, path);
            p.decide(move |pol| pol.decide::<ResourceTranslation>(&facts))
                .await
                .map_err(|e| Failure::transient(EventReason::PolicyUnavailable, e.to_string()))?
        }
    };
    match d.outcome {
        translation::Outcome::Translated(t) => Ok((plan::cpu_policy(&t.cpu), t.guest)),
        translation::Outcome::Refuse(refusal) => Err(Failure::refused(refusal, d.message)),
    }
}

/// Per-lineage invalidation: every fresh bring-up drops `fork-<vm>` first.
async fn drop_own_fork(p: &CocoonProvider, options: &CloneOptions) {
    if options.drop_own_fork_snapshot {
        drop_fork_of(p, &options.vm_name).await;
    }
}

/// Skipped when the daemon knows there is none: fork snapshots are made only by this daemon
/// (`ensure_fork_snapshot`, under a name of its own convention), so its own calls and the last
/// full list know them all. A wrong answer here (one made behind its back) would let a fork of
/// this VM start from its previous guest, never lose a guest's state.
async fn drop_fork_of(p: &CocoonProvider, vm: &str) {
    let name = plan::fork_snapshot_name(vm);
    if p.known.snapshot(&name) == SnapshotFact::Absent {
        return;
    }
    if let Err(error) = p.ports.runtime.snapshot_remove_if_exists(&name).await {
        tracing::warn!(snapshot = %name, %error, "could not drop the stale fork snapshot");
    }
}
