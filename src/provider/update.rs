//! UpdatePod (lifecycle document; behaviour spec §3.4, decision 10): the only update honoured is
//! the hibernate transition. The CPU-class gate runs first, so a wake never resumes a snapshot on
//! a foreign CPU class. A failed hibernate or wake is reported on the pod and retried in the
//! background (15 s doubling to 5 min) while the same incarnation is tracked; it is not returned
//! as an error. Any other update is a no-op that publishes nothing (no status echo).

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::lifecycle;
use super::plan;
use crate::kubelet::ProviderError;
use crate::model::{PodFacts, VmSpec};
use crate::policy::facts::AdmissionContext;

/// What an update asks of the provider (§3.4 decision table).
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

pub(super) async fn update(p: &CocoonProvider, pod: &Pod) -> Result<(), ProviderError> {
    let facts = PodFacts::from_pod(pod);
    let key = facts.key();
    let uid = facts.uid.clone();
    if let Err((reason, message)) = p.admission(&facts, AdmissionContext::Update).await? {
        p.metrics.lifecycle("update", "failed", "snapshot_cpu_class_mismatch");
        p.ports
            .events
            .record(pod, true, "SnapshotCPUClassMismatch", format!("update: {message}"));
        return Err(super::admission_error(&reason, message));
    }
    if p.state.resume_claimed(&key) {
        return Err(ProviderError::Transient(format!(
            "resumed operation still in flight for {key}"
        )));
    }
    let Some(tracked) = p.state.tracked_as(&key, &uid) else {
        p.metrics.lifecycle("update", "skipped", "noop");
        return Ok(());
    };
    p.state.refresh(&key, pod);
    let spec = VmSpec::decode(&facts.annotations);
    if !spec.managed {
        // Decision 8: an unmanaged VM is not ours to hibernate.
        p.metrics.lifecycle("update", "skipped", "noop");
        return Ok(());
    }
    let step = transition(
        plan::hibernate_requested(&tracked.pod),
        plan::hibernate_requested(pod),
        tracked.vm.is_some(),
        tracked.hibernated,
    );
    if step == Transition::BringUp {
        return super::create::create(p, pod).await;
    }
    if step == Transition::Noop {
        republish_if_generation_rose(p, pod, &key).await;
        p.metrics.lifecycle("update", "skipped", "noop");
        return Ok(());
    }
    let lock = p.state.op_lock(&key);
    let _op = lock.lock().await;
    if p.after_transition(&key, &uid, run_transition(p, pod, &key, step).await) {
        p.metrics.lifecycle("update", "ok", "");
    }
    Ok(())
}

async fn run_transition(p: &CocoonProvider, pod: &Pod, key: &str, step: Transition) -> bool {
    match step {
        Transition::Hibernate => p.hibernate(pod, key).await,
        Transition::Wake => p.wake(pod, key).await,
        Transition::BringUp | Transition::Noop => true,
    }
}

/// A newer CocoonSet generation is acknowledged by re-stamping the current intent.
async fn republish_if_generation_rose(p: &CocoonProvider, pod: &Pod, key: &str) {
    let uid = super::state::uid_of(pod);
    let generation = lifecycle::pod_generation(pod.metadata.annotations.as_ref().unwrap_or(&Default::default()));
    if let Some(intent) = p
        .state
        .intent(key)
        .filter(|i| i.uid == uid && i.generation < generation)
    {
        p.set_lifecycle(pod, key, intent.state, &intent.message).await;
    }
}

impl CocoonProvider {
    /// Hibernates now, or owes a retry when that fails (resume after restart, CreatePod adoption).
    pub(super) async fn hibernate_or_owe(&self, pod: &Pod, key: &str) {
        let uid = super::state::uid_of(pod);
        let lock = self.state.op_lock(key);
        let _op = lock.lock().await;
        self.after_transition(key, &uid, self.hibernate(pod, key).await);
    }

    /// After a hibernate or wake: nothing owed once it worked, the next retry owed when it
    /// failed; the status is republished either way. Returns `ok`.
    fn after_transition(&self, key: &str, uid: &str, ok: bool) -> bool {
        if ok {
            self.state.settle_retry(key, uid);
        } else {
            self.owe_retry(key, uid);
        }
        self.notify(key);
        ok
    }

    /// Schedules the next retry of the pod's failed transition (decision 10). A due retry
    /// yields to an operation in flight, and is dropped once the incarnation is forgotten.
    pub(super) fn owe_retry(&self, key: &str, uid: &str) {
        let t = &self.cfg.timings;
        let (delay, token) = self.state.owe_retry(key, uid, t.op_retry_min, t.op_retry_max);
        tracing::info!(pod = %key, ?delay, "hibernate/wake failed; retry owed");
        let (p, key, uid) = (self.arc(), key.to_string(), uid.to_string());
        tokio::spawn(async move {
            tokio::select! {
                _ = p.closing.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            if !p.state.retry_due(&key, token) {
                return;
            }
            let lock = p.state.op_lock(&key);
            let Ok(_op) = lock.try_lock() else {
                p.owe_retry(&key, &uid);
                return;
            };
            let Some(tracked) = p.state.tracked_as(&key, &uid) else {
                return;
            };
            let step = owed_step(
                plan::hibernate_requested(&tracked.pod),
                tracked.vm.is_some(),
                tracked.hibernated,
            );
            if !matches!(step, Transition::Hibernate | Transition::Wake) {
                p.state.settle_retry(&key, &uid);
                return;
            }
            tracing::info!(pod = %key, ?step, "retrying");
            let ok = run_transition(&p, &tracked.pod, &key, step).await;
            p.after_transition(&key, &uid, ok);
        });
    }
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
