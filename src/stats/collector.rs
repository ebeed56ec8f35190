//! The per-VM and node collector on `:9091/metrics`: `cocoon_vk_vm_*` labelled
//! `vm, pod, namespace, backend`, and `cocoon_vk_node_*`, from the shared sample.

use std::sync::Arc;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;

use super::families::Family;
use super::sample::{Sample, Sampler};

const VM_LABELS: [&str; 4] = ["vm", "pod", "namespace", "backend"];

/// (name, help, is_counter, per VM)
const FAMILIES: [(&str, &str, bool, bool); 11] = [
    (
        "cocoon_vk_vm_cpu_seconds_total",
        "CPU time of the VM's cgroup scope.",
        true,
        true,
    ),
    (
        "cocoon_vk_vm_cpu_throttled_seconds_total",
        "Time the VM's scope was throttled by its CFS quota.",
        true,
        true,
    ),
    (
        "cocoon_vk_vm_cpu_throttled_periods_total",
        "CFS periods in which the VM's scope was throttled.",
        true,
        true,
    ),
    (
        "cocoon_vk_vm_memory_rss_bytes",
        "Resident memory of the VM's hypervisor process.",
        false,
        true,
    ),
    (
        "cocoon_vk_vm_disk_cow_bytes",
        "Allocated bytes of the VM's copy-on-write disk.",
        false,
        true,
    ),
    (
        "cocoon_vk_vm_network_rx_bytes_total",
        "Bytes the VM received on its first NIC.",
        true,
        true,
    ),
    (
        "cocoon_vk_vm_network_tx_bytes_total",
        "Bytes the VM sent on its first NIC.",
        true,
        true,
    ),
    (
        "cocoon_vk_node_cpu_seconds_total",
        "Busy CPU time of the node (/proc/stat).",
        true,
        false,
    ),
    (
        "cocoon_vk_node_memory_used_bytes",
        "MemTotal minus MemAvailable of the node.",
        false,
        false,
    ),
    (
        "cocoon_vk_node_storage_available_bytes",
        "Available bytes of the filesystem holding COCOON_ROOT_DIR.",
        false,
        false,
    ),
    (
        "cocoon_vk_node_storage_total_bytes",
        "Size of the filesystem holding COCOON_ROOT_DIR.",
        false,
        false,
    ),
];

/// Registers into the daemon's registry; every scrape reads the cached sample.
pub struct VmCollector {
    sampler: Arc<Sampler>,
    descs: Vec<Desc>,
}

impl VmCollector {
    pub fn new(sampler: Arc<Sampler>) -> prometheus::Result<Self> {
        let descs = FAMILIES
            .iter()
            .map(|(name, help, _, per_vm)| {
                let labels = if *per_vm {
                    VM_LABELS.iter().map(|l| l.to_string()).collect()
                } else {
                    vec![]
                };
                Desc::new(name.to_string(), help.to_string(), labels, Default::default())
            })
            .collect::<prometheus::Result<_>>()?;
        Ok(Self { sampler, descs })
    }
}

/// The families of one sample (pure).
pub fn families(sample: &Sample) -> Vec<MetricFamily> {
    let mut out: Vec<Family> = FAMILIES
        .iter()
        .map(|(name, help, counter, _)| {
            if *counter {
                Family::counter(name, help)
            } else {
                Family::gauge(name, help)
            }
        })
        .collect();
    for vm in &sample.vms {
        let t = &vm.target;
        let labels = [
            ("vm", t.vm_name.as_str()),
            ("pod", t.pod.as_str()),
            ("namespace", t.namespace.as_str()),
            ("backend", t.hypervisor.as_str()),
        ];
        out[0].push(&labels, vm.cpu.usage_usec as f64 / 1e6, 0);
        out[1].push(&labels, vm.cpu.throttled_usec as f64 / 1e6, 0);
        out[2].push(&labels, vm.cpu.nr_throttled as f64, 0);
        if let Some(rss) = vm.rss {
            out[3].push(&labels, rss as f64, 0);
        }
        if let Some(cow) = vm.cow {
            out[4].push(&labels, cow.allocated as f64, 0);
        }
        if let Some(net) = &vm.net {
            out[5].push(&labels, net.rx_bytes as f64, 0);
            out[6].push(&labels, net.tx_bytes as f64, 0);
        }
    }
    let node = &sample.node;
    out[7].push(&[], node.cpu_usage_ns as f64 / 1e9, 0);
    out[8].push(&[], node.memory_used() as f64, 0);
    if let Some(fs) = node.fs {
        out[9].push(&[], fs.available as f64, 0);
        out[10].push(&[], fs.capacity as f64, 0);
    }
    out.into_iter().filter(|f| !f.is_empty()).map(Family::build).collect()
}

impl Collector for VmCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        families(&self.sampler.sample_blocking())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::parse::CpuStat;
    use crate::stats::sample::{CowUsage, GuestNet, NodeSample, VmSample, VmTarget};

    #[test]
    fn per_vm_families_carry_the_spec_labels() {
        let sample = Sample {
            time: None,
            node: NodeSample {
                cpu_usage_ns: 2_500_000_000,
                mem_total: 100,
                mem_available: 40,
                ..Default::default()
            },
            vms: vec![VmSample {
                target: VmTarget {
                    namespace: "ns".into(),
                    pod: "p".into(),
                    vm_name: "vk-ns-p-abc123".into(),
                    hypervisor: "cloud-hypervisor".into(),
                    ..Default::default()
                },
                cpu: CpuStat {
                    usage_usec: 1_500_000,
                    throttled_usec: 250_000,
                    nr_throttled: 3,
                    nr_periods: 9,
                },
                rss: Some(4096),
                cow: Some(CowUsage {
                    allocated: 8192,
                    size: 1 << 30,
                }),
                net: Some(GuestNet {
                    iface: "tap".into(),
                    rx_bytes: 10,
                    tx_bytes: 20,
                    ..Default::default()
                }),
                ..Default::default()
            }],
        };
        let text = crate::stats::families::encode(&families(&sample));
        let l = r#"{backend="cloud-hypervisor",namespace="ns",pod="p",vm="vk-ns-p-abc123"}"#;
        for line in [
            format!("cocoon_vk_vm_cpu_seconds_total{l} 1.5"),
            format!("cocoon_vk_vm_cpu_throttled_seconds_total{l} 0.25"),
            format!("cocoon_vk_vm_cpu_throttled_periods_total{l} 3"),
            format!("cocoon_vk_vm_memory_rss_bytes{l} 4096"),
            format!("cocoon_vk_vm_disk_cow_bytes{l} 8192"),
            format!("cocoon_vk_vm_network_rx_bytes_total{l} 10"),
            format!("cocoon_vk_vm_network_tx_bytes_total{l} 20"),
            "cocoon_vk_node_cpu_seconds_total 2.5".to_string(),
            "cocoon_vk_node_memory_used_bytes 60".to_string(),
        ] {
            assert!(text.contains(&format!("{line}\n")), "missing {line}:\n{text}");
        }
    }
}
