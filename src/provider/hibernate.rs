//! Hibernate (lifecycle document "false → true"; behaviour spec §3.4, decision 2): save the
//! guest, push it to `<vm>:hibernate`, clear the runtime annotations, remove the VM, release its
//! DHCP leases. The guest's state is always somewhere: a failed save or push keeps the VM
//! running; a failed remove withdraws the tag only once the VM is known to still run (the
//! state is then in the VM), and keeps both when that cannot be told. A cloud-hypervisor
//! Windows guest gives up its NIC first and gets it back on any failure.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::create::hibernate_evidence;
use super::invariants;
use super::lifecycle::LifecycleState;
use super::plan::{self, ipconfig};
use crate::model::vm_spec;
use crate::policy::contract::bring_up::HibernateEvidence;
use crate::runtime::VmRecord;

const OP: &str = "hibernate";

impl CocoonProvider {
    /// Hibernates the tracked pod's VM. Returns false when it failed (reported on the pod with
    /// lifecycle `failed`; the caller owes a retry).
    pub(super) async fn hibernate(&self, pod: &Pod, pkey: &str) -> bool {
        let uid = super::table::uid_of(pod);
        let Some(tracked) = self.state.tracked_as(pkey, &uid) else {
            return true;
        };
        let spec = vm_spec::of_pod(pod);
        if !spec.managed {
            return true;
        }
        let Some(vm) = tracked.vm else { return true };
        let name = tracked.vm_name.clone();
        // No fixup or lease wait races the save.
        self.state.stop_guest_work(pkey);
        self.set_lifecycle(pod, pkey, LifecycleState::Hibernating, "").await;

        // A retried or resumed hibernate may find the VM gone (its remove answered late) or
        // stopped (the host restarted). A stopped VM whose own save is the hibernate snapshot is
        // just removed: saving it again would put a cold guest over the saved one. Any other
        // stopped VM is booted and saved: its disk is newer than any snapshot.
        match self.ports.runtime.inspect(&vm.id).await {
            Err(e) if e.is_vm_not_found() => return self.settle_vanished(pod, pkey, &name).await,
            Ok(current) if !current.state.is_running() => match self.saved_snapshot_id(&name).await {
                Ok(Some(id)) if current.snapshot_ids.contains_key(&id) => {
                    tracing::info!(pod = %pkey, vm = %vm.id, snapshot = %id, "vm is not running and its own save is the hibernate snapshot: removing it");
                    return self.remove_saved(pod, pkey, &vm, false).await;
                }
                Ok(_) => {
                    if let Err(e) = self.ports.runtime.start(&vm.id).await {
                        self.fail_op(
                            pod,
                            pkey,
                            "ResumeStartFailed",
                            OP,
                            &format!("start stopped vm {} to save it: {e}", vm.id),
                        )
                        .await;
                        return false;
                    }
                }
                Err(error) => {
                    let message = format!(
                        "vm {} is {} and its hibernate snapshot cannot be checked: {error}; retrying",
                        vm.id,
                        current.state.as_str()
                    );
                    self.fail_op(pod, pkey, "HibernateEvidenceUnavailable", OP, &message)
                        .await;
                    return false;
                }
            },
            _ => {}
        }

        let drop_nic = invariants::nic_less_hibernate(&spec);
        if drop_nic && !self.drop_nic(pod, pkey, &vm).await {
            return false;
        }

        let saved = self.save_snapshot(&name, &vm.id).await;
        self.metrics.hibernate_step("snapshot", saved.is_ok());
        if let Err(e) = saved {
            self.rollback_nic(pod, pkey, &vm, drop_nic).await;
            self.fail_op(
                pod,
                pkey,
                "HibernateSnapshotFailed",
                OP,
                &format!("snapshot save {name} of vm {}: {e}; the VM keeps running", vm.id),
            )
            .await;
            return false;
        }

        if let Some(registry) = &self.ports.registry {
            let pushed = self
                .push_snapshot(
                    registry.as_ref(),
                    &name,
                    &name,
                    plan::HIBERNATE_SNAPSHOT_TAG,
                    &spec.image,
                )
                .await;
            self.metrics.hibernate_step("push", pushed.is_ok());
            if let Err(e) = pushed {
                self.rollback_nic(pod, pkey, &vm, drop_nic).await;
                self.fail_op(
                    pod,
                    pkey,
                    "HibernatePushFailed",
                    OP,
                    &format!("push snapshot {name} to {name}:hibernate: {e}; the VM keeps running"),
                )
                .await;
                return false;
            }
        }

        self.remove_saved(pod, pkey, &vm, drop_nic).await
    }

