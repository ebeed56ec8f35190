//! The VM event watcher: `cocoon vm status --event` tells the provider
//! within a poll interval that a VM was deleted or stopped behind its back. A deleted VM evicts
//! its pod (`VMGone`); a stopped one is started again in place, unless it stopped again within
//! the restart cooldown (then it is removed and the pod evicted, `RestartCooldown`). An
//! inconclusive inspect is rechecked in the background with backoff, and a VM whose state
//! cannot be learned within the budget is removed and its pod evicted (`VMInspectTimeout`).
//! Pods being hibernated or deleted are left alone: their VM goes away on purpose.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::CocoonProvider;
use super::gone::{self, Action, Eviction, Inspected, Recheck};
use crate::kubelet::{EventReason, EventType};
use crate::retry::Schedule;
use crate::runtime::{VmRecord, WatchItem};

/// Runs until `stop`: every candidate event is handled in its own task.
pub(super) async fn run(p: Arc<CocoonProvider>, stop: CancellationToken) {
    let mut events = p.ports.runtime.watch_events();
    loop {
        let item = tokio::select! {
            _ = stop.cancelled() => return,
            item = events.next() => item,
        };
        match item {
            None => return,
            Some(WatchItem::Event(event)) if gone::is_candidate(&event) => {
                tracing::debug!(vm = %event.vm.id, name = %event.vm.name(), kind = ?event.kind, state = event.vm.state.as_str(), "vm event");
                let gone = p.clone();
                p.spawn(async move { handle_vm_gone(&gone, event.vm).await });
            }
            Some(WatchItem::Event(_)) => {}
            Some(WatchItem::Disconnected {
                clean,
                reason,
                retry_in,
            }) => {
                if clean {
                    let keep = p.cfg.timings.restart_cooldown.max(Duration::from_secs(60));
                    p.state.gc_restarts(Instant::now(), keep);
                }
                tracing::debug!(clean, %reason, ?retry_in, "vm event stream reconnecting");
            }
        }
    }
}

async fn inspect_state(p: &CocoonProvider, vm_id: &str) -> Inspected {
    match p.ports.runtime.inspect(vm_id).await {
        Ok(vm) => Inspected::State(vm.state),
        Err(e) if e.is_vm_not_found() => Inspected::NotFound,
        Err(e) => Inspected::Inconclusive(e.to_string()),
    }
}

/// `handleVMGone`: the VM of an event is deleted or not running (by the event's word).
/// One event per VM is handled at a time; repeats while it runs are dropped.
pub(super) async fn handle_vm_gone(p: &CocoonProvider, event_vm: VmRecord) {
    let Some((key, tracked)) = p.state.pod_of_vm(&event_vm.id, event_vm.name()) else {
        return;
    };
    let Some(vm) = tracked.vm.clone() else { return };
    // cocoon's events never describe a macOS guest (a name clash with one is not its VM).
    if super::macos::plan::is_macos_vm(&vm) {
        return;
    }
    if !p.state.begin_vm_event(&vm.id) {
        return;
    }
    on_vm_gone(p, &key, &tracked, &vm).await;
    p.state.end_vm_event(&vm.id);
}

