//! The provider's background loops: the lifecycle reconciler
//! re-flushes intents that did not reach the apiserver; the VM event watcher; the status
//! reconciler keeps the IP annotation on the lease (`endpoint.rs`) and republishes drifted
//! statuses.

use std::sync::Arc;

use futures::stream::{self, StreamExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::CocoonProvider;

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
/// snapshot would look unused), then one per interval. Its first pass's `snapshot list` is also
/// the startup's list of the local snapshots (`startup::learn_snapshots` makes none then).
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
            _ = tick.tick() => reconcile_statuses(&p).await,
        }
    }
}

/// One pass of the status reconciler over every tracked pod with a VM.
async fn reconcile_statuses(p: &CocoonProvider) {
    let keys = p.state.tracked_keys();
    stream::iter(keys)
        .for_each_concurrent(FAN_OUT, |key| async move { reconcile_status(p, &key).await })
        .await;
}

async fn reconcile_status(p: &CocoonProvider, key: &str) {
    let Some(tracked) = p.state.tracked(key) else { return };
    let Some(vm) = tracked.vm.clone() else { return };
    let current = match p.ports.patcher.get_pod(&tracked.pod).await {
        Ok(Some(pod)) => pod,
        Ok(None) => return,
        Err(error) => {
            tracing::debug!(pod = %key, %error, "status reconciler: reading the pod failed; next pass");
            return;
        }
    };
    super::endpoint::reconcile_endpoint(p, &current, key, &vm).await;
    if let Some(status) = p.status_of(key, false)
        && !crate::kubelet::status::matches(current.status.as_ref(), &status)
    {
        tracing::info!(pod = %key, "pod status drifted from the provider's view; republishing");
        p.notify(key);
    }
}
