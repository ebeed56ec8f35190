//! Hibernate (the pod's `hibernate` annotation going from false to true) as a saga:
//! settle a VM that is gone or not running, drop the NIC (CH Windows), save the guest, push it
//! to `<vm>:hibernate`, clear the runtime annotations and remove the VM, release its DHCP
//! leases. Each step that changes something the pod or the registry shows records its undo
//! ([`Undo`]) when it succeeds; a later step's failure runs the recorded undos newest first and
//! reports the failure on the pod. The guest's state is always somewhere: a failed save or push
//! keeps the VM running; a failed remove withdraws the tag only once the VM is known to still
//! run (the state is then in the VM), and keeps both when that cannot be told. The pure rules
//! are in [`rules`].

mod nic;
mod rules;

pub(super) use rules::{SavedGuest, saved_guest};

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::bring_up::{hibernate_evidence, saved_snapshot_id};
use super::failure::Failure;
use super::invariants;
use super::lifecycle::LifecycleState;
use super::plan;
use crate::model::vm_spec;
use crate::registry::PushLabels;
use crate::runtime::VmRecord;
use rules::{FailedRemove, NotRunning};

const OP: &str = "hibernate";

/// What a failure from here on must undo. Pushed as steps succeed; run newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Undo {
    /// The NIC was hot-removed: give it back and republish the VM's fresh address.
    GiveNicBack,
    /// `<vm>:hibernate` holds this VM's save: withdraw it, but only while the VM is known to
    /// hold the state itself (it runs); otherwise the tag may be the only copy.
    WithdrawTag,
    /// The runtime annotations were cleared: publish the VM's again.
    RepublishRuntime,
}

/// How the first step left the VM.
enum Checked {
    /// Running (or started again): save it.
    Save,
    /// Not running, and its own save is the hibernate snapshot: only the remove is left.
    AlreadySaved,
    /// The VM was gone: settled without a save (the outcome is the hibernate's).
    Settled(bool),
}

/// One hibernate in flight: the pod, its VM and the undos recorded so far.
struct Saga<'a> {
    p: &'a CocoonProvider,
    pod: &'a Pod,
    pkey: &'a str,
    /// The VM's name: the snapshot and the registry repository are named after it.
    name: String,
    vm: VmRecord,
    done: Vec<Undo>,
}

/// Hibernates the tracked pod's VM. Returns false when it failed (reported on the pod with
/// lifecycle `failed`; the caller owes a retry).
pub(super) async fn hibernate(p: &CocoonProvider, pod: &Pod, pkey: &str) -> bool {
    let uid = super::table::uid_of(pod);
    let Some(tracked) = p.state.tracked_as(pkey, &uid) else {
        return true;
    };
    let spec = vm_spec::of_pod(pod);
    if !spec.managed {
        return true;
    }
    let Some(vm) = tracked.vm else { return true };
    // No fixup or lease wait races the save.
    p.state.stop_guest_work(pkey);
    crate::provider::publish::set_lifecycle(p, pod, pkey, LifecycleState::Hibernating, "").await;
    let mut saga = Saga {
        p,
        pod,
        pkey,
        name: tracked.vm_name,
        vm,
        done: Vec::new(),
    };

    match saga.check_vm().await {
        Ok(Checked::Save) => {}
        Ok(Checked::AlreadySaved) => {
            if p.ports.registry.is_some() {
                saga.done.push(Undo::WithdrawTag);
            }
            return saga.remove().await;
        }
        Ok(Checked::Settled(ok)) => return ok,
        Err(f) => return saga.abort(f, false).await,
    }

    if invariants::nic_less_hibernate(&spec) {
        if let Err(f) = nic::drop_nic(p, &saga.vm).await {
            return saga.abort(f, true).await;
        }
        saga.done.push(Undo::GiveNicBack);
    }

    let saved = crate::provider::transfer::save_snapshot(p, &saga.name, &saga.vm.id).await;
    p.metrics.hibernate_step("snapshot", saved.is_ok());
    if let Err(e) = saved {
        let message = format!(
            "snapshot save {} of vm {}: {e}; the VM keeps running",
            saga.name, saga.vm.id
        );
        return saga
            .abort(
                Failure::transient(crate::kubelet::EventReason::HibernateSnapshotFailed, message),
                true,
            )
            .await;
    }

    if let Some(registry) = &p.ports.registry {
        let name = saga.name.as_str();
        let pushed = crate::provider::transfer::push_snapshot(
            p,
            registry.as_ref(),
            name,
            name,
            plan::HIBERNATE_SNAPSHOT_TAG,
            PushLabels {
                base_image: &spec.image,
                owner: pkey,
            },
        )
        .await;
        p.metrics.hibernate_step("push", pushed.is_ok());
        if let Err(e) = pushed {
            let message = format!("push snapshot {name} to {name}:hibernate: {e}; the VM keeps running");
            return saga
                .abort(
                    Failure::transient(crate::kubelet::EventReason::HibernatePushFailed, message),
                    true,
                )
                .await;
        }
        saga.done.push(Undo::WithdrawTag);
    }
    // The saved guest is new: it is hibernated state, whatever an earlier wake recorded.
    p.state.set_woken_from(&saga.name, None);

    saga.remove().await
}

