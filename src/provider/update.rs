//! UpdatePod (failures retried in the background: `DECISIONS.md` row 10): the only update honoured
//! is the hibernate transition. The CPU-class gate runs first, so a wake never resumes a snapshot
//! on a foreign CPU class. A failed hibernate or wake is reported on the pod and owed a retry: the
//! operation returns [`Next::Requeue`] with the retry's schedule (15 s doubling to 5 min,
//! jittered), the pod controller waits it out and calls [`requeue`], while the same incarnation is
//! tracked; it is not returned as an error. Any other update is a no-op that publishes nothing (no
//! status echo).

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::guest_os;
use super::hibernate;
use super::lifecycle;
use super::owed;
use crate::kubelet::{Next, ProviderError};
use crate::model::{pod_facts, vm_spec};
use crate::policy::contract::cpu_class_admission::AdmissionContext;
use crate::policy::contract::types::RefusalKind;

/// What an update asks of the provider: hibernate, wake, bring up a pod that never booted, or nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Hibernate,
    Wake,
    /// No VM and no hibernated guest (a pod that never booted): bring it up as CreatePod would.
    BringUp,
    Noop,
}

/// What reconciling the wanted state with the pod's VM takes: `hibernate` = the annotation is
/// "true"; `has_vm` = a VM is tracked; `hibernated` = the guest is parked in a snapshot.
pub fn owed_step(hibernate: bool, has_vm: bool, hibernated: bool) -> Transition {
    match (hibernate, has_vm) {
        (true, true) => Transition::Hibernate,
        (false, false) if hibernated => Transition::Wake,
        (false, false) => Transition::BringUp,
        _ => Transition::Noop,
    }
}

/// UpdatePod acts on a *change* of the hibernate annotation only (`was` → `now`). Our own
/// annotation writes come back as updates too: acting on them would retry a failed hibernate
/// at once, on every write, instead of on the owed retry's backoff.
pub fn transition(was: bool, now: bool, has_vm: bool, hibernated: bool) -> Transition {
    if was == now {
        return Transition::Noop;
    }
    owed_step(now, has_vm, hibernated)
}

pub(super) async fn update(p: &CocoonProvider, pod: &Arc<Pod>) -> Result<Next, ProviderError> {
    let facts = pod_facts(pod);
    let key = facts.key();
    let uid = facts.uid.clone();
    if let Err(f) = p.admission(&facts, AdmissionContext::Update).await? {
        p.metrics
            .lifecycle("update", "failed", super::create::admission_label(&f));
        p.ports.events.record(
            pod,
            crate::kubelet::EventType::Warning,
            f.reason,
            format!("update: {}", f.message),
        );
        return Err(f.to_provider_error());
    }
    if p.state.resume_claimed(&key) {
        return Err(ProviderError::Transient(format!(
            "resumed operation still in flight for {key}"
        )));
    }
    let Some(tracked) = p.state.tracked_as(&key, &uid) else {
        p.metrics.lifecycle("update", "skipped", "noop");
        return Ok(Next::Done);
    };
    p.state.refresh(&key, pod);
    let spec = vm_spec::of_pod(pod);
    if !spec.managed {
        // `DECISIONS.md` row 8: an unmanaged VM is not ours to hibernate.
        p.metrics.lifecycle("update", "skipped", "noop");
        return Ok(Next::Done);
    }
    if let Some(own) = guest_os::for_spec(&spec).update(p, pod, &key, &spec).await {
        return own;
    }
    let step = transition(
        vm_spec::of_pod(&tracked.pod).hibernate,
        spec.hibernate,
        tracked.vm.is_some(),
        tracked.hibernated,
    );
    if step == Transition::BringUp {
        return super::create::create(p, pod).await;
    }
    if step == Transition::Noop {
        republish_if_generation_rose(p, pod, &key).await;
        p.metrics.lifecycle("update", "skipped", "noop");
        return Ok(Next::Done);
    }
    let _op = p.state.lock_op(&key).await;
    let result = run_transition(p, pod, &key, step).await;
    if result.is_ok() {
        p.metrics.lifecycle("update", "ok", "");
    }
    Ok(owed::after_transition(p, &key, &uid, result))
}

