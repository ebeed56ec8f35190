//! The NIC step of a cloud-hypervisor Windows hibernate (a host invariant: such a guest is
//! saved without its NIC) and its undo.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::super::CocoonProvider;
use super::super::failure::Failure;
use super::super::plan::{LeaseStep, ipconfig};
use crate::kubelet::EventReason;
use crate::runtime::VmRecord;

/// CH + Windows: release the guest's DHCP lease, then hot-remove its NIC.
/// On failure the lease is renewed in the background (the NIC is still there) and the
/// hibernate stops with nothing else to undo.
pub(super) async fn drop_nic(p: &CocoonProvider, vm: &VmRecord) -> Result<(), Failure> {
    let released = tokio::time::timeout(
        Duration::from_secs(20),
        p.ports
            .runtime
            .exec_capture(&vm.id, &ipconfig(LeaseStep::Release, p.cfg.network_mode), None),
    )
    .await;
    p.metrics
        .hibernate_step("dhcp_release", matches!(released, Ok(Ok(ref out)) if out.code == 0));
    match p.ports.runtime.net_resize(&vm.id, 0).await {
        Ok(()) => {
            p.metrics.hibernate_step("netresize", true);
            Ok(())
        }
        Err(e) => {
            p.metrics.hibernate_step("netresize", false);
            renew_detached(p, vm);
            Err(Failure::transient(
                EventReason::HibernateNetResizeFailed,
                format!("drop the NIC of vm {}: {e}; the VM keeps running", vm.id),
            ))
        }
    }
}

/// The undo of [`drop_nic`]: gives the NIC back (detached from the request, bounded
/// at 30 s) and republishes the VM's fresh MAC and address.
pub(super) async fn give_nic_back(p: &CocoonProvider, pod: &Pod, pkey: &str, vm: &VmRecord) {
    let (runtime, id, renew) = (
        p.ports.runtime.clone(),
        vm.id.clone(),
        ipconfig(LeaseStep::Renew, p.cfg.network_mode),
    );
    let restored = p
        .spawn(async move {
            tokio::time::timeout(Duration::from_secs(30), async {
                runtime.net_resize(&id, 1).await?;
                let _ = runtime.exec_capture(&id, &renew, None).await;
                runtime.inspect(&id).await
            })
            .await
        })
        .await;
    match restored {
        Ok(Ok(Ok(current))) => {
            let uid = super::super::table::uid_of(pod);
            p.state.refresh_vm(pkey, &uid, current.clone());
            let ip = p.resolve_ip(&current);
            crate::provider::publish::write_runtime(p, pod, pkey, &current.id, &ip).await;
        }
        other => {
            tracing::warn!(pod = %pkey, vm = %vm.id, outcome = ?other.map(|r| r.map(|r| r.map(|_| ()))), "giving the NIC back failed")
        }
    }
}

/// A lease renew in the guest, detached from the caller.
fn renew_detached(p: &CocoonProvider, vm: &VmRecord) {
    let (runtime, id, renew) = (
        p.ports.runtime.clone(),
        vm.id.clone(),
        ipconfig(LeaseStep::Renew, p.cfg.network_mode),
    );
    p.spawn(async move {
        if let Err(error) = tokio::time::timeout(Duration::from_secs(30), runtime.exec_capture(&id, &renew, None)).await
        {
            tracing::warn!(vm = %id, %error, "ipconfig /renew after a failed NIC drop timed out");
        }
    });
}
