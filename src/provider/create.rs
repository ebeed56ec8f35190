//! CreatePod (lifecycle document; behaviour spec §3.2, §4b): decode, admit, claim, adopt or
//! gather evidence, ask the bring-up policy, execute its plan, write the runtime annotations,
//! then finish the boot (probe; guest fixup and lease wait in the background; Ready only when
//! the probe and the lifecycle agree). A failure boots no VM, leaves a Warning Event and
//! lifecycle `failed` with the message, and drops the provisional row so the retry is a fresh
//! create. A pod that asks to stay hibernated boots nothing.

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::ensure::{ensure_base_image, ensure_fork_snapshot, ensure_run_image, ensure_snapshot};
use super::failure::Failure;
use super::guest::Finish;
use super::invariants;
use super::lifecycle::LifecycleState;
use super::metrics::ProviderMetrics;
use super::plan;
use super::reconcile::OwedOp;
use super::wake::restore;
use crate::kubelet::{Next, ProviderError};
use crate::model::{PodFacts, RuntimeAnnotations, VmSpec, first_container_resources, pod_facts, vm_spec};
use crate::policy::contract::bring_up::{self, CloneOptions, ClonePlan, ForkPlan, HibernateEvidence, Outcome, Plan};
use crate::policy::contract::cpu_class_admission::AdmissionContext;
use crate::policy::contract::guest_fixup::BootOrigin;
use crate::policy::contract::resource_translation::{self as translation, BootPath, GuestResources};
use crate::policy::contract::types::BootMode;
use crate::policy::slots::{BringUp, ResourceTranslation};
use crate::runtime::{CloneSource, RunSpec, VmRecord, VmState};

/// The pod a bring-up is for.
pub(super) struct Ctx<'a> {
    pub pod: &'a Pod,
    pub facts: PodFacts,
    pub spec: VmSpec,
}

