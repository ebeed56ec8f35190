//! Waking a hibernated guest (lifecycle document "true → false"; behaviour spec §3.4, §4f):
//! the clone source is a local snapshot verified against the `:hibernate` tag's snapshot id, else
//! the raw files of the `from-node` peer (`wake_peer`, staged for `--from-dir`), else a registry
//! pull into `<vm>-hibernate-import`; never an unverified copy and never a fresh boot.
//! The same restore serves a cross-node wake that arrives through CreatePod. The daemon never
//! deletes the `:hibernate` tag: the operator does once the woken VM runs.

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::create::{Ctx, hibernate_evidence, translate};
use super::ensure::ensure_base_image;
use super::failure::Failure;
use super::guest::Finish;
use super::invariants;
use super::lifecycle::LifecycleState;
use super::plan;
use crate::model::{RuntimeAnnotations, VmSpec, pod_facts, vm_spec};
use crate::policy::contract::bring_up::{self, CloneOptions, Outcome, Plan};
use crate::policy::contract::guest_fixup::BootOrigin;
use crate::policy::contract::resource_translation::BootPath;
use crate::policy::contract::types::RefusalKind;
use crate::policy::slots::BringUp;
use crate::runtime::{CloneSource, SnapshotRecord, VmRecord};

/// Where a restore takes the hibernated guest from.
pub(super) struct WakeSource {
    /// The local snapshot to clone.
    pub snapshot: String,
    pub record: SnapshotRecord,
    /// A `<vm>-hibernate-import` pulled for this wake: removed once the clone is up.
    pub import: bool,
    /// Restored from the peer: clone `--from-dir` this directory (removed when this drops).
    pub staged: Option<crate::peer::Restored>,
    /// Why the peer tier, tried, failed (the wake fell back to the registry).
    pub peer_failure: Option<String>,
    /// For the `Woken` Event.
    pub label: String,
}

/// `resolveWakeSource`: a verified local snapshot, else the peer's files, else the registry.
pub(super) async fn wake_source(p: &CocoonProvider, vm: &str) -> Result<WakeSource, Failure> {
    let mut tag_absent = false;
    match p.ports.runtime.snapshot_inspect(vm).await {
        Ok(local) => match &p.ports.registry {
            None => {
                return Ok(WakeSource {
                    snapshot: vm.to_string(),
                    record: local,
                    import: false,
                    staged: None,
                    peer_failure: None,
                    label: format!("local snapshot {vm} (no registry configured)"),
                });
            }
            Some(registry) => match registry.snapshot_meta(vm, plan::HIBERNATE_SNAPSHOT_TAG).await {
                Ok(Some(meta)) if meta.snapshot_id == local.id => {
                    p.metrics.snapshot_verify.with_label_values(&["ok"]).inc();
                    return Ok(WakeSource {
                        snapshot: vm.to_string(),
                        record: local,
                        import: false,
                        staged: None,
                        peer_failure: None,
                        label: format!("local snapshot {vm}, verified against {vm}:hibernate"),
                    });
                }
                Ok(found) => {
                    p.metrics.snapshot_verify.with_label_values(&["stale"]).inc();
                    tag_absent = found.is_none();
                    tracing::info!(
                        vm,
                        tag_absent,
                        "local snapshot is stale against {vm}:hibernate; discarding it"
                    );
                    let _ = p.ports.runtime.snapshot_remove_if_exists(vm).await;
                    let _ = p
                        .ports
                        .runtime
                        .snapshot_remove_if_exists(&plan::fork_snapshot_name(vm))
                        .await;
                }
                Err(e) => {
                    p.metrics.snapshot_verify.with_label_values(&["error"]).inc();
                    return Err(Failure::transient(
                        "WakeVerifyFailed",
                        format!(
                            "verify local snapshot {vm} against {vm}:hibernate: {e} (an unverified copy is never restored; the wake retries)"
                        ),
                    ));
                }
            },
        },
        Err(e) if e.is_not_found() => {}
        Err(e) => {
            return Err(Failure::transient(
                "WakeSourceFailed",
                format!("inspect local snapshot {vm}: {e}"),
            ));
        }
    }
    let Some(registry) = &p.ports.registry else {
        return Err(Failure::transient(
            "WakeSourceMissing",
            format!("wake {vm}: no local snapshot and no registry configured"),
        ));
    };
    if tag_absent {
        return Err(Failure::transient(
            "WakeSourceMissing",
            format!("wake {vm}: the {vm}:hibernate tag is gone, so there is no guest state to restore"),
        ));
    }
    let mut peer_failure = None;
    if let Some(tier) = p.peer.get() {
        match super::wake_peer::restore_from_peer(p, tier, registry.as_ref(), vm).await {
            Ok(w) => {
                return Ok(WakeSource {
                    snapshot: w.staged.dir.path().display().to_string(),
                    record: w.record,
                    import: false,
                    label: format!("the files of {vm}:hibernate on its peer node {}", w.peer),
                    staged: Some(w.staged),
                    peer_failure: None,
                });
            }
            Err(super::wake_peer::Skipped::NotApplicable(why)) => {
                tracing::debug!(vm, %why, "peer tier not applicable; pulling from the registry");
            }
            Err(super::wake_peer::Skipped::Failed(why)) => peer_failure = Some(why),
        }
    }
    let import = plan::hibernate_import_name(vm);
    p.pull_snapshot(registry.as_ref(), vm, plan::HIBERNATE_SNAPSHOT_TAG, &import)
        .await
        .map_err(|e| Failure::transient("WakePullFailed", format!("pull {vm}:hibernate into {import}: {e}")))?;
    let record = p
        .ports
        .runtime
        .snapshot_inspect(&import)
        .await
        .map_err(|e| Failure::transient("WakePullFailed", format!("inspect pulled snapshot {import}: {e}")))?;
    Ok(WakeSource {
        snapshot: import,
        record,
        import: true,
        staged: None,
        peer_failure,
        label: format!("registry {vm}:hibernate"),
    })
}

