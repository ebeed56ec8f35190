//! Publication towards the apiserver: lifecycle intents and their
//! flush, Ready (status before the `ready` annotation), failures (Warning Event + lifecycle
//! `failed`), and the runtime annotations.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::lifecycle::{self, Intent, LifecycleState};
use super::ports::PatchOutcome;
use crate::kubelet::{EventReason, EventType};
use crate::model::annotations as key;
use crate::retry::Schedule;

const ATTEMPTS: usize = 3;

/// Stages `state` for `pod`'s incarnation and flushes it; returns whether it was admitted.
pub(super) async fn set_lifecycle(
    p: &CocoonProvider,
    pod: &Pod,
    pkey: &str,
    state: LifecycleState,
    message: &str,
) -> bool {
    let uid = super::table::uid_of(pod);
    let generation = lifecycle::pod_generation(pod.metadata.annotations.as_ref().unwrap_or(&BTreeMap::new()));
    let intent = Intent {
        uid,
        state,
        generation,
        message: lifecycle::truncate(message, lifecycle::MAX_MESSAGE),
    };
    match p.state.stage_intent(pkey, intent, Some(pod)) {
        Ok(intent) => {
            flush(p, pod, pkey, &intent).await;
            true
        }
        Err(dropped) => {
            tracing::debug!(pod = %pkey, ?dropped, state = state.as_str(), "lifecycle write dropped");
            false
        }
    }
}

/// Patches the three lifecycle annotations (uid precondition, 3 attempts); aborts if the
/// intent changed meanwhile; a superseded incarnation drops it.
pub(super) async fn flush(p: &CocoonProvider, pod: &Pod, pkey: &str, intent: &Intent) {
    let changes = &intent.annotations();
    let mut attempt = 0;
    // A failed patch is tried again (`Err`); every other answer ends the flush.
    let _ = patch_schedule(p)
        .retry(
            || {
                attempt += 1;
                let attempt = attempt;
                async move {
                    if !p.state.is_current(pkey, intent) {
                        return Ok(());
                    }
                    match p.ports.patcher.patch_annotations(pod, changes).await {
                        Ok(PatchOutcome::Applied) => {
                            tracing::debug!(pod = %pkey, state = intent.state.as_str(), "lifecycle flushed");
                            p.state.mark_flushed(pkey, intent);
                        }
                        Ok(PatchOutcome::Superseded(why)) => {
                            tracing::info!(pod = %pkey, %why, "pod incarnation superseded; dropping its lifecycle intent");
                            p.state.drop_intent(pkey, &intent.uid);
                        }
                        Err(error) => {
                            tracing::warn!(pod = %pkey, attempt, %error, state = intent.state.as_str(), "lifecycle annotation patch failed");
                            return Err(());
                        }
                    }
                    Ok(())
                }
            },
            |_| true,
            |_, _| {},
        )
        .await;
}

/// The in-operation retry of an apiserver write: [`ATTEMPTS`] tries, `patch_retry` apart.
fn patch_schedule(p: &CocoonProvider) -> Schedule {
    Schedule::every(p.cfg.timings.patch_retry).tries(ATTEMPTS)
}

/// A failed operation: counted `{op, failed, ""}`, then [`report_failure`].
pub(super) async fn fail_op(p: &CocoonProvider, pod: &Pod, pkey: &str, reason: EventReason, op: &str, message: &str) {
    p.metrics.lifecycle(op, "failed", "");
    report_failure(p, pod, pkey, reason, op, message).await;
}

/// A failed operation the caller counted itself (once, under its own reason): Warning Event
/// `reason` ("<op>: <message>", ≤512 bytes) and lifecycle `failed` with the message (≤4096
/// bytes).
pub(super) async fn report_failure(
    p: &CocoonProvider,
    pod: &Pod,
    pkey: &str,
    reason: EventReason,
    op: &str,
    message: &str,
) {
    tracing::warn!(pod = %pkey, %reason, %op, %message, "operation failed");
    p.ports.events.record(
        pod,
        EventType::Warning,
        reason,
        lifecycle::truncate(&format!("{op}: {message}"), lifecycle::MAX_EVENT_NOTE),
    );
    set_lifecycle(p, pod, pkey, LifecycleState::Failed, message).await;
}

/// Publish Ready: stage `ready`, land the status (podIP) first, then the annotation, then notify.
pub(super) async fn publish_ready(p: &CocoonProvider, pod: &Pod, pkey: &str) {
    let uid = super::table::uid_of(pod);
    let generation = lifecycle::pod_generation(pod.metadata.annotations.as_ref().unwrap_or(&BTreeMap::new()));
    let intent = Intent {
        uid,
        state: LifecycleState::Ready,
        generation,
        message: String::new(),
    };
    let Ok(intent) = p.state.stage_intent(pkey, intent, Some(pod)) else {
        p.notify(pkey);
        return;
    };
    if land_status(p, pod, pkey).await {
        flush(p, pod, pkey, &intent).await;
    }
    p.notify(pkey);
}