/// The VM is gone and its state saved: the pod stays, parked.
async fn finish_hibernated(p: &CocoonProvider, pod: &Pod, pkey: &str, uid: &str) {
    p.state.detach_vm(pkey, uid, true);
    p.probes.forget(pkey, Some(uid));
    crate::provider::publish::set_lifecycle(p, pod, pkey, LifecycleState::Hibernated, "").await;
    let how = if p.ports.registry.is_some() {
        "snapshot pushed to registry"
    } else {
        "snapshot saved locally (no registry pusher configured)"
    };
    p.ports.events.record(
        pod,
        crate::kubelet::EventType::Normal,
        crate::kubelet::EventReason::Hibernated,
        how.into(),
    );
    tracing::info!(pod = %pkey, how, "hibernated");
    p.notify(pkey);
}

/// The VM vanished before this hibernate could save it: hibernated if a snapshot holds its
/// state, otherwise reported (nothing can be resumed).
pub(super) async fn settle_vanished(p: &CocoonProvider, pod: &Pod, pkey: &str, vm: &str) -> bool {
    let uid = super::table::uid_of(pod);
    match saved_guest(hibernate_evidence(p, vm).await) {
        SavedGuest::Saved => {
            finish_hibernated(p, pod, pkey, &uid).await;
            true
        }
        SavedGuest::Unknown(error) => {
            crate::provider::publish::fail_op(
                p,
                pod,
                pkey,
                crate::kubelet::EventReason::HibernateEvidenceUnavailable,
                OP,
                &format!("vm {vm} is gone and its hibernate snapshot cannot be checked: {error}; retrying"),
            )
            .await;
            false
        }
        SavedGuest::Absent => {
            p.state.detach_vm(pkey, &uid, false);
            crate::provider::publish::fail_op(
                p,
                pod,
                pkey,
                crate::kubelet::EventReason::HibernateVmVanished,
                OP,
                &format!("vm {vm} disappeared before its state was saved; no hibernate snapshot exists"),
            )
            .await;
            true
        }
    }
}

