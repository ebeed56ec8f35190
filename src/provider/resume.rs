//! Work a restart owes, dispatched at the end of the startup reconcile: a hibernate interrupted
//! anywhere resumes (from the save, or just its last step), a guest fixup or lease wait finishes,
//! and a cloud-hypervisor Windows clone is classified as restored or fresh by its hibernate
//! evidence. Operations that change the VM hold a resume claim, so CreatePod, UpdatePod and
//! DeletePod of the pod back off until they are done.

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::bring_up::hibernate_evidence;
use super::guest::Finish;
use super::reconcile::{OwedOp, owed_for};
use crate::kubelet::{EventReason, EventType, Next};
use crate::model::VmSpec;
use crate::policy::contract::bring_up::HibernateEvidence;
use crate::retry::Schedule;

/// Dispatches what the restart owes `pod` (already tracked by the reconcile; `spec` its decoded
/// annotations). Most pods owe nothing: that is decided without copying their tracked row (the
/// startup asks it for every pod), and only a pod that owes work reads its VM.
pub(super) async fn dispatch_owed(p: &CocoonProvider, pod: &Pod, key: &str, spec: &VmSpec) {
    let uid = super::table::uid_of(pod);
    let Some(has_vm) = p.state.has_vm_as(key, &uid) else {
        return;
    };
    if !spec.managed || owed_for(pod, spec, has_vm) == OwedOp::None {
        return;
    }
    let Some(tracked) = p.state.tracked_as(key, &uid) else {
        return;
    };
    // Decided again on the row read: it is the one the work runs on.
    let op = owed_for(pod, spec, tracked.vm.is_some());
    if op == OwedOp::None {
        return;
    }
    let spec = spec.clone();
    p.metrics.startup_resume.with_label_values(&[op.label()]).inc();
    p.ports.events.record(
        pod,
        EventType::Normal,
        EventReason::ResumedAfterRestart,
        format!("op={}", op.label()),
    );
    tracing::info!(pod = %key, op = op.label(), "resuming work owed after a restart");
    match (op, tracked.vm) {
        (OwedOp::PostClone, Some(vm)) => {
            super::guest::finish_boot(p, pod, key, &vm, Finish::resumed_fixup(), false).await
        }
        (OwedOp::ReadyWait, Some(vm)) => {
            super::guest::finish_boot(p, pod, key, &vm, Finish::resumed_lease_wait(&spec), false).await
        }
        (OwedOp::Hibernate | OwedOp::FinishHibernate | OwedOp::ClassifyDropNic, _) => {
            if !p.state.claim_resume(key) {
                return;
            }
            let (owner, pod, key) = (p.arc(), pod.clone(), key.to_string());
            p.spawn(async move {
                let p = &*owner;
                match op {
                    OwedOp::Hibernate => {
                        if let Next::Requeue(after) = super::owed::hibernate_or_owe(p, &pod, &key).await {
                            p.requeue(&key, after);
                        }
                    }
                    OwedOp::FinishHibernate => finish_interrupted_hibernate(p, &pod, &key, &spec.vm_name).await,
                    _ => classify_drop_nic(p, &pod, &key, &spec).await,
                }
                p.state.release_resume(&key);
                p.notify(&key);
            });
        }
        _ => {}
    }
}

/// Retries `step` with the recheck backoff (1 s doubling to 30 s) within the classify
/// budget; `None` when the budget ran out.
async fn with_evidence_retries<T>(
    p: &CocoonProvider,
    vm: &str,
    mut step: impl FnMut(HibernateEvidence) -> Option<T>,
) -> Option<T> {
    let t = &p.cfg.timings;
    let started = Instant::now();
    let mut delays = Schedule::backoff(t.recheck_initial, t.recheck_max).exact().delays();
    loop {
        if let Some(done) = step(hibernate_evidence(p, vm).await) {
            return Some(done);
        }
        if started.elapsed() >= t.classify_budget {
            return None;
        }
        if !delays.wait_or_cancel(&p.closing).await {
            return None;
        }
    }
}

/// The VM was removed but `hibernated` was never reported: confirm the snapshot.
async fn finish_interrupted_hibernate(p: &CocoonProvider, pod: &Pod, key: &str, vm: &str) {
    let settled = with_evidence_retries(p, vm, |e| match e {
            HibernateEvidence::Unavailable(error) => {
                tracing::warn!(pod = %key, %vm, %error, "checking the hibernate snapshot of an interrupted hibernate; retrying");
                None
            }
            _ => Some(()),
        })
        .await;
    if settled.is_some() {
        super::hibernate::settle_vanished(p, pod, key, vm).await;
    } else {
        super::publish::fail_op(
            p,
            pod,
            key,
            EventReason::ResumeHibernateFailed,
            "reconcile",
            &format!("the hibernate snapshot of vm {vm} could not be checked within the budget"),
        )
        .await;
    }
}

/// A CH Windows clone without a fixup marker: restored (its snapshot exists) or fresh?
async fn classify_drop_nic(p: &CocoonProvider, pod: &Pod, key: &str, spec: &VmSpec) {
    let uid = super::table::uid_of(pod);
    let Some(vm) = p.state.tracked_as(key, &uid).and_then(|t| t.vm) else {
        return;
    };
    let restored = with_evidence_retries(p, &spec.vm_name, |e| match e {
        HibernateEvidence::Found(_) => Some(true),
        HibernateEvidence::None | HibernateEvidence::NotChecked => Some(false),
        HibernateEvidence::Unavailable(_) => None,
    })
    .await;
    match restored {
        Some(true) => super::guest::finish_boot(p, pod, key, &vm, Finish::LeaseWait, false).await,
        Some(false) => super::guest::finish_boot(p, pod, key, &vm, Finish::resumed_fixup(), false).await,
        None => {
            let message = format!(
                "could not tell whether vm {} was restored or freshly cloned: its hibernate evidence stayed unavailable",
                spec.vm_name
            );
            super::publish::fail_op(p, pod, key, EventReason::ResumeClassifyFailed, "reconcile", &message).await;
        }
    }
}