/// Restores the pod's guest: resolves the source, ensures its base image, clones it with the
/// plan's options, the translation policy's cgroup flags and, for a guest hibernated without
/// its NIC (a host invariant), one fresh NIC.
pub(super) async fn restore(
    p: &CocoonProvider,
    ctx: &Ctx<'_>,
    options: &CloneOptions,
) -> Result<(VmRecord, String), Failure> {
    let vm = ctx.spec.vm_name.as_str();
    let source = wake_source(p, vm).await?;
    if let Some(why) = &source.peer_failure {
        p.ports.events.record(
            ctx.pod,
            true,
            "PeerRestoreFailed",
            format!("{why}; restoring from the registry instead"),
        );
    }
    ensure_base_image(p, &source.record).await?;
    let cpu = translate(p, ctx, BootPath::Clone).await?.0;
    let nics = invariants::nic_less_hibernate(&ctx.spec).then_some(1);
    let clone_source = match &source.staged {
        Some(_) => CloneSource::Dir(source.snapshot.clone()),
        None => CloneSource::Snapshot(source.snapshot.clone()),
    };
    let spec = plan::clone_spec(options, clone_source, !source.record.image.is_empty(), cpu, nics)
        .map_err(|m| Failure::permanent("WakeRefused", m))?;
    let result = p.ports.runtime.clone_vm(&spec).await.map_err(|e| {
        Failure::transient(
            "WakeCloneFailed",
            format!("restore vm {vm} from hibernate snapshot {}: {e}", source.snapshot),
        )
    });
    if source.import && result.is_ok() {
        let (runtime, name) = (p.ports.runtime.clone(), source.snapshot.clone());
        tokio::spawn(async move {
            if let Err(error) = runtime.snapshot_remove_if_exists(&name).await {
                tracing::warn!(snapshot = %name, %error, "could not remove the hibernate import snapshot");
            }
        });
    }
    // A staged directory goes now, whether the clone took it or not (`source` drops here).
    result.map(|vm| (vm, source.label))
}

/// How a restored guest finishes its boot (one restored with a fresh NIC only waits for its lease).
pub(super) fn restore_finish(spec: &VmSpec) -> Finish {
    if invariants::nic_less_hibernate(spec) {
        Finish::LeaseWait
    } else {
        Finish::Fixup {
            origin: BootOrigin::Wake,
            source_image: String::new(),
        }
    }
}

