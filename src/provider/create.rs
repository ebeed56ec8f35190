//! CreatePod (lifecycle document; behaviour spec §3.2, §4b): decode, admit, claim, adopt or
//! gather evidence, ask the bring-up policy, execute its plan, resolve the IP, write the runtime
//! annotations, publish Ready. A failure boots no VM, leaves a Warning Event and lifecycle
//! `failed` with the message, and drops the provisional row so the retry is a fresh create.

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;

use super::lifecycle::LifecycleState;
use super::plan::{self, ArtifactKind, BaseImage};
use super::ports::CloudImageResult;
use super::CocoonProvider;
use crate::kubelet::ProviderError;
use crate::model::{first_container_resources, PodFacts, VmSpec};
use crate::policy::decision::{BringUpOutcome, CloneOptions, GuestResources, Plan, TranslationOutcome};
use crate::policy::facts::{AdmissionContext, BootPath, BringUpFacts, ContainerResources, HibernateEvidence, PreassignedRuntime, TranslationFacts};
use crate::runtime::{CloneSource, RunSpec, SnapshotRecord, VmRecord, VmState};

/// Why a create failed: Event reason, message, and whether a retry may succeed.
#[derive(Debug)]
pub(super) struct Failure {
    pub reason: &'static str,
    pub message: String,
    pub transient: bool,
}

impl Failure {
    fn transient(reason: &'static str, message: impl Into<String>) -> Self {
        Self { reason, message: message.into(), transient: true }
    }
    fn permanent(reason: &'static str, message: impl Into<String>) -> Self {
        Self { reason, message: message.into(), transient: false }
    }
}

fn to_provider_error(f: &Failure) -> ProviderError {
    if f.transient {
        ProviderError::Transient(format!("{}: {}", f.reason, f.message))
    } else {
        ProviderError::Rejected { reason: f.reason.into(), message: f.message.clone() }
    }
}

struct Ctx<'a> {
    pod: &'a Pod,
    facts: PodFacts,
    spec: VmSpec,
}

pub(super) async fn create(p: &CocoonProvider, pod: &Pod) -> Result<(), ProviderError> {
    let facts = PodFacts::from_pod(pod);
    let key = facts.key();
    let uid = facts.uid.clone();

    // 1. The VM spec.
    let spec = match VmSpec::from_annotations(&facts.annotations) {
        Ok(spec) => spec,
        Err(e) => {
            p.metrics.lifecycle("create", "skipped", "missing_vmname");
            let message = format!("pod {key} missing vm.cocoonstack.io/name annotation ({e})");
            p.state.track(&key, pod, "");
            p.fail_op(pod, &key, "MissingVMName", "create", &message).await;
            p.state.untrack(&key, &uid);
            return Err(ProviderError::Rejected { reason: "MissingVMName".into(), message });
        }
    };

    // 2. CPU-class admission.
    if let Err((reason, message)) = p.admission(&facts, AdmissionContext::Create).await? {
        p.metrics.lifecycle("create", "failed", "snapshot_cpu_class_mismatch");
        p.state.track(&key, pod, &spec.vm_name);
        p.fail_op(pod, &key, "SnapshotCPUClassMismatch", "create", &message).await;
        p.state.untrack(&key, &uid);
        // A failing admission policy is retried; a real mismatch is final.
        return Err(if reason == crate::policy::decision::POLICY_FAILED {
            ProviderError::Transient(message)
        } else {
            ProviderError::Rejected { reason: "SnapshotCPUClassMismatch".into(), message }
        });
    }

    // 3. Claim the incarnation.
    p.state.track(&key, pod, &spec.vm_name);
    p.set_lifecycle(pod, &key, LifecycleState::Creating, "").await;

    if spec.managed && spec.os.trim().eq_ignore_ascii_case("macos") {
        let f = Failure::permanent("MacOSUnsupported", format!("vm {}: os=macos guests need the cocoon-macos path, which this build does not include", spec.vm_name));
        return fail_create(p, &key, pod, false, f).await;
    }

    let ctx = Ctx { pod, facts, spec };
    let started = Instant::now();
    let (vm, restoring, adopted) = match bring_up(p, &ctx).await {
        Ok(v) => v,
        Err((restoring, f)) => return fail_create(p, &key, pod, restoring, f).await,
    };
    let spec = &ctx.spec;
    let mode = if restoring || !spec.mode.eq_ignore_ascii_case("run") { "clone" } else { "run" };
    if !adopted {
        p.metrics.vm_boot_duration.with_label_values(&[mode, &spec.backend]).observe(started.elapsed().as_secs_f64());
    }
    if restoring {
        p.metrics.wake.with_label_values(&["ok"]).inc();
    }

    // 5.–6. IP and runtime annotations.
    let ip = if spec.managed { p.resolve_ip(&vm) } else { vm.primary_ip().unwrap_or_default().to_string() };
    if !p.state.set_vm(&key, &uid, vm.clone()) {
        tracing::info!(pod = %key, "create finished for a superseded incarnation");
        return Ok(());
    }
    if spec.managed {
        p.write_runtime(pod, &key, &vm.id, &ip).await;
    }
    tracing::info!(pod = %key, vm = %spec.vm_name, id = %vm.id, %ip, restoring, "vm up");
    p.publish_ready(pod, &key).await;
    p.metrics.lifecycle("create", "ok", if adopted { "adopted" } else { "" });
    Ok(())
}

