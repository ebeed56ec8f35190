//! The provider's background loops: the lifecycle reconciler
//! re-flushes intents that did not reach the apiserver; the VM event watcher; the status
//! reconciler keeps the IP annotation on the lease and republishes drifted statuses.

use std::sync::Arc;

use futures::stream::{self, StreamExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::CocoonProvider;
use crate::kubelet_api::source::GuestAddress;
use crate::runtime::VmRecord;

const FAN_OUT: usize = 8;

/// Runs the loops until `shutdown` (or the provider closes), then closes the provider and waits
/// for every task it started ([`CocoonProvider::closed`]).
pub(super) async fn run(p: Arc<CocoonProvider>, shutdown: CancellationToken) {
    let stop = CancellationToken::new();
    let loops = TaskTracker::new();
    loops.spawn(super::watcher::run(p.clone(), stop.clone()));
    loops.spawn(status_loop(p.clone(), stop.clone()));
    loops.spawn(reclaim_loop(p.clone(), stop.clone()));
    loops.close();
    let mut tick = tokio::time::interval(p.cfg.timings.reflush_interval);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = p.closing.cancelled() => break,
            _ = tick.tick() => super::publish::reflush(&p).await,
        }
    }
    stop.cancel();
    p.close();
    loops.wait().await;
    p.closed().await;
}

/// The snapshot reclaimer: a pass once the startup reconcile tracked the pods (before it, every
/// snapshot would look unused), then one per interval.
async fn reclaim_loop(p: Arc<CocoonProvider>, stop: CancellationToken) {
    let Some(period) = p.cfg.timings.reclaim_interval else {
        tracing::info!("snapshot reclaimer off (VK_SNAPSHOT_RECLAIM_INTERVAL=0)");
        return;
    };
    let mut reconciled = p.reconciled.subscribe();
    tokio::select! {
        _ = stop.cancelled() => return,
        r = reconciled.wait_for(|done| *done) => if r.is_err() { return },
    }
    let mut tick = tokio::time::interval(period);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                let removed = super::reclaim::reclaim_snapshots(&p).await;
                tracing::debug!(removed, "snapshot reclaimer pass done");
            }
        }
    }
}

async fn status_loop(p: Arc<CocoonProvider>, stop: CancellationToken) {
    let t = &p.cfg.timings;
    // The first pass `status_initial` after the start, then every `status_period`.
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + t.status_initial, t.status_period);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => p.reconcile_statuses().await,
        }
    }
}

impl CocoonProvider {
    /// One pass of the status reconciler over every tracked pod with a VM.
    pub(super) async fn reconcile_statuses(&self) {
        let keys = self.state.tracked_keys();
        stream::iter(keys)
            .for_each_concurrent(FAN_OUT, |key| async move { self.reconcile_status(&key).await })
            .await;
    }

    async fn reconcile_status(&self, key: &str) {
        let Some(tracked) = self.state.tracked(key) else { return };
        let Some(vm) = tracked.vm.clone() else { return };
        let current = match self.ports.patcher.get_pod(&tracked.pod).await {
            Ok(Some(pod)) => pod,
            Ok(None) => return,
            Err(error) => {
                tracing::debug!(pod = %key, %error, "status reconciler: reading the pod failed; next pass");
                return;
            }
        };
        self.reconcile_endpoint(&current, key, &vm).await;
        if let Some(status) = self.status_of(key, false)
            && !crate::kubelet::status::matches(current.status.as_ref(), &status)
        {
            tracing::info!(pod = %key, "pod status drifted from the provider's view; republishing");
            self.notify(key);
        }
    }