    /// The snapshot id the hibernated guest lives in: the `:hibernate` tag's (with a registry),
    /// else the local snapshot's. `None` when there is none.
    async fn saved_snapshot_id(&self, name: &str) -> Result<Option<String>, String> {
        match &self.ports.registry {
            Some(registry) => registry
                .snapshot_meta(name, plan::HIBERNATE_SNAPSHOT_TAG)
                .await
                .map(|m| m.map(|m| m.snapshot_id))
                .map_err(|e| e.to_string()),
            None => match self.ports.runtime.snapshot_inspect(name).await {
                Ok(s) => Ok(Some(s.id)),
                Err(e) if e.is_not_found() => Ok(None),
                Err(e) => Err(e.to_string()),
            },
        }
    }

    /// The guest is saved: clear the runtime annotations, remove the VM, release its leases.
    async fn remove_saved(&self, pod: &Pod, pkey: &str, vm: &VmRecord, drop_nic: bool) -> bool {
        let uid = super::table::uid_of(pod);
        // The id/ip go first, so the operator never pairs the new manifest with a live VMID.
        let cleared = self.clear_runtime(pod, pkey).await;
        if let Err(e) = self.ports.runtime.remove(&vm.id).await {
            match self.ports.runtime.inspect(&vm.id).await {
                Err(gone) if gone.is_vm_not_found() => {
                    tracing::info!(pod = %pkey, vm = %vm.id, error = %e, "vm rm failed but the vm is gone: hibernated")
                }
                still => {
                    self.metrics.hibernate_step("remove", false);
                    let running = still.as_ref().is_ok_and(|v| v.state.is_running());
                    return self
                        .compensate_remove(pod, pkey, vm, drop_nic, &e.to_string(), running)
                        .await;
                }
            }
        }
        self.metrics.hibernate_step("remove", true);
        if !cleared {
            self.clear_runtime(pod, pkey).await;
        }
        // Decision 2: leases go after a successful remove, never when a rollback ran.
        self.release_leases(vm).await;
        self.finish_hibernated(pod, pkey, &uid).await;
        true
    }

    /// The VM is gone and its state saved: the pod stays, parked.
    async fn finish_hibernated(&self, pod: &Pod, pkey: &str, uid: &str) {
        self.state.detach_vm(pkey, uid, true);
        self.probes.forget(pkey, Some(uid));
        self.set_lifecycle(pod, pkey, LifecycleState::Hibernated, "").await;
        let how = if self.ports.registry.is_some() {
            "snapshot pushed to registry"
        } else {
            "snapshot saved locally (no registry pusher configured)"
        };
        self.ports.events.record(pod, false, "Hibernated", how.into());
        tracing::info!(pod = %pkey, how, "hibernated");
        self.notify(pkey);
    }

    /// The VM vanished before this hibernate could save it: hibernated if a snapshot holds its
    /// state, otherwise reported (nothing can be resumed).
    pub(super) async fn settle_vanished(&self, pod: &Pod, pkey: &str, vm: &str) -> bool {
        let uid = super::table::uid_of(pod);
        match hibernate_evidence(self, vm).await {
            HibernateEvidence::Found(_) => {
                self.finish_hibernated(pod, pkey, &uid).await;
                true
            }
            HibernateEvidence::Unavailable(error) => {
                self.fail_op(
                    pod,
                    pkey,
                    "HibernateEvidenceUnavailable",
                    OP,
                    &format!("vm {vm} is gone and its hibernate snapshot cannot be checked: {error}; retrying"),
                )
                .await;
                false
            }
            HibernateEvidence::None | HibernateEvidence::NotChecked => {
                self.state.detach_vm(pkey, &uid, false);
                self.fail_op(
                    pod,
                    pkey,
                    "HibernateVMVanished",
                    OP,
                    &format!("vm {vm} disappeared before its state was saved; no hibernate snapshot exists"),
                )
                .await;
                true
            }
        }
    }