/// A VM that is up, and what it still needs.
struct BroughtUp {
    vm: VmRecord,
    /// Restored from hibernate (a wake through CreatePod).
    restoring: bool,
    /// An existing VM was adopted (nothing booted).
    adopted: bool,
    finish: Finish,
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

pub(super) async fn create(p: &CocoonProvider, pod: &Pod) -> Result<Next, ProviderError> {
    let facts = pod_facts(pod);
    let key = facts.key();
    let uid = facts.uid.clone();

    // 1. The VM spec.
    let spec = match vm_spec::require_vm_name(vm_spec::of_pod(pod)) {
        Ok(spec) => spec,
        Err(e) => {
            p.metrics.lifecycle("create", "skipped", "missing_vmname");
            let message = format!("pod {key} missing vm.cocoonstack.io/name annotation ({e})");
            p.state.track(&key, pod, "");
            p.fail_op(pod, &key, "MissingVMName", "create", &message).await;
            p.state.untrack(&key, &uid);
            return Err(ProviderError::Rejected {
                reason: "MissingVMName".into(),
                message,
            });
        }
    };

    // 2. CPU-class admission.
    if let Err(f) = p.admission(&facts, AdmissionContext::Create).await? {
        p.metrics.lifecycle("create", "failed", "snapshot_cpu_class_mismatch");
        p.state.track(&key, pod, &spec.vm_name);
        p.fail_op(pod, &key, f.reason, "create", &f.message).await;
        p.state.untrack(&key, &uid);
        return Err(f.to_provider_error());
    }
    if p.state.resume_claimed(&key) {
        return Err(ProviderError::Transient(format!(
            "resumed operation still in flight for {key}"
        )));
    }

    // A pod the startup reconcile already tracks with its VM: finish what it is owed.
    if let Some(vm) = p.state.tracked_as(&key, &uid).and_then(|t| t.vm) {
        if super::macos::is_macos(&spec) {
            return super::macos::adopt_tracked(p, pod, &key, vm).await;
        }
        return adopt_tracked(p, pod, &key, &spec, vm).await;
    }

    // 3. Claim the incarnation.
    p.state.track(&key, pod, &spec.vm_name);
    // 1. (lifecycle document) os=macos pods branch to the self-contained cocoon-macos path.
    if super::macos::is_macos(&spec) {
        return super::macos::create(p, pod, &key, &spec, facts).await;
    }
    if spec.managed && spec.hibernate {
        return stay_hibernated(p, pod, &key, &spec).await.map(|()| Next::Done);
    }
    p.set_lifecycle(pod, &key, LifecycleState::Creating, "").await;

    let ctx = Ctx { pod, facts, spec };
    let started = Instant::now();
    let up = match bring_up(p, &ctx).await {
        Ok(v) => v,
        Err((restoring, f)) => return fail_create(p, &key, pod, restoring, f).await,
    };
    let spec = &ctx.spec;
    let mode = if up.restoring || spec.mode != BootMode::Run {
        "clone"
    } else {
        "run"
    };
    if !up.adopted {
        p.metrics
            .vm_boot_duration
            .with_label_values(&[mode, invariants::backend_label(&spec.backend)])
            .observe(started.elapsed().as_secs_f64());
    }

    // 5.–6. IP and runtime annotations, before any guest work.
    let vm = up.vm;
    let ip = p.resolve_ip(&vm);
    if !p.state.set_vm(&key, &uid, vm.clone()) {
        tracing::info!(pod = %key, "create finished for a superseded incarnation");
        return Ok(Next::Done);
    }
    if spec.managed {
        p.write_runtime(pod, &key, &vm.id, &ip).await;
    }
    tracing::info!(pod = %key, vm = %spec.vm_name, id = %vm.id, %ip, restoring = up.restoring, "vm up");
    // 7. The probe, then Ready now or after the guest work.
    p.finish_boot(pod, &key, &vm, up.finish, up.restoring).await;
    p.metrics
        .lifecycle("create", "ok", if up.adopted { "adopted" } else { "" });
    Ok(Next::Done)
}

pub(super) async fn fail_create<T>(
    p: &CocoonProvider,
    key: &str,
    pod: &Pod,
    restoring: bool,
    f: Failure,
) -> Result<T, ProviderError> {
    p.metrics.wake_ended(restoring, false);
    p.fail_op(pod, key, f.reason, "create", &f.message).await;
    p.state.untrack(key, &super::table::uid_of(pod));
    p.notify(key);
    Err(f.to_provider_error())
}

/// CreatePod of a pod the startup reconcile adopted: hibernate it if that is asked, leave guest
/// work that is already running alone, else finish the boot the way the restart owes it.
async fn adopt_tracked(
    p: &CocoonProvider,
    pod: &Pod,
    key: &str,
    spec: &VmSpec,
    vm: VmRecord,
) -> Result<Next, ProviderError> {
    p.state.refresh(key, pod);
    let mut next = Next::Done;
    if spec.managed && spec.hibernate {
        next = p.hibernate_or_owe(pod, key).await;
    } else if p.state.guest_work_running(key) {
        p.notify(key);
    } else {
        let finish = if spec.managed {
            adopted_finish(p, pod, spec).await
        } else {
            Finish::ReadyNow
        };
        p.finish_boot(pod, key, &vm, finish, false).await;
    }
    p.metrics.lifecycle("create", "ok", "adopted");
    Ok(next)
}

/// What an adopted VM still needs, from the markers its pod carries (behaviour spec §4h).
async fn adopted_finish(p: &CocoonProvider, pod: &Pod, spec: &VmSpec) -> Finish {
    match super::reconcile::owed_for(pod, true) {
        OwedOp::PostClone => Finish::resumed_fixup(),
        OwedOp::ReadyWait => Finish::LeaseWait,
        OwedOp::ClassifyDropNic => match hibernate_evidence(p, &spec.vm_name).await {
            HibernateEvidence::Found(_) => Finish::LeaseWait,
            _ => Finish::resumed_fixup(),
        },
        OwedOp::None | OwedOp::Hibernate | OwedOp::FinishHibernate => Finish::ReadyNow,
    }
}

/// CreatePod of a pod asking to be hibernated (`vm.cocoonstack.io/hibernate: "true"`): nothing
/// boots. With a hibernate snapshot it reports `hibernated`; without one there is nothing to
/// resume and it says so; when the evidence cannot be read the create retries.
async fn stay_hibernated(p: &CocoonProvider, pod: &Pod, key: &str, spec: &VmSpec) -> Result<(), ProviderError> {
    let uid = super::table::uid_of(pod);
    let vm = spec.vm_name.as_str();
    if p.state
        .intent(key)
        .is_some_and(|i| i.uid == uid && i.state == LifecycleState::Hibernated)
    {
        p.state.mark_hibernated(key, &uid);
        p.notify(key);
        return Ok(());
    }
    match hibernate_evidence(p, vm).await {
        HibernateEvidence::Found(_) => {
            p.state.mark_hibernated(key, &uid);
            p.set_lifecycle(pod, key, LifecycleState::Hibernated, "").await;
            p.notify(key);
            Ok(())
        }
        HibernateEvidence::Unavailable(error) => {
            let f = Failure::transient(
                "HibernateEvidenceUnavailable",
                format!("hibernate evidence for {vm}: {error}; retrying"),
            );
            fail_create(p, key, pod, false, f).await
        }
        HibernateEvidence::None | HibernateEvidence::NotChecked => {
            let message = format!(
                "vm {vm}: hibernate requested but no VM runs here and no hibernate snapshot exists, so there is nothing to resume; clear vm.cocoonstack.io/hibernate to boot it"
            );
            p.fail_op(pod, key, "HibernateSnapshotMissing", "create", &message)
                .await;
            p.notify(key);
            Ok(())
        }
    }
}

/// The bring-up policy's facts: the pod as decoded, what this node found (a VM of that name,
/// hibernate evidence, local snapshots), the node's settings, and the runtime values the pod
/// carries preassigned. One builder for the Linux and the macOS paths.
pub(super) fn bring_up_facts(
    p: &CocoonProvider,
    pod: &Pod,
    facts: &PodFacts,
    spec: &VmSpec,
    vm_exists_locally: bool,
    evidence: HibernateEvidence,
    local_snapshots: Vec<bring_up::LocalSnapshot>,
) -> bring_up::Facts {
    let preassigned = RuntimeAnnotations::of_pod(pod);
    bring_up::Facts {
        pod: facts.clone(),
        spec: spec.clone(),
        vm_exists_locally,
        evidence,
        registry_configured: p.ports.registry.is_some(),
        local_snapshots,
        node_restore_mode: p.cfg.restore_mode,
        preassigned_vm_id: preassigned.vm_id,
        preassigned_ip: preassigned.ip,
        preassigned_vnc_port: preassigned.vnc_port,
    }
}

/// Steps 2–3 of the lifecycle document: adopt, or gather facts, decide and execute.
async fn bring_up(p: &CocoonProvider, ctx: &Ctx<'_>) -> Result<BroughtUp, (bool, Failure)> {
    let spec = &ctx.spec;
    let vm_name = spec.vm_name.as_str();

    // Adoption: the table first, then cocoon itself (a VM that survived a restart before the
    // reconcile indexed it must never be booted twice).
    let existing = match p.state.vm_by_name(vm_name) {
        Some(vm) => Some(vm),
        None if spec.managed => match p.ports.runtime.inspect(vm_name).await {
            Ok(vm) => Some(vm),
            Err(e) if e.is_not_found() => None,
            Err(e) => {
                return Err((
                    false,
                    Failure::transient(
                        "VMInspectFailed",
                        format!("checking whether vm {vm_name} already exists: {e}"),
                    ),
                ));
            }
        },
        None => None,
    };

    // A record still `creating` (a bring-up killed mid-way) is settled before anything else.
    let existing = match existing {
        Some(vm) if vm.state == VmState::Creating => settle_stale(p, vm).await.map_err(|f| (false, f))?,
        other => other,
    };

    let evidence = if existing.is_some() || !spec.managed {
        HibernateEvidence::NotChecked
    } else {
        hibernate_evidence(p, vm_name).await
    };
    let local_snapshots = if spec.managed && existing.is_none() && !spec.image.is_empty() && spec.mode != BootMode::Run
    {
        let (repo, tag) = plan::parse_ref(&spec.image);
        match p
            .ports
            .runtime
            .snapshot_inspect(&plan::local_snapshot_name(repo, tag))
            .await
        {
            Ok(s) => vec![plan::local_snapshot_fact(&s)],
            Err(_) => Vec::new(),
        }
    } else {
        Vec::new()
    };
    let facts = bring_up_facts(
        p,
        ctx.pod,
        &ctx.facts,
        spec,
        existing.is_some(),
        evidence,
        local_snapshots,
    );
    let decision = p
        .decide(move |pol| pol.decide::<BringUp>(&facts))
        .await
        .map_err(|e| (false, Failure::transient("PolicyUnavailable", e.to_string())))?;
    if let Some(verdict) = plan::evidence_verdict(&decision.outcome) {
        p.metrics.hibernate_evidence.with_label_values(&[verdict]).inc();
    }
    tracing::info!(pod = %ctx.facts.key(), reason = %decision.reason, message = %decision.message, "bring-up decision");
    let plan = match decision.outcome {
        Outcome::Refuse(refusal) => return Err((false, Failure::refused(refusal, decision.message))),
        Outcome::Proceed(plan) => plan,
    };
    let clone_spec = |options: &CloneOptions, source, pull, cpu, nics| {
        plan::clone_spec(options, source, pull, cpu, nics)
            .map_err(|m| (false, Failure::permanent("CreateBringUpFailed", m)))
    };

    match plan {
        Plan::AdoptExisting(_) => {
            let vm = existing.ok_or_else(|| {
                (
                    false,
                    Failure::transient(
                        "CreateBringUpFailed",
                        format!("bring-up policy adopts vm {vm_name} but none exists here"),
                    ),
                )
            })?;
            let finish = adopted_finish(p, ctx.pod, spec).await;
            Ok(BroughtUp {
                vm,
                restoring: false,
                adopted: true,
                finish,
            })
        }
        Plan::AdoptUnmanaged(adoption) => Ok(BroughtUp {
            vm: synthesized(vm_name, &adoption.vm_id, &adoption.ip),
            restoring: false,
            adopted: true,
            finish: Finish::ReadyNow,
        }),
        Plan::RestoreFromHibernate(restore_plan) => {
            if restore_plan.derived {
                p.ports.events.record(
                    ctx.pod,
                    true,
                    "HibernateSnapshotExists",
                    format!("vm {vm_name} owns a hibernate snapshot: restoring it instead of booting fresh"),
                );
            }
            let (vm, label) = restore(p, ctx, &restore_plan.options).await.map_err(|f| (true, f))?;
            tracing::info!(pod = %ctx.facts.key(), vm = %vm_name, source = %label, "restored from hibernate");
            Ok(BroughtUp {
                vm,
                restoring: true,
                adopted: false,
                finish: super::wake::restore_finish(spec),
            })
        }
        Plan::CloneFromDir(bring_up::CloneFromDirPlan { options, dir }) => {
            drop_own_fork(p, &options).await;
            let cpu = translate(p, ctx, BootPath::Clone).await.map_err(|f| (false, f))?.0;
            let spec = clone_spec(&options, CloneSource::Dir(dir.clone()), true, cpu, None)?;
            let result = p.ports.runtime.clone_vm(&spec).await;
            ProviderMetrics::count(&p.metrics.clone_from_dir, result.is_ok());
            let vm = result.map_err(|e| {
                (
                    false,
                    Failure::transient("CloneFailed", format!("clone vm {vm_name} --from-dir {dir}: {e}")),
                )
            })?;
            Ok(fresh(vm, BootOrigin::CloneFromDir, String::new()))
        }
        Plan::Fork(ForkPlan {
            options,
            source_vm,
            fork_snapshot,
        }) => {
            drop_own_fork(p, &options).await;
            ensure_fork_snapshot(p, &source_vm, &fork_snapshot)
                .await
                .map_err(|f| (false, f))?;
            let cpu = translate(p, ctx, BootPath::Clone).await.map_err(|f| (false, f))?.0;
            let spec = clone_spec(&options, CloneSource::Snapshot(fork_snapshot.clone()), false, cpu, None)?;
            let vm = p.ports.runtime.clone_vm(&spec).await.map_err(|e| {
                (
                    false,
                    Failure::transient("CloneFailed", format!("fork vm {vm_name} from {fork_snapshot}: {e}")),
                )
            })?;
            Ok(fresh(vm, BootOrigin::Fork, String::new()))
        }
        Plan::Clone(ClonePlan {
            options,
            local_snapshot,
            repository,
            tag,
            expected_backend,
        }) => {
            drop_own_fork(p, &options).await;
            let snapshot = ensure_snapshot(p, &local_snapshot, &repository, &tag)
                .await
                .map_err(|f| (false, f))?;
            plan::assert_backend(&local_snapshot, &snapshot.hypervisor, &expected_backend)
                .map_err(|m| (false, Failure::permanent("SnapshotBackendMismatch", m)))?;
            ensure_base_image(p, &snapshot).await.map_err(|f| (false, f))?;
            let cpu = translate(p, ctx, BootPath::Clone).await.map_err(|f| (false, f))?.0;
            let pull = !snapshot.image.is_empty();
            let spec = clone_spec(&options, CloneSource::Snapshot(local_snapshot.clone()), pull, cpu, None)?;
            let vm = p.ports.runtime.clone_vm(&spec).await.map_err(|e| {
                (
                    false,
                    Failure::transient(
                        "CloneFailed",
                        format!("clone vm {vm_name} from snapshot {local_snapshot}: {e}"),
                    ),
                )
            })?;
            Ok(fresh(vm, BootOrigin::Clone, snapshot.image.clone()))
        }
        Plan::Run(bring_up::RunPlan {
            vm_name: name,
            image,
            force_pull,
            network,
            backend,
            windows,
            no_direct_io,
        }) => {
            let backend = plan::backend(&backend).map_err(|m| (false, Failure::permanent("CreateBringUpFailed", m)))?;
            drop_fork_of(p, &name).await;
            let local_image = ensure_run_image(p, &image, force_pull).await.map_err(|f| (false, f))?;
            let (cpu, guest) = translate(p, ctx, BootPath::Run).await.map_err(|f| (false, f))?;
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
            let vm = p.ports.runtime.run(&run).await.map_err(|e| {
                (
                    false,
                    Failure::transient("RunFailed", format!("run vm {name} from image {image}: {e}")),
                )
            })?;
            Ok(BroughtUp {
                vm,
                restoring: false,
                adopted: false,
                finish: Finish::ReadyNow,
            })
        }
    }
}

/// Settles a `creating` record of this pod's VM name: collected or gone ⇒ none; finished
/// (running) ⇒ adopt; terminal (never finished, so no state) ⇒ removed; otherwise retry later.
async fn settle_stale(p: &CocoonProvider, vm: VmRecord) -> Result<Option<VmRecord>, Failure> {
    use crate::runtime::StaleCreateOutcome as O;
    let outcome = p.ports.runtime.reconcile_stale_create(&vm.id).await;
    tracing::info!(vm = %vm.id, outcome = ?outcome, "settling a stale create of this pod's vm");
    match outcome {
        Ok(O::Collected | O::NotFound) => Ok(None),
        Ok(O::NotCreating) => match p.ports.runtime.inspect(&vm.id).await {
            Ok(current) if current.state == VmState::Running => Ok(Some(current)),
            Ok(current) if matches!(current.state, VmState::Creating | VmState::Created) => Err(Failure::transient(
                "VMStillCreating",
                format!(
                    "vm {} ({}) is still being created; retrying",
                    current.name(),
                    current.id
                ),
            )),
            Ok(current) => {
                p.ports.runtime.remove(&current.id).await.map_err(|e| {
                    Failure::transient(
                        "StaleCreateFailed",
                        format!("remove the dead record {} of an interrupted create: {e}", current.id),
                    )
                })?;
                Ok(None)
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(Failure::transient(
                "StaleCreateFailed",
                format!("inspect interrupted create {}: {e}", vm.id),
            )),
        },
        Ok(other) => Err(Failure::transient(
            "VMStillCreating",
            format!(
                "vm {} ({}) is still being created ({other:?}); retrying",
                vm.name(),
                vm.id
            ),
        )),
        Err(e) => Err(Failure::transient(
            "StaleCreateFailed",
            format!("reconcile-stale-create {}: {e}", vm.id),
        )),
    }
}

fn synthesized(name: &str, id: &str, ip: &str) -> VmRecord {
    let mut vm = VmRecord {
        id: id.into(),
        state: VmState::Running,
        ..Default::default()
    };
    vm.config.name = name.into();
    vm.network_configs = vec![crate::runtime::parse::Nic {
        network: Some(crate::runtime::parse::NicNetwork {
            ip: ip.into(),
            ..Default::default()
        }),
        ..Default::default()
    }];
    vm
}

/// Hibernate evidence: the registry's `<vm>:hibernate` tag, or a local snapshot when registry-less.
pub(super) async fn hibernate_evidence(p: &CocoonProvider, vm: &str) -> HibernateEvidence {
    match &p.ports.registry {
        Some(registry) => {
            let lookup = registry.manifest(vm, plan::HIBERNATE_SNAPSHOT_TAG).await;
            plan::registry_evidence(
                lookup
                    .as_ref()
                    .map(|m| m.as_ref().map(|a| &a.annotations))
                    .map_err(|e| e.to_string()),
            )
        }
        None => plan::local_evidence(&p.ports.runtime.snapshot_inspect(vm).await),
    }
}

/// The translation policy: cgroup flags (every path) and guest resources (run path).
pub(super) async fn translate(
    p: &CocoonProvider,
    ctx: &Ctx<'_>,
    path: BootPath,
) -> Result<(crate::runtime::CpuPolicy, Option<GuestResources>), Failure> {
    let facts = translation::Facts {
        pod: ctx.facts.clone(),
        spec: ctx.spec.clone(),
        path,
        resources: first_container_resources(ctx.pod),
    };
    let d = p
        .decide(move |pol| pol.decide::<ResourceTranslation>(&facts))
        .await
        .map_err(|e| Failure::transient("PolicyUnavailable", e.to_string()))?;
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

pub(super) async fn drop_fork_of(p: &CocoonProvider, vm: &str) {
    let name = plan::fork_snapshot_name(vm);
    if let Err(error) = p.ports.runtime.snapshot_remove_if_exists(&name).await {
        tracing::warn!(snapshot = %name, %error, "could not drop the stale fork snapshot");
    }
}