/// Publish Ready only if the boot it finishes is still current: the incarnation is tracked
/// with VM `vm_id` and no hibernate was requested since. Returns whether it was published.
pub(super) async fn publish_ready_guarded(p: &CocoonProvider, key: &str, uid: &str, vm_id: &str) -> bool {
    let Some(t) = p.state.tracked_as(key, uid) else {
        return false;
    };
    if t.vm.as_ref().is_none_or(|v| v.id != vm_id) || crate::model::vm_spec::of_pod(&t.pod).hibernate {
        return false;
    }
    publish_ready(p, &t.pod, key).await;
    true
}

/// Patches the pod status from the provider's view, Ready from the probe alone
/// (3 attempts); false when it did not land.
async fn land_status(p: &CocoonProvider, pod: &Pod, pkey: &str) -> bool {
    let Some(status) = p.status_of(pkey, true) else {
        return false;
    };
    let status = &status;
    let mut attempt = 0;
    let landed = patch_schedule(p)
        .retry(
            || {
                attempt += 1;
                let attempt = attempt;
                async move {
                    p.ports.patcher.patch_status(pod, status).await.map_err(|error| {
                        tracing::warn!(pod = %pkey, attempt, %error, "status patch before ready failed");
                    })
                }
            },
            |_| true,
            |_, _| {},
        )
        .await;
    matches!(landed, Ok(PatchOutcome::Applied))
}

/// Sets or removes annotations on the pod (3 attempts, uid precondition) and on the tracked
/// copy. Returns whether they landed; a failure is logged (the next pass or restart repairs it).
pub(super) async fn write_annotations(
    p: &CocoonProvider,
    pod: &Pod,
    pkey: &str,
    changes: &BTreeMap<String, Option<String>>,
) -> bool {
    if changes.is_empty() {
        return true;
    }
    p.state.set_annotations(pkey, &super::table::uid_of(pod), changes);
    let mut attempt = 0;
    let written = patch_schedule(p)
        .retry(
            || {
                attempt += 1;
                let attempt = attempt;
                async move {
                    p.ports.patcher.patch_annotations(pod, changes).await.map_err(|error| {
                        tracing::warn!(pod = %pkey, attempt, %error, keys = ?changes.keys().collect::<Vec<_>>(), "annotation patch failed");
                    })
                }
            },
            |_| true,
            |_, _| {},
        )
        .await;
    match written {
        Ok(PatchOutcome::Applied) => true,
        Ok(PatchOutcome::Superseded(why)) => {
            tracing::info!(pod = %pkey, %why, "annotations not written: incarnation superseded");
            false
        }
        Err(()) => false,
    }
}

/// Writes `{id, ip}` (non-empty values only) on the pod and the tracked copy.
pub(super) async fn write_runtime(p: &CocoonProvider, pod: &Pod, pkey: &str, vm_id: &str, ip: &str) -> bool {
    let mut changes = BTreeMap::new();
    if !vm_id.is_empty() {
        changes.insert(key::VM_ID.to_string(), Some(vm_id.to_string()));
    }
    if !ip.is_empty() {
        changes.insert(key::IP.to_string(), Some(ip.to_string()));
    }
    write_annotations(p, pod, pkey, &changes).await
}

/// Clears `id`, `ip` and `post-clone-state` (the VM is going or gone); returns whether it landed.
pub(super) async fn clear_runtime(p: &CocoonProvider, pod: &Pod, pkey: &str) -> bool {
    let changes = BTreeMap::from([
        (key::VM_ID.to_string(), None),
        (key::IP.to_string(), None),
        (key::POST_CLONE_STATE.to_string(), None),
    ]);
    write_annotations(p, pod, pkey, &changes).await
}

/// The lifecycle reconciler: re-flushes intents that have not reached the apiserver.
pub(super) async fn reflush(p: &CocoonProvider) {
    for (pkey, intent, stored) in p.state.unflushed() {
        let tracked = p.state.tracked(&pkey).filter(|t| t.uid == intent.uid).map(|t| t.pod);
        let Some(pod) = tracked.clone().or(stored) else {
            continue;
        };
        if intent.state == LifecycleState::Ready && (tracked.is_none() || !land_status(p, &pod, &pkey).await) {
            continue;
        }
        flush(p, &pod, &pkey, &intent).await;
        p.notify(&pkey);
    }
}
