//! DeletePod (never destroys a VM whose save failed: `DECISIONS.md` row 3): the
//! snapshot-before-destroy policy, save + push `:latest` (a failure keeps the VM and the delete
//! retries), `vm rm --force`, lease release, snapshot cleanup unless `keep-snapshot-on-delete`,
//! forget.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::failed_ops::{keep, kept};
use super::guest_os;
use super::plan;
use crate::kubelet::{EventReason, ProviderError};
use crate::model::{PodFacts, pod_facts, vm_spec};
use crate::policy::contract::snapshot_before_destroy::{Facts, Outcome};
use crate::policy::slots::SnapshotBeforeDestroy;
use crate::registry::PushLabels;
use crate::runtime::{RuntimeError, VmState};

pub(super) async fn delete(p: &CocoonProvider, pod: &Pod) -> Result<(), ProviderError> {
    let facts = pod_facts(pod);
    let key = facts.key();
    if p.state.resume_claimed(&key) {
        return Err(ProviderError::Transient(format!(
            "resumed operation still in flight for {key}"
        )));
    }
    if !p.state.begin_delete(&key) {
        return Err(ProviderError::Transient(format!(
            "delete operation still in flight for pod {key}"
        )));
    }
    // A retried hibernate or wake of the same pod runs under this lock too: never both at once.
    let op = p.state.lock_op(&key).await;
    let result = delete_fenced(p, pod, facts, &key).await;
    drop(op);
    p.state.end_delete(&key);
    result
}

async fn delete_fenced(p: &CocoonProvider, pod: &Pod, facts: PodFacts, key: &str) -> Result<(), ProviderError> {
    let uid = facts.uid.clone();
    let tracked = p.state.tracked(key);
    if tracked.as_ref().is_some_and(|t| t.uid != uid) {
        tracing::info!(pod = %key, %uid, "delete of a superseded incarnation: nothing to do");
        return Ok(());
    }
    let spec = vm_spec::of_pod(pod);
    let vm_name = spec.vm_name.clone();
    // Only what the pod holds is its to destroy: a VM, snapshots or hibernated state under a
    // name another pod holds (or nobody) are left alone, whatever this pod's annotations say.
    let holds = !vm_name.is_empty() && p.state.holds(key, &vm_name);
    // Nothing else acts on a pod being deleted: no probe flips, no guest work.
    p.state.stop_guest_work(key);
    p.probes.forget(key, Some(&uid));

    if !spec.managed {
        // Unmanaged VMs belong to someone else; only forget the pod (and its hold on the name).
        p.state.forget(key, &uid, "");
        p.state.release_name(key, &vm_name);
        p.metrics.lifecycle("delete", "ok", "");
        p.notify(key);
        return Ok(());
    }
    let tracked_vm = tracked.as_ref().and_then(|t| t.vm.as_ref());
    if let Some(own) = guest_os::for_spec(&spec).delete(p, pod, key, &uid, tracked_vm).await {
        return own;
    }
    let keep = spec.keep_snapshot_on_delete;
    let vm = tracked
        .and_then(|t| t.vm)
        .or_else(|| holds.then(|| p.state.vm_by_name(&vm_name)).flatten());

    let Some(vm) = vm else {
        if !keep && holds {
            drop_snapshots(p, &vm_name).await;
            p.state.release_name(key, &vm_name);
        }
        p.state.forget(key, &uid, &vm_name);
        p.metrics
            .lifecycle("delete", "skipped", if keep { "seat_release" } else { "no_vm" });
        p.notify(key);
        return Ok(());
    };

    // Only a running VM has state to save: re-inspect it.
    let running = match p.ports.runtime.inspect(&vm.id).await {
        Ok(current) => current.state == VmState::Running,
        Err(e) if e.is_not_found() => false,
        Err(e) => {
            return Err(kept(
                p,
                pod,
                key,
                &vm.id,
                format!("inspect vm {} before delete: {e}", vm.id),
            ));
        }
    };
    let sfacts = Facts {
        pod: facts,
        spec,
        pusher_configured: p.ports.registry.is_some(),
        vm_running: running,
    };
    let decision = p
        .decide(move |pol| pol.decide::<SnapshotBeforeDestroy>(&sfacts))
        .await?;
    tracing::info!(pod = %key, vm = %vm.id, reason = %decision.reason, message = %decision.message, "snapshot-before-destroy decision");
    if let Outcome::Snapshot(target) = decision.outcome {
        let Some(registry) = &p.ports.registry else {
            return Err(kept(
                p,
                pod,
                key,
                &vm.id,
                format!(
                    "the snapshot-before-destroy policy asks for {}:{} but no registry is configured: {}",
                    target.repository, target.tag, decision.message
                ),
            ));
        };
        if !running {
            return Err(kept(
                p,
                pod,
                key,
                &vm.id,
                format!(
                    "the snapshot-before-destroy policy asks for a snapshot of vm {} but it is not running",
                    vm.id
                ),
            ));
        }
        if let Err(e) = super::transfer::save_snapshot(p, &vm_name, &vm.id).await {
            let message = format!("snapshot save {vm_name} of vm {} before delete: {e}", vm.id);
            return Err(kept_after(p, pod, key, &vm.id, message, &e));
        }
        if let Err(e) = super::transfer::push_snapshot(
            p,
            registry.as_ref(),
            &vm_name,
            &target.repository,
            &target.tag,
            PushLabels {
                base_image: &target.base_image,
                owner: key,
            },
        )
        .await
        {
            return Err(kept(
                p,
                pod,
                key,
                &vm.id,
                format!(
                    "push snapshot {vm_name} to {}:{} before delete: {e}",
                    target.repository, target.tag
                ),
            ));
        }
    }

    if let Err(e) = p.ports.runtime.remove(&vm.id).await {
        return Err(kept_after(p, pod, key, &vm.id, format!("remove vm {}: {e}", vm.id), &e));
    }
    p.release_leases(&vm).await;
    // A seat release keeps the snapshots, and with them the pod's hold on the name: the pod
    // recreated to wake is the same holder.
    if !keep {
        drop_snapshots(p, &vm_name).await;
        p.state.release_name(key, &vm_name);
    }
    p.state.forget(key, &uid, &vm_name);
    p.metrics.lifecycle("delete", "ok", "");
    tracing::info!(pod = %key, vm = %vm.id, keep, "vm deleted");
    p.notify(key);
    Ok(())
}

