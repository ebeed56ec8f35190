//! The provider's read-only face towards the kubelet API and the stats sampler: its tracked
//! pods and their VMs, copied out of the state table.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use crate::kubelet::{EventReason, EventType};
use crate::kubelet_api::source::{GuestAddress, PodSource, PodVm};
use crate::runtime::VmRecord;
use crate::stats::{VmTarget, VmTargets};

/// The container name stats are reported under: the pod's first container.
fn first_container(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone())
        .unwrap_or_else(|| "agent".into())
}

fn start_time(pod: &Pod) -> Option<SystemTime> {
    let t = pod.status.as_ref()?.start_time.as_ref()?;
    Some(SystemTime::from(t.0))
}

/// Another pod's VM that pod `key`'s VM record reaches now, by cocoon's ref resolution of its
/// id or by its guest address. Only an unmanaged pod's record can (its id and address are
/// the operator's words, and a VM of that name or address may have come up since the pod
/// adopted them); a managed pod's record is what cocoon reported for its own VM.
fn reaches_foreign_vm(p: &CocoonProvider, key: &str, pod: &Pod, vm: &VmRecord, ip: &str) -> Option<String> {
    if crate::model::vm_spec::of_pod(pod).managed {
        return None;
    }
    if let Some(name) = p.state.foreign_vm_of_ref(&vm.id, key) {
        return Some(name);
    }
    let mut hit = None;
    p.state.for_each_foreign_vm(key, |name, other| {
        if hit.is_none() && !ip.is_empty() && p.resolve_ip(other) == ip {
            hit = Some(name.to_string());
        }
    });
    hit
}

/// Where the node may connect to pod `key`'s guest (probes, port-forward): its resolved
/// address, when the guest networks admit it and — for an unmanaged pod — no other pod's VM
/// has it.
pub(super) fn guest_address(p: &CocoonProvider, key: &str, pod: &Pod, vm: &VmRecord) -> GuestAddress {
    let ip = p.resolve_ip(vm);
    if ip.is_empty() {
        return GuestAddress::Pending("its guest's dhcp lease may still be pending".into());
    }
    let Ok(addr) = ip.parse::<IpAddr>() else {
        return GuestAddress::Refused(format!("vm ip {ip:?} is not an IP address"));
    };
    let managed = crate::model::vm_spec::of_pod(pod).managed;
    if let Err(why) = p.cfg.guest_networks.admit(addr, managed) {
        return GuestAddress::Refused(why.to_string());
    }
    if let Some(other) = reaches_foreign_vm(p, key, pod, vm, &ip) {
        return GuestAddress::Refused(format!("its address {ip} is vm {other}'s, which another pod holds"));
    }
    GuestAddress::Ip(addr)
}

/// Pod `key`'s VM when it reaches no other pod's: the kubelet API and the stats serve it.
/// A record that reaches another pod's VM is served as none, with a Warning Event.
fn own_vm(p: &CocoonProvider, key: &str, pod: &Pod, vm: VmRecord, why: &str) -> Option<VmRecord> {
    let ip = p.resolve_ip(&vm);
    match reaches_foreign_vm(p, key, pod, &vm, &ip) {
        None => Some(vm),
        Some(other) => {
            tracing::warn!(pod = %key, vm = %vm.id, %other, %why, "refused: the pod's VM record reaches another pod's vm");
            p.ports.events.record(
                pod,
                EventType::Warning,
                EventReason::VmOwnedByAnotherPod,
                format!(
                    "{why}: the pre-assigned vm.cocoonstack.io/id {:?} / ip {ip:?} reach vm {other}, which another pod holds; refused",
                    vm.id
                ),
            );
            None
        }
    }
}

impl PodSource for CocoonProvider {
    fn pods(&self) -> Vec<Pod> {
        let mut out = Vec::new();
        self.state
            .for_each_tracked(|_, claim, _| out.push(Pod::clone(&claim.pod)));
        out
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<(Arc<Pod>, Option<PodVm>)> {
        let key = format!("{namespace}/{name}");
        let t = self.state.tracked(&key)?;
        let vm =
            t.vm.and_then(|vm| own_vm(self, &key, &t.pod, vm, "kubelet API"))
                .map(|vm| PodVm {
                    address: guest_address(self, &key, &t.pod, &vm),
                    id: vm.id,
                    hypervisor: vm.hypervisor,
                    pid: vm.pid,
                });
        Some((t.pod, vm))
    }
}

impl VmTargets for CocoonProvider {
    fn vm_targets(&self) -> Vec<VmTarget> {
        let mut out = Vec::new();
        // Unmanaged pods' records are checked after the table's lock is let go.
        let mut unmanaged: Vec<(usize, String, Arc<Pod>, VmRecord)> = Vec::new();
        self.state.for_each_tracked(|key, t, vm| {
            let Some(vm) = vm else { return };
            if !crate::model::vm_spec::of_pod(&t.pod).managed {
                unmanaged.push((out.len(), key.to_string(), t.pod.clone(), vm.clone()));
            }
            let (namespace, pod) = key.split_once('/').unwrap_or(("", key));
            out.push(VmTarget {
                namespace: namespace.to_string(),
                pod: pod.to_string(),
                uid: t.uid.to_string(),
                container: first_container(&t.pod),
                vm_id: vm.id.clone(),
                vm_name: if vm.name().is_empty() {
                    t.vm_name.clone()
                } else {
                    vm.name().to_string()
                },
                hypervisor: vm.hypervisor.clone(),
                pid: vm.pid,
                tap: vm
                    .network_configs
                    .first()
                    .map(|n| n.tap.clone())
                    .filter(|tap| !tap.is_empty()),
                pod_start: start_time(&t.pod),
            });
        });
        let foreign: Vec<usize> = unmanaged
            .into_iter()
            .filter(|(_, key, pod, vm)| reaches_foreign_vm(self, key, pod, vm, &self.resolve_ip(vm)).is_some())
            .map(|(i, ..)| i)
            .collect();
        for i in foreign.into_iter().rev() {
            out.remove(i);
        }
        out
    }
}
