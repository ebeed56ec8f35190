//! The one restore of a hibernated guest, for CreatePod (a cross-node wake, or a pod whose VM
//! name owns a hibernate snapshot) and the UpdatePod wake: the clone source is a local snapshot
//! verified against the `:hibernate` tag's snapshot id, else the raw files of the `from-node`
//! peer (`wake_peer`, staged for `--from-dir`), else a registry pull into
//! `<vm>-hibernate-import`; never an unverified copy and never a fresh boot.

use super::super::CocoonProvider;
use super::super::ensure::ensure_base_image;
use super::super::failure::Failure;
use super::super::guest::Finish;
use super::super::invariants;
use super::super::plan;
use super::execute::{Decided, translate};
use super::gather::Ctx;
use crate::kubelet::{EventReason, EventType};
use crate::model::VmSpec;
use crate::policy::contract::bring_up::CloneOptions;
use crate::policy::contract::guest_fixup::BootOrigin;
use crate::policy::contract::resource_translation::BootPath;
use crate::runtime::{CloneSource, SnapshotRecord, VmRecord};

/// Where a restore takes the hibernated guest from.
struct WakeSource {
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
async fn wake_source(p: &CocoonProvider, vm: &str) -> Result<WakeSource, Failure> {
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
                        EventReason::WakeVerifyFailed,
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
                EventReason::WakeSourceFailed,
                format!("inspect local snapshot {vm}: {e}"),
            ));
        }
    }
    let Some(registry) = &p.ports.registry else {
        return Err(Failure::transient(
            EventReason::WakeSourceMissing,
            format!("wake {vm}: no local snapshot and no registry configured"),
        ));
    };
    if tag_absent {
        return Err(Failure::transient(
            EventReason::WakeSourceMissing,
            format!("wake {vm}: the {vm}:hibernate tag is gone, so there is no guest state to restore"),
        ));
    }
    let mut peer_failure = None;
    if let Some(tier) = p.peer.get() {
        match super::super::wake_peer::restore_from_peer(p, tier, registry.as_ref(), vm).await {
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
            Err(super::super::wake_peer::Skipped::NotApplicable(why)) => {
                tracing::debug!(vm, %why, "peer tier not applicable; pulling from the registry");
            }
            Err(super::super::wake_peer::Skipped::Failed(why)) => peer_failure = Some(why),
        }
    }
    let import = plan::hibernate_import_name(vm);
    crate::provider::transfer::pull_snapshot(p, registry.as_ref(), vm, plan::HIBERNATE_SNAPSHOT_TAG, &import)
        .await
        .map_err(|e| {
            Failure::transfer(
                EventReason::WakePullFailed,
                format!("pull {vm}:hibernate into {import}: {e}"),
                &e,
            )
        })?;
    let record = p.ports.runtime.snapshot_inspect(&import).await.map_err(|e| {
        Failure::transient(
            EventReason::WakePullFailed,
            format!("inspect pulled snapshot {import}: {e}"),
        )
    })?;
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
pub(in crate::provider) async fn restore(
    p: &CocoonProvider,
    ctx: &Ctx<'_>,
    options: &CloneOptions,
    decided: Option<Decided>,
) -> Result<(VmRecord, String), Failure> {
    let vm = ctx.spec.vm_name.as_str();
    let source = wake_source(p, vm).await?;
    if let Some(why) = &source.peer_failure {
        p.ports.events.record(
            ctx.pod,
            EventType::Warning,
            EventReason::PeerRestoreFailed,
            format!("{why}; restoring from the registry instead"),
        );
    }
    ensure_base_image(p, &source.record).await?;
    let cpu = translate(p, ctx, BootPath::Clone, decided).await?.0;
    let nics = invariants::nic_less_hibernate(&ctx.spec).then_some(1);
    let clone_source = match &source.staged {
        Some(_) => CloneSource::Dir(source.snapshot.clone()),
        None => CloneSource::Snapshot(source.snapshot.clone()),
    };
    let spec = plan::clone_spec(options, clone_source, !source.record.image.is_empty(), cpu, nics)
        .map_err(|m| Failure::permanent(EventReason::WakeRefused, m))?;
    let result = p.ports.runtime.clone_vm(&spec).await.map_err(|e| {
        Failure::transient(
            EventReason::WakeCloneFailed,
            format!("restore vm {vm} from hibernate snapshot {}: {e}", source.snapshot),
        )
    });
    if source.import && result.is_ok() {
        let (runtime, name) = (p.ports.runtime.clone(), source.snapshot.clone());
        p.spawn(async move {
            if let Err(error) = runtime.snapshot_remove_if_exists(&name).await {
                tracing::warn!(snapshot = %name, %error, "could not remove the hibernate import snapshot");
            }
        });
    }
    if result.is_ok() {
        remember_woken(p, vm).await;
    }
    // A staged directory goes now, whether the clone took it or not (`source` drops here).
    result.map(|vm| (vm, source.label))
}

/// Records which hibernated guest the VM name was just woken from: the `:hibernate` tag's
/// snapshot id (or, registry-less, the local snapshot's). The guest moves on in its VM from now
/// on, so a tag that still holds that snapshot later (the operator does not drop it after a
/// CocoonSet resume) is no hibernated state to restore a recreated pod from.
async fn remember_woken(p: &CocoonProvider, vm: &str) {
    match super::saved_snapshot_id(p, vm).await {
        Ok(Some(id)) => p.state.set_woken_from(vm, Some(&id)),
        Ok(None) => {}
        Err(error) => {
            tracing::warn!(vm, %error, "could not read which snapshot the wake came from; a pod recreated under this name may restore it again")
        }
    }
}

/// How a restored guest finishes its boot (one restored with a fresh NIC only waits for its lease).
pub(in crate::provider) fn restore_finish(spec: &VmSpec) -> Finish {
    if invariants::nic_less_hibernate(spec) {
        Finish::LeaseWait
    } else {
        Finish::Fixup {
            origin: BootOrigin::Wake,
            source_image: String::new(),
        }
    }
}
