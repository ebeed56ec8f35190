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
                p.spawn(async move { gone.handle_vm_gone(event.vm).await });
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

impl CocoonProvider {
    async fn inspect_state(&self, vm_id: &str) -> Inspected {
        match self.ports.runtime.inspect(vm_id).await {
            Ok(vm) => Inspected::State(vm.state),
            Err(e) if e.is_vm_not_found() => Inspected::NotFound,
            Err(e) => Inspected::Inconclusive(e.to_string()),
        }
    }

    /// `handleVMGone`: the VM of an event is deleted or not running (by the event's word).
    /// One event per VM is handled at a time; repeats while it runs are dropped.
    pub(super) async fn handle_vm_gone(&self, event_vm: VmRecord) {
        let Some((key, tracked)) = self.state.pod_of_vm(&event_vm.id, event_vm.name()) else {
            return;
        };
        let Some(vm) = tracked.vm.clone() else { return };
        // cocoon's events never describe a macOS guest (a name clash with one is not its VM).
        if super::macos::plan::is_macos_vm(&vm) {
            return;
        }
        if !self.state.begin_vm_event(&vm.id) {
            return;
        }
        self.on_vm_gone(&key, &tracked, &vm).await;
        self.state.end_vm_event(&vm.id);
    }

    async fn on_vm_gone(&self, key: &str, tracked: &super::table::Tracked, vm: &VmRecord) {
        if crate::model::vm_spec::of_pod(&tracked.pod).hibernate || self.state.is_deleting(key) {
            tracing::debug!(pod = %key, vm = %vm.id, "vm event ignored: the pod is hibernating or being deleted");
            return;
        }
        // Inline inspect: two attempts; only success and NotFound are definitive.
        let inspected = Schedule::every(self.cfg.timings.inspect_retry)
            .tries(2)
            .retry(
                || async move {
                    match self.inspect_state(&vm.id).await {
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
            self.state.last_restart(&vm.id),
            now,
            self.cfg.timings.restart_cooldown,
        );
        tracing::info!(pod = %key, vm = %vm.id, ?inspected, ?action, "vm event");
        match action {
            Action::Ignore => {}
            Action::Evict(why) => {
                self.release_leases(vm).await;
                super::evict::evict(self, key, &tracked.uid, why).await;
            }
            Action::Recheck => {
                self.metrics.vm_inspect_transient_fail.inc();
                self.spawn_recheck(key.to_string(), tracked.uid.clone(), vm.clone());
            }
            Action::RemoveThenEvict(why) => {
                self.remove_then_evict(key, &tracked.uid, vm, why).await;
            }
            Action::Restart => {
                self.state.record_restart(&vm.id, now);
                match self.ports.runtime.start(&vm.id).await {
                    Err(e) => {
                        tracing::warn!(pod = %key, vm = %vm.id, error = %e, "restarting the stopped vm failed");
                        self.remove_then_evict(
                            key,
                            &tracked.uid,
                            vm,
                            Eviction::restart_failed(&format!("vm start {}: {e}", vm.id)),
                        )
                        .await;
                    }
                    Ok(()) => {
                        tracing::info!(pod = %key, vm = %vm.id, "stopped vm restarted in place");
                        if let Ok(current) = self.ports.runtime.inspect(&vm.id).await {
                            self.state.refresh_vm(key, &tracked.uid, current);
                        }
                        self.ports.events.record(
                            &tracked.pod,
                            true,
                            "VMRestarted",
                            format!("vm {} stopped and was started again in place", vm.id),
                        );
                        self.notify(key);
                    }
                }
            }
        }
    }

    /// Removes the VM; only when that worked are its leases released and the pod evicted
    /// (a VM that could not be removed keeps its pod). Returns whether the VM was removed.
    async fn remove_then_evict(&self, key: &str, uid: &str, vm: &VmRecord, why: Eviction) -> bool {
        match self.ports.runtime.remove(&vm.id).await {
            Ok(()) => {
                self.release_leases(vm).await;
                super::evict::evict(self, key, uid, why).await;
                true
            }
            Err(error) => {
                tracing::warn!(pod = %key, vm = %vm.id, %error, reason = why.reason, "removing the vm failed; the pod is kept");
                false
            }
        }
    }

    /// One deferred recheck per VM id: inspect with backoff until the answer is definitive or
    /// the budget runs out.
    fn spawn_recheck(&self, key: String, uid: String, vm: VmRecord) {
        if !self.state.begin_recheck(&vm.id) {
            return;
        }
        let p = self.arc();
        self.spawn(async move {
            let replay = p.recheck(&key, &uid, &vm).await;
            p.state.end_recheck(&vm.id);
            if replay {
                p.handle_vm_gone(vm).await;
            }
        });
    }

    /// Returns true when the VM should be handled as a fresh event (it is stopped).
    async fn recheck(&self, key: &str, uid: &str, vm: &VmRecord) -> bool {
        let t = &self.cfg.timings;
        let started = Instant::now();
        let mut delays = Schedule::backoff(t.recheck_initial, t.recheck_max).exact().delays();
        loop {
            if !delays.wait_or_cancel(&self.closing).await {
                return false;
            }
            let still_ours = self
                .state
                .tracked_as(key, uid)
                .is_some_and(|tr| tr.vm.is_some_and(|v| v.id == vm.id));
            if !still_ours {
                return false;
            }
            let inspected = self.inspect_state(&vm.id).await;
            match gone::recheck_step(&inspected, started.elapsed(), t.recheck_budget) {
                Recheck::Continue => tracing::debug!(pod = %key, vm = %vm.id, ?inspected, "vm state still undecidable"),
                Recheck::Evict(why) => {
                    self.release_leases(vm).await;
                    super::evict::evict(self, key, uid, why).await;
                    return false;
                }
                Recheck::RemoveThenEvict(why) => {
                    if self.remove_then_evict(key, uid, vm, why).await {
                        return false;
                    }
                }
                Recheck::Replay => return true,
                Recheck::Stop => return false,
            }
        }
    }
}
