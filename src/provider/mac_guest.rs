//! A macOS guest as the rest of the provider sees it: the record of its VM (cocoon-macos VMs
//! are never in `cocoon vm list`, so the provider makes one), how a tracked VM is told to be
//! one, and the re-inspection for its MAC that the probe of such a guest waits on. It sits
//! below the macOS path (`macos/`) and the probe start: the macOS path finishes a boot through
//! the guest work, which starts the probe, so the probe may not reach into `macos/`.

use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use super::CocoonProvider;
use crate::hypervisor::Hypervisor;
use crate::runtime::VmRecord;
use crate::runtime::macos::MacVm;
use crate::runtime::parse::Nic;

/// The VM id vk-cocoon publishes for a macOS guest.
pub fn vm_id(name: &str) -> String {
    format!("qemu-{name}")
}

pub const HYPERVISOR: &str = "qemu";

/// Whether a tracked VM is a macOS guest (the CH event watcher, resume and orphan logic skip
/// those).
pub fn is_macos_vm(vm: &VmRecord) -> bool {
    vm.hypervisor.as_str() == HYPERVISOR
}

/// The provider's record of a macOS VM: id `qemu-NAME`, hypervisor `qemu`, and one NIC with the
/// guest's MAC and no static address, so its IP comes from cocoon-net's lease and the lease is
/// released on delete like any DHCP NIC's.
pub fn record(name: &str, vm: &MacVm) -> VmRecord {
    let mut r = VmRecord {
        id: vm_id(name),
        hypervisor: Hypervisor::from(HYPERVISOR),
        state: crate::runtime::VmState::Running,
        pid: vm.pid,
        ..Default::default()
    };
    r.config.name = name.into();
    r.config.image = vm.image.clone();
    if !vm.mac.is_empty() {
        r.network_configs = vec![Nic {
            tap: vm.tap.clone(),
            mac: vm.mac.clone(),
            ..Default::default()
        }];
    }
    r
}

/// A macOS guest whose record shows no MAC yet: inspect it again, at most every
/// `timings.mac_reinspect` per pod (`last` is the pod's probe's own clock), on a task of its
/// own since the probe's target is synchronous. A MAC that appears is attached to the
/// tracked VM, so the next probe looks up the guest's lease by it.
pub(in crate::provider) fn reinspect_for_mac(
    p: &CocoonProvider,
    key: &str,
    uid: &str,
    name: &str,
    last: &Mutex<Option<Instant>>,
) {
    let now = Instant::now();
    {
        let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|at| now.duration_since(at) < p.cfg.timings.mac_reinspect) {
            return;
        }
        *last = Some(now);
    }
    let Some(owner) = p.me.upgrade() else { return };
    let (key, uid, name) = (key.to_string(), uid.to_string(), name.to_string());
    p.spawn(async move {
        let p = owner;
        match p.ports.macos.inspect(&name).await {
            Ok(vm) if !vm.mac.is_empty() => {
                if p.state.refresh_vm(&key, &uid, record(&name, &vm)) {
                    tracing::info!(pod = %key, vm = %name, mac = %vm.mac, "macOS guest's MAC known; its lease decides the address");
                }
            }
            Ok(_) => tracing::debug!(pod = %key, vm = %name, "macOS guest shows no MAC yet; inspected again later"),
            Err(e) => {
                tracing::warn!(pod = %key, vm = %name, error = %e, "inspecting a macOS guest for its MAC failed; tried again later")
            }
        }
    });
}