impl CocoonProvider {
    /// UpdatePod "true → false" for a pod whose guest is hibernated. `Err(kind)` when it
    /// failed (reported on the pod): what a retry owed by the caller can do.
    pub(super) async fn wake(&self, pod: &Pod, pkey: &str) -> Result<(), RefusalKind> {
        let facts = pod_facts(pod);
        let spec = vm_spec::of_pod(pod);
        if spec.vm_name.is_empty() {
            return Ok(());
        }
        self.set_lifecycle(pod, pkey, LifecycleState::Creating, "").await;
        self.clear_runtime(pod, pkey).await;

        // A wake is an explicit restore: the bring-up policy guards it (evidence fails closed,
        // the image ref must match) and picks its clone options.
        let evidence = hibernate_evidence(self, &spec.vm_name).await;
        let mut wake_spec = spec.clone();
        wake_spec.restore_from_hibernate = true;
        let preassigned = RuntimeAnnotations::of_pod(pod);
        let bring_up = bring_up::Facts {
            pod: facts.clone(),
            spec: wake_spec,
            vm_exists_locally: false,
            evidence,
            registry_configured: self.ports.registry.is_some(),
            local_snapshots: Vec::new(),
            node_restore_mode: self.cfg.restore_mode,
            preassigned_vm_id: preassigned.vm_id,
            preassigned_ip: preassigned.ip,
            preassigned_vnc_port: preassigned.vnc_port,
        };
        let decision = match self.decide(move |p| p.decide::<BringUp>(&bring_up)).await {
            Ok(d) => d,
            Err(e) => {
                return self
                    .wake_failed(pod, pkey, Failure::transient("PolicyUnavailable", e.to_string()))
                    .await;
            }
        };
        if let Some(verdict) = plan::evidence_verdict(&decision.outcome) {
            self.metrics.hibernate_evidence.with_label_values(&[verdict]).inc();
        }
        tracing::info!(pod = %pkey, reason = %decision.reason, message = %decision.message, "wake decision");
        let options = match decision.outcome {
            Outcome::Proceed(Plan::RestoreFromHibernate(restore_plan)) => restore_plan.options,
            // Host invariant: only a restore can wake a hibernated guest, never a fresh boot.
            Outcome::Proceed(plan) => {
                let message = format!(
                    "the bring-up policy answered {plan:?} for waking vm {}; only a restore from its hibernate snapshot can wake a hibernated guest",
                    spec.vm_name
                );
                return self
                    .wake_failed(pod, pkey, Failure::transient("WakeRefused", message))
                    .await;
            }
            Outcome::Refuse(refusal) => {
                return self
                    .wake_failed(pod, pkey, Failure::refused(refusal, decision.message))
                    .await;
            }
        };

        let ctx = Ctx {
            pod,
            facts,
            spec: spec.clone(),
        };
        let started = Instant::now();
        let (vm, label) = match restore(self, &ctx, &options).await {
            Ok(v) => v,
            Err(f) => return self.wake_failed(pod, pkey, f).await,
        };
        self.metrics
            .vm_boot_duration
            .with_label_values(&["clone", invariants::backend_label(&spec.backend)])
            .observe(started.elapsed().as_secs_f64());
        let uid = super::table::uid_of(pod);
        if !self.state.set_vm(pkey, &uid, vm.clone()) {
            tracing::info!(pod = %pkey, "wake finished for a superseded incarnation");
            return Ok(());
        }
        let ip = self.resolve_ip(&vm);
        self.write_runtime(pod, pkey, &vm.id, &ip).await;
        tracing::info!(pod = %pkey, vm = %spec.vm_name, id = %vm.id, %ip, source = %label, "guest woken");
        self.ports
            .events
            .record(pod, false, "Woken", format!("cloned from {label}"));
        self.finish_boot(pod, pkey, &vm, restore_finish(&spec), true).await;
        Ok(())
    }

    async fn wake_failed(&self, pod: &Pod, pkey: &str, f: Failure) -> Result<(), RefusalKind> {
        self.metrics.wake_ended(true, false);
        self.fail_op(pod, pkey, f.reason, "wake", &f.message).await;
        Err(f.kind)
    }
}