    /// The IP annotation follows the VM's resolved IP (cocoon-net may rebind a MAC) — only while
    /// the VM is the pod's live guest. A hibernate clears the annotation before it removes the
    /// VM; writing the address back then would leave a hibernated pod naming a lease cocoon-net
    /// may hand to another guest. The table's copy of the pod is checked as well as the one read:
    /// it sees the hibernate request before the hibernate starts, a read may predate it.
    pub(super) async fn reconcile_endpoint(&self, pod: &k8s_openapi::api::core::v1::Pod, key: &str, vm: &VmRecord) {
        let hibernating = |pod: &k8s_openapi::api::core::v1::Pod| crate::model::vm_spec::of_pod(pod).hibernate;
        let live = self
            .state
            .tracked(key)
            .is_some_and(|t| !hibernating(&t.pod) && t.vm.as_ref().is_some_and(|v| v.id == vm.id));
        if hibernating(pod) || !live {
            return;
        }
        let ip = self.resolve_ip(vm);
        let annotated = crate::model::RuntimeAnnotations::of_pod(pod).ip;
        let annotated = annotated.as_str();
        if !ip.is_empty() && ip != annotated && crate::model::vm_spec::of_pod(pod).managed {
            tracing::info!(pod = %key, vm = %vm.id, from = annotated, to = %ip, "vm ip changed; updating the ip annotation");
            super::publish::write_runtime(self, pod, key, "", &ip).await;
        }
    }

    /// A probe agent saw readiness flip: repair the endpoint annotation (before the new
    /// readiness is visible to the status, which is republished after).
    async fn repair_endpoint_on_flip(&self, key: &str, uid: &str) {
        let Some(tracked) = self.state.tracked_as(key, uid) else {
            return;
        };
        if let Some(vm) = &tracked.vm {
            self.reconcile_endpoint(&tracked.pod, key, vm).await;
        }
    }

    /// Starts the probe agent of the tracked incarnation (first probe before returning).
    pub(super) async fn start_probe(&self, key: &str, uid: &str) {
        let Some(tracked) = self.state.tracked_as(key, uid) else {
            return;
        };
        if tracked.pod.metadata.deletion_timestamp.is_some() {
            return;
        }
        let me = self.me.clone();
        let (k, u) = (key.to_string(), uid.to_string());
        // When this pod's macOS guest was last inspected for its MAC (dies with the probe).
        let last_inspect = std::sync::Mutex::new(None);
        let target: super::probe::TargetFn = Arc::new(move || {
            let p = me.upgrade()?;
            let t = p.state.tracked_as(&k, &u)?;
            // Only an address the guest networks admit is probed (a refusal is the pod's Ready
            // message); a pending lease is "" to the targets, which say so.
            let ip = match t
                .vm
                .as_ref()
                .map(|vm| super::serving::guest_address(&p, &k, &t.pod, vm))
            {
                Some(GuestAddress::Ip(ip)) => ip.to_string(),
                Some(GuestAddress::Refused(why)) => {
                    let ip = t.vm.as_ref().map(|vm| p.resolve_ip(vm)).unwrap_or_default();
                    p.refused_targets.report(&ip, &why);
                    return Some(super::probe::Target::Unready(format!("not probed: {why}")));
                }
                Some(GuestAddress::Pending(_)) | None => String::new(),
            };
            let probe = crate::model::vm_spec::of_pod(&t.pod).probe;
            if let Some(vm) = t.vm.as_ref().filter(|vm| super::macos::plan::is_macos_vm(vm)) {
                if vm.network_configs.is_empty() {
                    super::macos::reinspect_for_mac(&p, &k, &u, vm.name(), &last_inspect);
                    return Some(super::probe::Target::Unready(
                        "waiting for the guest's network interface (no MAC in cocoon-macos vm inspect yet)".into(),
                    ));
                }
                return Some(super::probe::macos_target(true, &ip, &probe));
            }
            Some(super::probe::target(t.vm.is_some(), &ip, &probe))
        });
        let (me, announcer) = (self.me.clone(), self.me.clone());
        let (k, u, announced) = (key.to_string(), uid.to_string(), key.to_string());
        let on_flip = super::probe::FlipHooks {
            prepare: Arc::new(move |_ready| {
                let (me, k, u) = (me.clone(), k.clone(), u.clone());
                Box::pin(async move {
                    if let Some(p) = me.upgrade() {
                        p.repair_endpoint_on_flip(&k, &u).await;
                    }
                })
            }),
            announce: Arc::new(move |_ready| {
                if let Some(p) = announcer.upgrade() {
                    p.notify(&announced);
                }
            }),
        };
        self.probes.start(key, uid, target, on_flip).await;
    }
}