/// `Err(kind)`: the transition failed (reported on the pod), and `kind` says what a retry can do.
async fn run_transition(p: &CocoonProvider, pod: &Pod, key: &str, step: Transition) -> Result<(), RefusalKind> {
    match step {
        // Every hibernate failure is the host's or the runtime's: it may clear by itself.
        Transition::Hibernate => hibernate::hibernate(p, pod, key)
            .await
            .then_some(())
            .ok_or(RefusalKind::RetryLater),
        Transition::Wake => super::wake::wake(p, pod, key).await,
        Transition::BringUp | Transition::Noop => Ok(()),
    }
}

/// A newer CocoonSet generation is acknowledged by re-stamping the current intent.
async fn republish_if_generation_rose(p: &CocoonProvider, pod: &Pod, key: &str) {
    let uid = super::table::uid_of(pod);
    let generation = lifecycle::pod_generation(pod.metadata.annotations.as_ref().unwrap_or(&Default::default()));
    if let Some(intent) = p
        .state
        .intent(key)
        .filter(|i| i.uid == uid && i.generation < generation)
    {
        super::publish::set_lifecycle(p, pod, key, intent.state, &intent.message).await;
    }
}

/// The provider's requeue hook: runs the retry owed to the pod's failed hibernate or wake, if the
/// same incarnation is still owed one and still wants that transition; asks to be asked again
/// while an operation of the pod (a resumed hibernate) holds its lock.
pub(super) async fn requeue(p: &CocoonProvider, pod: &Pod) -> Result<Next, ProviderError> {
    let (key, uid) = (crate::kubelet::PodKey::of(pod), super::table::uid_of(pod));
    let Some(owed) = p.state.owed_retry_of(key.as_str(), &uid) else {
        return Ok(Next::Done);
    };
    let Some(_op) = p.state.try_lock_op(key.as_str()) else {
        return Ok(Next::Requeue(owed.schedule));
    };
    let Some(tracked) = p.state.tracked_as(key.as_str(), &uid) else {
        return Ok(Next::Done);
    };
    let step = owed_step(
        vm_spec::of_pod(&tracked.pod).hibernate,
        tracked.vm.is_some(),
        tracked.hibernated,
    );
    if !matches!(step, Transition::Hibernate | Transition::Wake) {
        p.state.settle_retry(key.as_str(), &uid);
        return Ok(Next::Done);
    }
    tracing::info!(pod = %key, ?step, "retrying the owed transition");
    let result = run_transition(p, &tracked.pod, key.as_str(), step).await;
    Ok(owed::after_transition(p, key.as_str(), &uid, result))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_update_decision_table() {
        assert_eq!(transition(false, true, true, false), Transition::Hibernate);
        assert_eq!(transition(true, false, false, true), Transition::Wake);
        assert_eq!(
            transition(true, false, false, false),
            Transition::BringUp,
            "asked to stay hibernated with nothing saved, then released"
        );
        assert_eq!(
            transition(false, false, true, false),
            Transition::Noop,
            "an ordinary update of a running pod"
        );
        assert_eq!(
            transition(true, true, false, true),
            Transition::Noop,
            "already hibernated"
        );
        assert_eq!(
            transition(true, true, true, false),
            Transition::Noop,
            "our own write echoing back: the owed retry acts, not the echo"
        );
        assert_eq!(
            transition(false, true, false, true),
            Transition::Noop,
            "asked to hibernate a pod that has no VM: nothing to save"
        );
    }

    #[test]
    fn an_owed_retry_reconciles_the_wanted_state() {
        assert_eq!(owed_step(true, true, false), Transition::Hibernate);
        assert_eq!(owed_step(false, false, true), Transition::Wake);
        assert_eq!(owed_step(false, true, false), Transition::Noop, "woken meanwhile");
        assert_eq!(owed_step(true, false, true), Transition::Noop, "hibernated meanwhile");
    }
}