/// The VM stays after cocoon failed with `error`: retried with backoff, unless cocoon refused
/// the request itself (a retry would only repeat it): then the delete waits for an operator,
/// re-checked at the slowest pace, and the pod says what to do.
fn kept_after(
    p: &CocoonProvider,
    pod: &Pod,
    key: &str,
    vm_id: &str,
    message: String,
    error: &RuntimeError,
) -> ProviderError {
    if !error.is_permanent() {
        return kept(p, pod, key, vm_id, message);
    }
    let message = format!(
        "{message}; this cannot succeed on a retry: save the VM's state by hand if it is wanted, then remove it (cocoon vm rm {vm_id}) and the delete finishes at its next check"
    );
    keep(p, pod, key, vm_id, &message, "the delete waits for an operator");
    ProviderError::NeedsOperator {
        reason: EventReason::DeleteKeptVm,
        message,
    }
}

/// Removes `<vm>` and `fork-<vm>` concurrently, 10 s each; failures are logged.
async fn drop_snapshots(p: &CocoonProvider, vm_name: &str) {
    let fork = plan::fork_snapshot_name(vm_name);
    let rm = |name: String| async move {
        match tokio::time::timeout(
            Duration::from_secs(10),
            p.ports.runtime.snapshot_remove_if_exists(&name),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(snapshot = %name, %error, "snapshot cleanup failed"),
            Err(_) => tracing::warn!(snapshot = %name, "snapshot cleanup timed out"),
        }
    };
    futures::join!(rm(vm_name.to_string()), rm(fork));
}
