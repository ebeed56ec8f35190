//! How a failed operation ends for its pod where more than one guest's path ends it the same
//! way: a create that failed (its provisional row dropped so the retry is a fresh create), a
//! delete that keeps the VM (a VM whose state was not saved is never destroyed).

use k8s_openapi::api::core::v1::Pod;

use super::failure::Failure;
use super::{CocoonProvider, lifecycle, table};
use crate::kubelet::{EventReason, EventType, ProviderError};

/// A create that failed with `f`: Warning Event and lifecycle `failed`, the incarnation
/// untracked (the retry is a fresh create).
pub(super) async fn fail_create<T>(
    p: &CocoonProvider,
    key: &str,
    pod: &Pod,
    restoring: bool,
    f: Failure,
) -> Result<T, ProviderError> {
    p.metrics.wake_ended(restoring, false);
    super::publish::fail_op(p, pod, key, f.reason, "create", &f.message).await;
    p.state.untrack(key, &table::uid_of(pod));
    p.notify(key);
    Err(f.to_provider_error())
}

/// The VM stays (`DECISIONS.md` row 3): record the failure and let the delete retry.
pub(super) fn kept(p: &CocoonProvider, pod: &Pod, key: &str, vm_id: &str, message: String) -> ProviderError {
    keep(p, pod, key, vm_id, &message, "the delete retries");
    ProviderError::Transient(format!("{message}; vm {vm_id} kept"))
}

/// Records a kept VM: a Warning Event saying why and what happens `then`.
pub(super) fn keep(p: &CocoonProvider, pod: &Pod, key: &str, vm_id: &str, message: &str, then: &str) {
    tracing::warn!(pod = %key, vm = %vm_id, %message, "delete kept the vm");
    p.metrics.lifecycle("delete", "failed", "");
    p.ports.events.record(
        pod,
        EventType::Warning,
        EventReason::DeleteKeptVm,
        lifecycle::truncate(
            &format!("delete: {message}; the VM is kept and {then}"),
            lifecycle::MAX_EVENT_NOTE,
        ),
    );
}
