//! The provider's read-only face towards the kubelet API and the stats sampler: its tracked
//! pods and their VMs, copied out of the state table.

use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use crate::kubelet_api::source::{PodSource, PodVm};
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

impl PodSource for CocoonProvider {
    fn pods(&self) -> Vec<Pod> {
        let mut out = Vec::new();
        self.state
            .for_each_tracked(|_, claim, _| out.push(Pod::clone(&claim.pod)));
        out
    }

    fn pod(&self, namespace: &str, name: &str) -> Option<(Arc<Pod>, Option<PodVm>)> {
        let t = self.state.tracked(&format!("{namespace}/{name}"))?;
        let vm = t.vm.map(|vm| PodVm {
            ip: self.resolve_ip(&vm).parse().ok(),
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
        self.state.for_each_tracked(|key, t, vm| {
            let Some(vm) = vm else { return };
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
        out
    }
}
