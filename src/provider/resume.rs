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
use crate::kubelet::Next;
use crate::model::{VmSpec, vm_spec};
use crate::policy::contract::bring_up::HibernateEvidence;
use crate::retry::Schedule;

impl CocoonProvider {
    /// Dispatches what the restart owes `pod` (already tracked by the reconcile).
    pub(super) async fn dispatch_owed(&self, pod: &Pod, key: &str) {
        let uid = super::table::uid_of(pod);
        let Some(tracked) = self.state.tracked_as(key, &uid) else {
            return;
        };
        let spec = vm_spec::of_pod(pod);
        if !spec.managed {
            return;
        }
        let op = owed_for(pod, tracked.vm.is_some());
        if op == OwedOp::None {
            return;
        }
        self.metrics.startup_resume.with_label_values(&[op.label()]).inc();
        self.ports
            .events
            .record(pod, false, "ResumedAfterRestart", format!("op={}", op.label()));
        tracing::info!(pod = %key, op = op.label(), "resuming work owed after a restart");
        match (op, tracked.vm) {
            (OwedOp::PostClone, Some(vm)) => self.finish_boot(pod, key, &vm, Finish::resumed_fixup(), false).await,
            (OwedOp::ReadyWait, Some(vm)) => {
                self.finish_boot(pod, key, &vm, Finish::resumed_lease_wait(&spec), false)
                    .await
            }
            (OwedOp::Hibernate | OwedOp::FinishHibernate | OwedOp::ClassifyDropNic, _) => {
                if !self.state.claim_resume(key) {
                    return;
                }
                let (p, pod, key) = (self.arc(), pod.clone(), key.to_string());
                self.spawn(async move {
                    match op {
                        OwedOp::Hibernate => {
                            if let Next::Requeue(after) = p.hibernate_or_owe(&pod, &key).await {
                                p.requeue(&key, after);
                            }
                        }
                        OwedOp::FinishHibernate => p.finish_interrupted_hibernate(&pod, &key, &spec.vm_name).await,
                        _ => p.classify_drop_nic(&pod, &key, &spec).await,
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
        &self,
        vm: &str,
        mut step: impl FnMut(HibernateEvidence) -> Option<T>,
    ) -> Option<T> {
        let t = &self.cfg.timings;
        let started = Instant::now();
        let mut delays = Schedule::backoff(t.recheck_initial, t.recheck_max).exact().delays();
        loop {
            if let Some(done) = step(hibernate_evidence(self, vm).await) {
                return Some(done);
            }
            if started.elapsed() >= t.classify_budget {
                return None;
            }
            if !delays.wait_or_cancel(&self.closing).await {
                return None;
            }
        }
    }

    /// The VM was removed but `hibernated` was never reported: confirm the snapshot.
    async fn finish_interrupted_hibernate(&self, pod: &Pod, key: &str, vm: &str) {
        let settled = self
            .with_evidence_retries(vm, |e| match e {
                HibernateEvidence::Unavailable(error) => {
                    tracing::warn!(pod = %key, %vm, %error, "checking the hibernate snapshot of an interrupted hibernate; retrying");
                    None
                }
                _ => Some(()),
            })
            .await;
        if settled.is_some() {
            self.settle_vanished(pod, key, vm).await;
        } else {
            self.fail_op(
                pod,
                key,
                "ResumeHibernateFailed",
                "reconcile",
                &format!("the hibernate snapshot of vm {vm} could not be checked within the budget"),
            )
            .await;
        }
    }

    /// A CH Windows clone without a fixup marker: restored (its snapshot exists) or fresh?
    async fn classify_drop_nic(&self, pod: &Pod, key: &str, spec: &VmSpec) {
        let uid = super::table::uid_of(pod);
        let Some(vm) = self.state.tracked_as(key, &uid).and_then(|t| t.vm) else {
            return;
        };
        let restored = self
            .with_evidence_retries(&spec.vm_name, |e| match e {
                HibernateEvidence::Found(_) => Some(true),
                HibernateEvidence::None | HibernateEvidence::NotChecked => Some(false),
                HibernateEvidence::Unavailable(_) => None,
            })
            .await;
        match restored {
            Some(true) => self.finish_boot(pod, key, &vm, Finish::LeaseWait, false).await,
            Some(false) => self.finish_boot(pod, key, &vm, Finish::resumed_fixup(), false).await,
            None => {
                let message = format!(
                    "could not tell whether vm {} was restored or freshly cloned: its hibernate evidence stayed unavailable",
                    spec.vm_name
                );
                self.fail_op(pod, key, "ResumeClassifyFailed", "reconcile", &message)
                    .await;
            }
        }
    }
}