async fn on_vm_gone(p: &CocoonProvider, key: &str, tracked: &super::table::Tracked, vm: &VmRecord) {
    if crate::model::vm_spec::of_pod(&tracked.pod).hibernate || p.state.is_deleting(key) {
        tracing::debug!(pod = %key, vm = %vm.id, "vm event ignored: the pod is hibernating or being deleted");
        return;
    }
    // Inline inspect: two attempts; only success and NotFound are definitive.
    let inspected = Schedule::every(p.cfg.timings.inspect_retry)
        .tries(2)
        .retry(
            || async move {
                match inspect_state(p, &vm.id).await {
                    inconclusive @ Inspected::Inconclusive(_) => Err(inconclusive),
                    definitive => Ok(definitive),
                }
            },
            |_| true,
            |_, _| {},
        )
        .await
        .unwrap_or_else(|inconclusive| inconclusive);
    let now = Instant::now();
    let action = gone::after_inspect(
        &inspected,
        p.state.last_restart(&vm.id),
        now,
        p.cfg.timings.restart_cooldown,
    );
    tracing::info!(pod = %key, vm = %vm.id, ?inspected, ?action, "vm event");
    match action {
        Action::Ignore => {}
        Action::Evict(why) => {
            p.release_leases(vm).await;
            super::evict::evict(p, key, &tracked.uid, why).await;
        }
        Action::Recheck => {
            p.metrics.vm_inspect_transient_fail.inc();
            spawn_recheck(p, key.to_string(), tracked.uid.clone(), vm.clone());
        }
        Action::RemoveThenEvict(why) => {
            remove_then_evict(p, key, &tracked.uid, vm, why).await;
        }
        Action::Restart => {
            p.state.record_restart(&vm.id, now);
            match p.ports.runtime.start(&vm.id).await {
                Err(e) => {
                    tracing::warn!(pod = %key, vm = %vm.id, error = %e, "restarting the stopped vm failed");
                    remove_then_evict(
                        p,
                        key,
                        &tracked.uid,
                        vm,
                        Eviction::restart_failed(&format!("vm start {}: {e}", vm.id)),
                    )
                    .await;
                }
                Ok(()) => {
                    tracing::info!(pod = %key, vm = %vm.id, "stopped vm restarted in place");
                    if let Ok(current) = p.ports.runtime.inspect(&vm.id).await {
                        p.state.refresh_vm(key, &tracked.uid, current);
                    }
                    p.ports.events.record(
                        &tracked.pod,
                        EventType::Warning,
                        EventReason::VmRestarted,
                        format!("vm {} stopped and was started again in place", vm.id),
                    );
                    p.notify(key);
                }
            }
        }
    }
}

/// Removes the VM; only when that worked are its leases released and the pod evicted
/// (a VM that could not be removed keeps its pod). Returns whether the VM was removed.
async fn remove_then_evict(p: &CocoonProvider, key: &str, uid: &str, vm: &VmRecord, why: Eviction) -> bool {
    match p.ports.runtime.remove(&vm.id).await {
        Ok(()) => {
            p.release_leases(vm).await;
            super::evict::evict(p, key, uid, why).await;
            true
        }
        Err(error) => {
            tracing::warn!(pod = %key, vm = %vm.id, %error, reason = why.reason.as_str(), "removing the vm failed; the pod is kept");
            false
        }
    }
}

/// One deferred recheck per VM id: inspect with backoff until the answer is definitive or
/// the budget runs out.
fn spawn_recheck(p: &CocoonProvider, key: String, uid: String, vm: VmRecord) {
    if !p.state.begin_recheck(&vm.id) {
        return;
    }
    let owner = p.arc();
    p.spawn(async move {
        let p = &*owner;
        let replay = recheck(p, &key, &uid, &vm).await;
        p.state.end_recheck(&vm.id);
        if replay {
            handle_vm_gone(p, vm).await;
        }
    });
}

/// Returns true when the VM should be handled as a fresh event (it is stopped).
async fn recheck(p: &CocoonProvider, key: &str, uid: &str, vm: &VmRecord) -> bool {
    let t = &p.cfg.timings;
    let started = Instant::now();
    let mut delays = Schedule::backoff(t.recheck_initial, t.recheck_max).exact().delays();
    loop {
        if !delays.wait_or_cancel(&p.closing).await {
            return false;
        }
        let still_ours = p
            .state
            .tracked_as(key, uid)
            .is_some_and(|tr| tr.vm.is_some_and(|v| v.id == vm.id));
        if !still_ours {
            return false;
        }
        let inspected = inspect_state(p, &vm.id).await;
        match gone::recheck_step(&inspected, started.elapsed(), t.recheck_budget) {
            Recheck::Continue => tracing::debug!(pod = %key, vm = %vm.id, ?inspected, "vm state still undecidable"),
            Recheck::Evict(why) => {
                p.release_leases(vm).await;
                super::evict::evict(p, key, uid, why).await;
                return false;
            }
            Recheck::RemoveThenEvict(why) => {
                if remove_then_evict(p, key, uid, vm, why).await {
                    return false;
                }
            }
            Recheck::Replay => return true,
            Recheck::Stop => return false,
        }
    }
}
