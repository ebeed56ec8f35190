//! Eviction (the Go daemon's `evictPod`): the pod of a VM that is gone (or was removed
//! after failing) is deleted, conditioned on its uid, and reported Failed with its `agent`
//! container terminated for the reason. The kubelet then finalizes it like any delete.

use std::time::Duration;

use super::CocoonProvider;
use super::gone::Eviction;
use super::ports::PatchOutcome;
use crate::kubelet::{EventType, ProviderPodStatus};
use crate::retry::Schedule;

/// Delete attempts before the eviction is handed to the background (`evict_backoff` apart).
const ATTEMPTS: usize = 2;

/// Evicts incarnation `uid` of pod `key`. Returns whether the apiserver took the delete; when
/// it did not, the state is kept and the eviction retries in the background.
pub(super) async fn evict(p: &CocoonProvider, key: &str, uid: &str, why: Eviction) -> bool {
    let Some(tracked) = p.state.tracked_as(key, uid) else {
        return false;
    };
    tracing::warn!(pod = %key, reason = why.reason.as_str(), message = %why.message, "evicting the pod");
    // The VM is gone (or was just removed): the delete this eviction triggers must not act
    // on it again, whichever of the two runs first.
    p.state.detach_vm(key, uid, false);
    let mut attempt = 0u32;
    let deleted = Schedule::every(p.cfg.timings.evict_backoff)
        .tries(ATTEMPTS)
        .retry(
            || {
                attempt += 1;
                let (attempt, pod) = (attempt, &tracked.pod);
                async move {
                    p.ports.patcher.delete_pod(pod).await.map_err(|error| {
                        tracing::warn!(pod = %key, attempt, %error, "evicting the pod: delete failed");
                    })
                }
            },
            |_| true,
            |_, _| {},
        )
        .await;
    // Superseded: the object is gone or another incarnation owns the name; either way this
    // incarnation is over.
    if let Ok(PatchOutcome::Applied | PatchOutcome::Superseded(_)) = deleted {
        evicted(p, &tracked.pod, key, uid, why);
        return true;
    }
    p.metrics.pod_evict_failure.inc();
    retry_eviction(p, key.to_string(), uid.to_string(), why);
    false
}

fn evicted(p: &CocoonProvider, pod: &k8s_openapi::api::core::v1::Pod, key: &str, uid: &str, why: Eviction) {
    p.ports.events.record(
        pod,
        EventType::Warning,
        why.reason,
        super::lifecycle::truncate(&format!("evicted: {}", why.message), super::lifecycle::MAX_EVENT_NOTE),
    );
    p.probes.forget(key, Some(uid));
    p.state.stop_guest_work(key);
    p.state
        .evicted(key, uid, ProviderPodStatus::failed(why.reason.as_str(), &why.message));
    p.notify(key);
}

/// Keeps trying an eviction the apiserver refused (it may be down), with backoff, while the
/// same incarnation is tracked.
fn retry_eviction(p: &CocoonProvider, key: String, uid: String, why: Eviction) {
    let owner = p.arc();
    p.spawn(async move {
        let p = owner;
        let mut failures = 0u32;
        let mut delays = Schedule::backoff(Duration::from_secs(1), p.cfg.timings.evict_retry_max).delays();
        loop {
            failures += 1;
            // An unbudgeted backoff never runs out: only the closing provider ends the wait.
            if !delays.wait_or_cancel(&p.closing).await {
                return;
            }
            let Some(tracked) = p.state.tracked_as(&key, &uid) else {
                return;
            };
            match p.ports.patcher.delete_pod(&tracked.pod).await {
                Ok(_) => {
                    evicted(&p, &tracked.pod, &key, &uid, why);
                    return;
                }
                Err(error) => tracing::warn!(pod = %key, %error, failures, "eviction still refused; retrying"),
            }
        }
    });
}