async fn fail_create(p: &CocoonProvider, key: &str, pod: &Pod, restoring: bool, f: Failure) -> Result<(), ProviderError> {
    if restoring {
        p.metrics.wake.with_label_values(&["failed"]).inc();
    }
    p.fail_op(pod, key, f.reason, "create", &f.message).await;
    p.state.untrack(key, &super::state::uid_of(pod));
    p.notify(key);
    Err(to_provider_error(&f))
}

/// Steps 2–3 of the lifecycle document: adopt, or gather facts, decide and execute.
/// Returns the VM, whether it was a restore, and whether an existing VM was adopted.
async fn bring_up(p: &CocoonProvider, ctx: &Ctx<'_>) -> Result<(VmRecord, bool, bool), (bool, Failure)> {
    let spec = &ctx.spec;
    let vm_name = spec.vm_name.as_str();

    // Adoption: the table first, then cocoon itself (a VM that survived a restart before the
    // reconcile indexed it must never be booted twice).
    let existing = match p.state.vm_by_name(vm_name) {
        Some(vm) => Some(vm),
        None if spec.managed => match p.ports.runtime.inspect(vm_name).await {
            Ok(vm) => Some(vm),
            Err(e) if e.is_not_found() => None,
            Err(e) => return Err((false, Failure::transient("VMInspectFailed", format!("checking whether vm {vm_name} already exists: {e}")))),
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
    let local_snapshots = if spec.managed && existing.is_none() && !spec.image.is_empty() && !spec.mode.eq_ignore_ascii_case("run") {
        let (repo, tag) = plan::parse_ref(&spec.image);
        match p.ports.runtime.snapshot_inspect(&plan::local_snapshot_name(repo, tag)).await {
            Ok(s) => vec![plan::local_snapshot_fact(&s)],
            Err(_) => Vec::new(),
        }
    } else {
        Vec::new()
    };
    let facts = BringUpFacts {
        pod: ctx.facts.clone(),
        spec: spec.clone(),
        vm_exists_locally: existing.is_some(),
        evidence,
        registry_configured: p.ports.registry.is_some(),
        local_snapshots,
        node_restore_mode: p.cfg.restore_mode.clone(),
        preassigned: PreassignedRuntime::from_annotations(&ctx.facts.annotations),
    };
    let decision = p.decide(move |pol| pol.bring_up(facts)).await.map_err(|e| (false, Failure::transient("PolicyUnavailable", e.to_string())))?;
    if let Some(verdict) = plan::evidence_verdict(&decision.reason) {
        p.metrics.hibernate_evidence.with_label_values(&[verdict]).inc();
    }
    tracing::info!(pod = %ctx.facts.key(), reason = %decision.reason, message = %decision.message, fail_safe = ?decision.fail_safe, "bring-up decision");
    let plan = match decision.outcome {
        BringUpOutcome::Refuse => {
            let reason = match decision.reason.as_str() {
                "hibernate-evidence-unavailable" | "hibernate-evidence-not-checked" => "HibernateEvidenceUnavailable",
                "image-conflict" | "source-conflict" => "HibernateSnapshotConflict",
                "policy-failed" => "BringUpPolicyFailed",
                "backend-mismatch" => "SnapshotBackendMismatch",
                _ => "CreateBringUpFailed",
            };
            let f = Failure { reason, message: decision.message, transient: plan::refusal_is_transient(&decision.reason) };
            return Err((false, f));
        }
        BringUpOutcome::Proceed { plan } => plan,
    };

    match plan {
        Plan::AdoptExisting { .. } => {
            let vm = existing.ok_or_else(|| (false, Failure::transient("CreateBringUpFailed", format!("bring-up policy adopts vm {vm_name} but none exists here"))))?;
            Ok((vm, false, true))
        }
        Plan::AdoptUnmanaged { vm_id, ip, .. } => Ok((synthesized(vm_name, &vm_id, &ip), false, true)),
        Plan::RestoreFromHibernate { options, derived, fresh_nic } => {
            if derived {
                p.ports.events.record(
                    ctx.pod,
                    true,
                    "HibernateSnapshotExists",
                    format!("vm {vm_name} owns a hibernate snapshot: restoring it instead of booting fresh"),
                );
            }
            restore(p, ctx, &options, fresh_nic).await.map(|vm| (vm, true, false)).map_err(|f| (true, f))
        }
        Plan::CloneFromDir { options, dir } => {
            drop_own_fork(p, &options).await;
            let cpu = translate(p, ctx, BootPath::Clone).await?.0;
            let result = p.ports.runtime.clone_vm(&plan::clone_spec(&options, CloneSource::Dir(dir.clone()), true, cpu, None)).await;
            p.metrics.clone_from_dir.with_label_values(&[if result.is_ok() { "ok" } else { "failed" }]).inc();
            result.map(|vm| (vm, false, false)).map_err(|e| (false, Failure::transient("CloneFailed", format!("clone vm {vm_name} --from-dir {dir}: {e}"))))
        }
        Plan::Fork { options, source_vm, fork_snapshot } => {
            drop_own_fork(p, &options).await;
            ensure_fork_snapshot(p, &source_vm, &fork_snapshot).await.map_err(|f| (false, f))?;
            let cpu = translate(p, ctx, BootPath::Clone).await?.0;
            p.ports
                .runtime
                .clone_vm(&plan::clone_spec(&options, CloneSource::Snapshot(fork_snapshot.clone()), false, cpu, None))
                .await
                .map(|vm| (vm, false, false))
                .map_err(|e| (false, Failure::transient("CloneFailed", format!("fork vm {vm_name} from {fork_snapshot}: {e}"))))
        }
        Plan::Clone { options, local_snapshot, repository, tag, expected_backend } => {
            drop_own_fork(p, &options).await;
            let snapshot = ensure_snapshot(p, &local_snapshot, &repository, &tag).await.map_err(|f| (false, f))?;
            plan::assert_backend(&local_snapshot, &snapshot.hypervisor, &expected_backend)
                .map_err(|m| (false, Failure::permanent("SnapshotBackendMismatch", m)))?;
            ensure_base_image(p, &snapshot).await.map_err(|f| (false, f))?;
            let cpu = translate(p, ctx, BootPath::Clone).await?.0;
            let pull = !snapshot.image.is_empty();
            p.ports
                .runtime
                .clone_vm(&plan::clone_spec(&options, CloneSource::Snapshot(local_snapshot.clone()), pull, cpu, None))
                .await
                .map(|vm| (vm, false, false))
                .map_err(|e| (false, Failure::transient("CloneFailed", format!("clone vm {vm_name} from snapshot {local_snapshot}: {e}"))))
        }
        Plan::Run { vm_name: name, image, force_pull, network, backend, windows, no_direct_io } => {
            drop_fork_of(p, &name).await;
            let local_image = ensure_run_image(p, &image, force_pull).await.map_err(|f| (false, f))?;
            let (cpu, guest) = translate(p, ctx, BootPath::Run).await?;
            let guest = guest.unwrap_or(GuestResources { vcpus: None, memory_bytes: None, storage_bytes: None });
            let run = RunSpec {
                name: Some(name.clone()),
                cpu: guest.vcpus,
                cpu_policy: cpu,
                memory: guest.memory_bytes.map(|b| b.to_string()),
                storage: guest.storage_bytes.map(|b| b.to_string()),
                nics: None,
                network: (!network.is_empty()).then_some(network),
                windows,
                backend: plan::backend(&backend),
                no_direct_io,
                image: local_image,
            };
            p.ports
                .runtime
                .run(&run)
                .await
                .map(|vm| (vm, false, false))
                .map_err(|e| (false, Failure::transient("RunFailed", format!("run vm {name} from image {image}: {e}"))))
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
            Ok(current) if matches!(current.state, VmState::Creating | VmState::Created) => {
                Err(Failure::transient("VMStillCreating", format!("vm {} ({}) is still being created; retrying", current.name(), current.id)))
            }
            Ok(current) => {
                p.ports.runtime.remove(&current.id).await.map_err(|e| Failure::transient("StaleCreateFailed", format!("remove the dead record {} of an interrupted create: {e}", current.id)))?;
                Ok(None)
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(Failure::transient("StaleCreateFailed", format!("inspect interrupted create {}: {e}", vm.id))),
        },
        Ok(other) => Err(Failure::transient("VMStillCreating", format!("vm {} ({}) is still being created ({other:?}); retrying", vm.name(), vm.id))),
        Err(e) => Err(Failure::transient("StaleCreateFailed", format!("reconcile-stale-create {}: {e}", vm.id))),
    }
}

fn synthesized(name: &str, id: &str, ip: &str) -> VmRecord {
    let mut vm = VmRecord { id: id.into(), state: VmState::Running, ..Default::default() };
    vm.config.name = name.into();
    vm.network_configs = vec![crate::runtime::parse::Nic {
        network: Some(crate::runtime::parse::NicNetwork { ip: ip.into(), ..Default::default() }),
        ..Default::default()
    }];
    vm
}

/// Hibernate evidence: the registry's `<vm>:hibernate` tag, or a local snapshot when registry-less.
async fn hibernate_evidence(p: &CocoonProvider, vm: &str) -> HibernateEvidence {
    match &p.ports.registry {
        Some(registry) => {
            let lookup = registry.manifest(vm, plan::HIBERNATE_SNAPSHOT_TAG).await;
            plan::registry_evidence(lookup.as_ref().map(|m| m.as_ref().map(|a| &a.annotations)).map_err(|e| e.to_string()))
        }
        None => plan::local_evidence(&p.ports.runtime.snapshot_inspect(vm).await),
    }
}

/// The translation policy: cgroup flags (every path) and guest resources (run path).
async fn translate(p: &CocoonProvider, ctx: &Ctx<'_>, path: BootPath) -> Result<(crate::runtime::CpuPolicy, Option<GuestResources>), (bool, Failure)> {
    let facts = TranslationFacts {
        pod: ctx.facts.clone(),
        spec: ctx.spec.clone(),
        path,
        resources: first_container_resources(ctx.pod).map(|(requests, limits)| ContainerResources { requests, limits }),
    };
    let d = p.decide(move |pol| pol.resource_translation(facts)).await.map_err(|e| (false, Failure::transient("PolicyUnavailable", e.to_string())))?;
    match d.outcome {
        TranslationOutcome::Translated { cpu, guest } => Ok((plan::cpu_policy(&cpu), guest)),
        TranslationOutcome::Refuse => Err((
            false,
            Failure { reason: "ResourceTranslationRefused", message: d.message, transient: d.reason == crate::policy::decision::POLICY_FAILED },
        )),
    }
}

/// Per-lineage invalidation: every fresh bring-up drops `fork-<vm>` first.
async fn drop_own_fork(p: &CocoonProvider, options: &CloneOptions) {
    if options.drop_own_fork_snapshot {
        drop_fork_of(p, &options.vm_name).await;
    }
}

async fn drop_fork_of(p: &CocoonProvider, vm: &str) {
    let name = plan::fork_snapshot_name(vm);
    if let Err(error) = p.ports.runtime.snapshot_remove_if_exists(&name).await {
        tracing::warn!(snapshot = %name, %error, "could not drop the stale fork snapshot");
    }
}

/// One fork snapshot per source lineage, shared by concurrent forks.
async fn ensure_fork_snapshot(p: &CocoonProvider, source: &str, fork: &str) -> Result<(), Failure> {
    let lock = p.state.key_lock(&format!("fork:{fork}"));
    let _guard = lock.lock().await;
    match p.ports.runtime.snapshot_inspect(fork).await {
        Ok(_) => return Ok(()),
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(Failure::transient("ForkSnapshotFailed", format!("inspect fork snapshot {fork}: {e}"))),
    }
    let source_vm = match p.state.vm_by_name(source) {
        Some(vm) => vm,
        None => p.ports.runtime.inspect(source).await.map_err(|e| {
            if e.is_not_found() {
                Failure::transient("ForkSourceMissing", format!("fork source vm {source} does not exist on this node: {e}"))
            } else {
                Failure::transient("ForkSnapshotFailed", format!("inspect fork source vm {source}: {e}"))
            }
        })?,
    };
    let started = Instant::now();
    let saved = p.ports.runtime.snapshot_save(fork, &source_vm.id).await;
    p.metrics.snapshot_save.with_label_values(&[if saved.is_ok() { "ok" } else { "failed" }]).inc();
    p.metrics.snapshot_save_duration.observe(started.elapsed().as_secs_f64());
    saved.map_err(|e| Failure::transient("ForkSnapshotFailed", format!("snapshot fork source vm {source} ({}) as {fork}: {e}", source_vm.id)))
}

/// The clone source snapshot: local, else pulled from the registry (one pull per name).
async fn ensure_snapshot(p: &CocoonProvider, local: &str, repo: &str, tag: &str) -> Result<SnapshotRecord, Failure> {
    let lock = p.state.key_lock(&format!("snapshot:{local}"));
    let _guard = lock.lock().await;
    match p.ports.runtime.snapshot_inspect(local).await {
        Ok(s) => return Ok(s),
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(Failure::transient("SnapshotInspectFailed", format!("inspect snapshot {local}: {e}"))),
    }
    let Some(registry) = &p.ports.registry else {
        return Err(Failure::transient("SnapshotUnavailable", format!("snapshot {local} is not on this node and no registry is configured (set OCI_REGISTRY)")));
    };
    let started = Instant::now();
    let pulled = registry.pull_snapshot(p.ports.runtime.as_ref(), repo, tag, local).await;
    p.metrics.snapshot_pull.with_label_values(&[if pulled.is_ok() { "ok" } else { "failed" }]).inc();
    p.metrics.snapshot_pull_duration.observe(started.elapsed().as_secs_f64());
    pulled.map_err(|e| Failure::transient("SnapshotPullFailed", format!("pull snapshot {repo}:{tag} into {local}: {e}")))?;
    p.ports
        .runtime
        .snapshot_inspect(local)
        .await
        .map_err(|e| Failure::transient("SnapshotInspectFailed", format!("inspect snapshot {local} after the pull: {e}")))
}

/// The snapshot's base image, so `vm clone --pull` finds the exact version.
async fn ensure_base_image(p: &CocoonProvider, snapshot: &SnapshotRecord) -> Result<(), Failure> {
    match plan::base_image(snapshot) {
        BaseImage::Skip => Ok(()),
        BaseImage::CheckDigest { digest, image } => match p.ports.runtime.image_inspect(&digest).await {
            Ok(_) => Ok(()),
            Err(_) => ensure_run_image(p, &image, false).await.map(|_| ()),
        },
        BaseImage::Ensure(image) => ensure_run_image(p, &image, false).await.map(|_| ()),
    }
}

/// Makes `reference` runnable; returns the local image name (§4b "Ensure run image").
async fn ensure_run_image(p: &CocoonProvider, reference: &str, force: bool) -> Result<String, Failure> {
    if reference.is_empty() {
        return Ok(String::new());
    }
    let lock = p.state.key_lock(&format!("image:{}{reference}", if force { "force " } else { "" }));
    let _guard = lock.lock().await;
    let pull = || async {
        p.ports
            .runtime
            .image_pull(reference, force)
            .await
            .map(|()| reference.to_string())
            .map_err(|e| Failure::transient("ImagePullFailed", format!("pull image {reference}: {e}")))
    };
    let Some(registry) = p.ports.registry.as_ref().filter(|_| !plan::is_http(reference)) else { return pull().await };
    let (repo, tag) = plan::parse_ref(reference);
    match registry.manifest(repo, tag).await {
        Ok(Some(artifact)) => match plan::artifact_kind(&artifact.artifact_type) {
            ArtifactKind::Snapshot => {
                Err(Failure::permanent("SnapshotAsImage", format!("image {reference} is a snapshot artifact; use mode=clone instead of mode=run")))
            }
            ArtifactKind::CloudImage => match registry.ensure_cloud_image(p.ports.runtime.as_ref(), reference, force).await {
                Ok(CloudImageResult::Imported(name)) => Ok(name),
                Ok(CloudImageResult::NotACloudImage) => pull().await,
                Err(e) => Err(Failure::transient("CloudImageImportFailed", format!("import cloud image {reference}: {e}"))),
            },
            ArtifactKind::Other => pull().await,
        },
        Ok(None) | Err(_) => pull().await,
    }
}

/// Restore from hibernate: the verified local snapshot, else a registry pull into the import name.
async fn restore(p: &CocoonProvider, ctx: &Ctx<'_>, options: &CloneOptions, fresh_nic: bool) -> Result<VmRecord, Failure> {
    let vm = ctx.spec.vm_name.as_str();
    let (source, snapshot, import) = wake_source(p, vm).await?;
    ensure_base_image(p, &snapshot).await?;
    let cpu = translate(p, ctx, BootPath::Clone).await.map_err(|(_, f)| f)?.0;
    let nics = fresh_nic.then_some(1);
    let result = p
        .ports
        .runtime
        .clone_vm(&plan::clone_spec(options, CloneSource::Snapshot(source.clone()), !snapshot.image.is_empty(), cpu, nics))
        .await
        .map_err(|e| Failure::transient("WakeCloneFailed", format!("restore vm {vm} from hibernate snapshot {source}: {e}")));
    if import && result.is_ok() {
        let runtime = p.ports.runtime.clone();
        tokio::spawn(async move {
            if let Err(error) = runtime.snapshot_remove_if_exists(&source).await {
                tracing::warn!(snapshot = %source, %error, "could not remove the hibernate import snapshot");
            }
        });
    }
    result
}

/// `resolveWakeSource` without the peer tier: (snapshot name, record, is an import to remove).
async fn wake_source(p: &CocoonProvider, vm: &str) -> Result<(String, SnapshotRecord, bool), Failure> {
    let mut tag_absent = false;
    match p.ports.runtime.snapshot_inspect(vm).await {
        Ok(local) => match &p.ports.registry {
            None => return Ok((vm.to_string(), local, false)),
            Some(registry) => match registry.snapshot_meta(vm, plan::HIBERNATE_SNAPSHOT_TAG).await {
                Ok(Some(meta)) if meta.snapshot_id == local.id => {
                    p.metrics.snapshot_verify.with_label_values(&["ok"]).inc();
                    return Ok((vm.to_string(), local, false));
                }
                Ok(found) => {
                    p.metrics.snapshot_verify.with_label_values(&["stale"]).inc();
                    tag_absent = found.is_none();
                    tracing::info!(vm, "local snapshot is stale against {vm}:hibernate; discarding it");
                    let _ = p.ports.runtime.snapshot_remove_if_exists(vm).await;
                    let _ = p.ports.runtime.snapshot_remove_if_exists(&plan::fork_snapshot_name(vm)).await;
                }
                Err(e) => {
                    p.metrics.snapshot_verify.with_label_values(&["error"]).inc();
                    return Err(Failure::transient("WakeVerifyFailed", format!("verify local snapshot {vm} against {vm}:hibernate: {e} (an unverified copy is never restored)")));
                }
            },
        },
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(Failure::transient("WakeSourceFailed", format!("inspect local snapshot {vm}: {e}"))),
    }
    let Some(registry) = &p.ports.registry else {
        return Err(Failure::transient("WakeSourceMissing", format!("wake {vm}: no local snapshot and no registry configured")));
    };
    if tag_absent {
        return Err(Failure::transient("WakeSourceMissing", format!("wake {vm}: the {vm}:hibernate tag is gone")));
    }
    let import = plan::hibernate_import_name(vm);
    let started = Instant::now();
    let pulled = registry.pull_snapshot(p.ports.runtime.as_ref(), vm, plan::HIBERNATE_SNAPSHOT_TAG, &import).await;
    p.metrics.snapshot_pull.with_label_values(&[if pulled.is_ok() { "ok" } else { "failed" }]).inc();
    p.metrics.snapshot_pull_duration.observe(started.elapsed().as_secs_f64());
    pulled.map_err(|e| Failure::transient("WakePullFailed", format!("pull {vm}:hibernate into {import}: {e}")))?;
    let record = p
        .ports
        .runtime
        .snapshot_inspect(&import)
        .await
        .map_err(|e| Failure::transient("WakePullFailed", format!("inspect pulled snapshot {import}: {e}")))?;
    Ok((import, record, true))
}