    /// `vm rm` failed after the push. A VM that still runs holds the state: withdraw the tag
    /// (so no wake restores a stale copy) and republish its runtime. A VM that is stopped or
    /// cannot be inspected may have lost it: keep the tag (it may be the only copy).
    async fn compensate_remove(
        &self,
        pod: &Pod,
        pkey: &str,
        vm: &VmRecord,
        drop_nic: bool,
        error: &str,
        still_running: bool,
    ) -> bool {
        let name = self.state.tracked(pkey).map(|t| t.vm_name).unwrap_or_default();
        let kept = if still_running {
            if let Some(registry) = &self.ports.registry
                && let Err(e) = registry.delete_manifest(&name, plan::HIBERNATE_SNAPSHOT_TAG).await
            {
                tracing::warn!(pod = %pkey, %name, error = %e, "withdrawing the hibernate tag failed; the VM keeps running");
            }
            "the hibernate tag was withdrawn and the VM keeps running"
        } else {
            "the VM is not known to be running, so the hibernate snapshot is kept"
        };
        self.rollback_nic(pod, pkey, vm, drop_nic).await;
        let ip = self.resolve_ip(vm);
        self.write_runtime(pod, pkey, &vm.id, &ip).await;
        self.fail_op(
            pod,
            pkey,
            "HibernateRemoveFailed",
            OP,
            &format!("remove vm {} after saving it: {error}; {kept}", vm.id),
        )
        .await;
        false
    }

    /// CH + Windows: release the guest's DHCP lease, then hot-remove its NIC.
    async fn drop_nic(&self, pod: &Pod, pkey: &str, vm: &VmRecord) -> bool {
        let released = tokio::time::timeout(
            Duration::from_secs(20),
            self.ports.runtime.exec_capture(&vm.id, &ipconfig("/release"), None),
        )
        .await;
        self.metrics
            .hibernate_step("dhcp_release", matches!(released, Ok(Ok(ref out)) if out.code == 0));
        match self.ports.runtime.net_resize(&vm.id, 0).await {
            Ok(()) => {
                self.metrics.hibernate_step("netresize", true);
                true
            }
            Err(e) => {
                self.metrics.hibernate_step("netresize", false);
                self.renew_detached(vm);
                self.fail_op(
                    pod,
                    pkey,
                    "HibernateNetResizeFailed",
                    OP,
                    &format!("drop the NIC of vm {}: {e}; the VM keeps running", vm.id),
                )
                .await;
                false
            }
        }
    }

    /// Gives a dropped NIC back (detached from the request, bounded at 30 s) and republishes the
    /// VM's fresh MAC and address.
    async fn rollback_nic(&self, pod: &Pod, pkey: &str, vm: &VmRecord, dropped: bool) {
        if !dropped {
            return;
        }
        let runtime = self.ports.runtime.clone();
        let id = vm.id.clone();
        let restored = tokio::spawn(async move {
            tokio::time::timeout(Duration::from_secs(30), async {
                runtime.net_resize(&id, 1).await?;
                let _ = runtime.exec_capture(&id, &ipconfig("/renew"), None).await;
                runtime.inspect(&id).await
            })
            .await
        })
        .await;
        match restored {
            Ok(Ok(Ok(current))) => {
                let uid = super::table::uid_of(pod);
                self.state.refresh_vm(pkey, &uid, current.clone());
                let ip = self.resolve_ip(&current);
                self.write_runtime(pod, pkey, &current.id, &ip).await;
            }
            other => {
                tracing::warn!(pod = %pkey, vm = %vm.id, outcome = ?other.map(|r| r.map(|r| r.map(|_| ()))), "giving the NIC back failed")
            }
        }
    }

    /// `ipconfig /renew` in the guest, detached from the caller.
    fn renew_detached(&self, vm: &VmRecord) {
        let (runtime, id) = (self.ports.runtime.clone(), vm.id.clone());
        tokio::spawn(async move {
            if let Err(error) = tokio::time::timeout(
                Duration::from_secs(30),
                runtime.exec_capture(&id, &ipconfig("/renew"), None),
            )
            .await
            {
                tracing::warn!(vm = %id, %error, "ipconfig /renew after a failed NIC drop timed out");
            }
        });
    }
}