impl Saga<'_> {
    /// Step 1. A retried or resumed hibernate may find the VM gone (its remove answered late)
    /// or not running (the host restarted): [`rules::not_running`] decides.
    async fn check_vm(&self) -> Result<Checked, Failure> {
        let (p, vm) = (self.p, &self.vm);
        let current = match p.ports.runtime.inspect(&vm.id).await {
            Err(e) if e.is_vm_not_found() => {
                return Ok(Checked::Settled(
                    settle_vanished(p, self.pod, self.pkey, &self.name).await,
                ));
            }
            Ok(current) if !current.state.is_running() => current,
            _ => return Ok(Checked::Save),
        };
        match rules::not_running(saved_snapshot_id(p, &self.name).await, &current.snapshot_ids) {
            NotRunning::RemoveSaved { snapshot } => {
                tracing::info!(pod = %self.pkey, vm = %vm.id, %snapshot, "vm is not running and its own save is the hibernate snapshot: removing it");
                Ok(Checked::AlreadySaved)
            }
            NotRunning::StartThenSave => match p.ports.runtime.start(&vm.id).await {
                Ok(()) => Ok(Checked::Save),
                Err(e) => Err(Failure::transient(
                    crate::kubelet::EventReason::ResumeStartFailed,
                    format!("start stopped vm {} to save it: {e}", vm.id),
                )),
            },
            NotRunning::Retry(error) => Err(Failure::transient(
                crate::kubelet::EventReason::HibernateEvidenceUnavailable,
                format!(
                    "vm {} is {} and its hibernate snapshot cannot be checked: {error}; retrying",
                    vm.id,
                    current.state.as_str()
                ),
            )),
        }
    }

    /// The last step, once the guest is saved: clear the runtime annotations (the id and ip go
    /// first, so the operator never pairs the new manifest with a live VMID), remove the VM,
    /// release its leases (`DECISIONS.md` row 2: only after a successful remove, never after an undo).
    async fn remove(mut self) -> bool {
        let (p, pod, pkey) = (self.p, self.pod, self.pkey);
        let cleared = crate::provider::publish::clear_runtime(p, pod, pkey).await;
        self.done.push(Undo::RepublishRuntime);
        if let Err(e) = p.ports.runtime.remove(&self.vm.id).await {
            let inspected = p.ports.runtime.inspect(&self.vm.id).await;
            match rules::failed_remove(inspected.map(|v| v.state.is_running()).map_err(|e| e.is_vm_not_found())) {
                FailedRemove::Gone => {
                    tracing::info!(pod = %pkey, vm = %self.vm.id, error = %e, "vm rm failed but the vm is gone: hibernated");
                }
                verdict => {
                    p.metrics.hibernate_step("remove", false);
                    let running = verdict == FailedRemove::StillRunning;
                    let kept = if running {
                        "the hibernate tag was withdrawn and the VM keeps running"
                    } else {
                        "the VM is not known to be running, so the hibernate snapshot is kept"
                    };
                    let message = format!("remove vm {} after saving it: {e}; {kept}", self.vm.id);
                    return self
                        .abort(
                            Failure::transient(crate::kubelet::EventReason::HibernateRemoveFailed, message),
                            running,
                        )
                        .await;
                }
            }
        }
        p.metrics.hibernate_step("remove", true);
        if !cleared {
            crate::provider::publish::clear_runtime(p, pod, pkey).await;
        }
        p.release_leases(&self.vm).await;
        finish_hibernated(p, pod, pkey, &super::table::uid_of(pod)).await;
        true
    }

    /// A step failed: run the recorded undos newest first, then report the failure on the pod.
    /// `vm_holds_state`: the VM is known to run with the guest's state (so the tag may go).
    async fn abort(self, failure: Failure, vm_holds_state: bool) -> bool {
        let (p, pod, pkey, vm) = (self.p, self.pod, self.pkey, &self.vm);
        for undo in self.done.iter().rev() {
            match undo {
                Undo::RepublishRuntime => {
                    let ip = p.resolve_ip(vm);
                    crate::provider::publish::write_runtime(p, pod, pkey, &vm.id, &ip).await;
                }
                Undo::WithdrawTag if vm_holds_state => {
                    if let Some(registry) = &p.ports.registry
                        && let Err(e) = registry.delete_manifest(&self.name, plan::HIBERNATE_SNAPSHOT_TAG).await
                    {
                        tracing::warn!(pod = %pkey, name = %self.name, error = %e, "withdrawing the hibernate tag failed; the VM keeps running");
                    }
                }
                Undo::WithdrawTag => {}
                Undo::GiveNicBack => nic::give_nic_back(p, pod, pkey, vm).await,
            }
        }
        crate::provider::publish::fail_op(p, pod, pkey, failure.reason, OP, &failure.message).await;
        false
    }
}
