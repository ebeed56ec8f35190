//! `GET /stats/summary`: the kubelet's Summary API (`stats/v1alpha1`) built from a sample
//! (pure). Each VM is one pod with one container (the pod's first): CPU from the VM scope's
//! `cpu.stat`, memory from the VMM's RSS, network from its TAP, and the COW disk as the pod's
//! ephemeral storage and the container's rootfs.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::stats::sample::{FsUsage, GuestNet, Sample, VmSample};

/// `metav1.Time`: RFC 3339 with second precision, UTC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Time(pub String);

impl Time {
    pub fn of(t: SystemTime) -> Self {
        let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let dt = chrono::DateTime::<chrono::Utc>::from_timestamp(secs as i64, 0).unwrap_or_default();
        Time(dt.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    pub start_time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodReference {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    pub start_time: Time,
    pub containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
    #[serde(rename = "process_stats", skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub start_time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    pub time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
}

/// The default interface inline, plus the list (the kubelet's shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkStats {
    pub time: Time,
    #[serde(flatten)]
    pub default: InterfaceStats,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStats>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    pub time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_count: Option<u64>,
}

fn node_fs(time: &Time, fs: &FsUsage) -> FsStats {
    FsStats {
        time: time.clone(),
        available_bytes: Some(fs.available),
        capacity_bytes: Some(fs.capacity),
        used_bytes: Some(fs.used),
        inodes_free: Some(fs.inodes_free),
        inodes: Some(fs.inodes),
        inodes_used: Some(fs.inodes.saturating_sub(fs.inodes_free)),
    }
}

fn cpu(time: &Time, usage_ns: u64, nanocores: Option<u64>) -> CpuStats {
    CpuStats {
        time: time.clone(),
        usage_nano_cores: nanocores,
        usage_core_nano_seconds: Some(usage_ns),
    }
}

fn network(time: &Time, net: &GuestNet) -> Option<NetworkStats> {
    // No traffic at all reads as "no data": the interface is left out, as the Go daemon did.
    if net.rx_bytes == 0 && net.tx_bytes == 0 {
        return None;
    }
    let iface = InterfaceStats {
        name: net.iface.clone(),
        rx_bytes: Some(net.rx_bytes),
        rx_errors: Some(net.rx_errors),
        tx_bytes: Some(net.tx_bytes),
        tx_errors: Some(net.tx_errors),
    };
    Some(NetworkStats {
        time: time.clone(),
        default: iface.clone(),
        interfaces: vec![iface],
    })
}

fn pod(time: &Time, vm: &VmSample, node_fs: Option<&FsUsage>) -> PodStats {
    let t = &vm.target;
    let started = vm.started.or(t.pod_start);
    let pod_start = Time::of(t.pod_start.or(started).unwrap_or(UNIX_EPOCH));
    let container_start = Time::of(started.unwrap_or(UNIX_EPOCH));
    let cpu = cpu(time, vm.cpu_usage_ns(), vm.cpu_nanocores);
    let memory = vm.rss.map(|rss| MemoryStats {
        time: time.clone(),
        available_bytes: None,
        usage_bytes: Some(rss),
        working_set_bytes: Some(rss),
        rss_bytes: Some(rss),
    });
    let disk = vm.cow.map(|cow| FsStats {
        time: time.clone(),
        available_bytes: node_fs.map(|f| f.available),
        capacity_bytes: node_fs.map(|f| f.capacity),
        used_bytes: Some(cow.allocated),
        inodes_free: None,
        inodes: None,
        inodes_used: Some(1),
    });
    PodStats {
        pod_ref: PodReference {
            name: t.pod.clone(),
            namespace: t.namespace.clone(),
            uid: t.uid.clone(),
        },
        start_time: pod_start,
        containers: vec![ContainerStats {
            name: t.container.clone(),
            start_time: container_start,
            cpu: Some(cpu.clone()),
            memory: memory.clone(),
            rootfs: disk.clone(),
        }],
        cpu: Some(cpu),
        memory,
        network: vm.net.as_ref().and_then(|n| network(time, n)),
        ephemeral_storage: disk,
        process_stats: Some(ProcessStats {
            process_count: Some(u64::from(t.pid > 0)),
        }),
    }
}

/// The summary of `sample` for node `node_name`.
pub fn build(sample: &Sample, node_name: &str) -> Summary {
    let time = Time::of(sample.time.unwrap_or(UNIX_EPOCH));
    let n = &sample.node;
    let fs = n.fs.map(|f| node_fs(&time, &f));
    Summary {
        node: NodeStats {
            node_name: node_name.to_string(),
            start_time: Time::of(n.boot_time.unwrap_or(UNIX_EPOCH)),
            cpu: Some(cpu(&time, n.cpu_usage_ns, n.cpu_nanocores)),
            memory: Some(MemoryStats {
                time: time.clone(),
                available_bytes: Some(n.mem_available),
                usage_bytes: Some(n.memory_used()),
                working_set_bytes: Some(n.memory_used()),
                rss_bytes: None,
            }),
            runtime: fs.clone().map(|f| RuntimeStats { image_fs: Some(f) }),
            fs,
        },
        pods: sample.vms.iter().map(|vm| pod(&time, vm, n.fs.as_ref())).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::parse::CpuStat;
    use crate::stats::sample::{CowUsage, NodeSample, VmTarget};
    use std::time::Duration;

    fn sample() -> Sample {
        let t0 = UNIX_EPOCH + Duration::from_secs(1_786_528_800); // 2026-08-12T10:00:00Z
        Sample {
            time: Some(t0),
            node: NodeSample {
                cpu_usage_ns: 9_000_000_000,
                cpu_nanocores: Some(250_000_000),
                mem_total: 1000,
                mem_available: 400,
                fs: Some(FsUsage {
                    capacity: 100,
                    available: 60,
                    used: 40,
                    inodes: 10,
                    inodes_free: 7,
                }),
                boot_time: Some(t0 - Duration::from_secs(3600)),
            },
            vms: vec![VmSample {
                target: VmTarget {
                    namespace: "ns".into(),
                    pod: "agent-0".into(),
                    uid: "u-1".into(),
                    container: "agent".into(),
                    pid: 42,
                    pod_start: Some(t0 - Duration::from_secs(60)),
                    ..Default::default()
                },
                cpu: CpuStat {
                    usage_usec: 2_000_000,
                    ..Default::default()
                },
                cpu_nanocores: Some(100_000_000),
                rss: Some(512 << 20),
                net: Some(GuestNet {
                    iface: "tapABC-0".into(),
                    rx_bytes: 10,
                    tx_bytes: 0,
                    ..Default::default()
                }),
                cow: Some(CowUsage {
                    allocated: 4096,
                    size: 1 << 30,
                }),
                started: Some(t0 - Duration::from_secs(50)),
            }],
        }
    }

    #[test]
    fn the_kubelet_shape() {
        let v = serde_json::to_value(build(&sample(), "node-a")).unwrap();
        assert_eq!(v["node"]["nodeName"], "node-a");
        assert_eq!(v["node"]["startTime"], "2026-08-12T09:00:00Z");
        assert_eq!(v["node"]["cpu"]["usageCoreNanoSeconds"], 9_000_000_000u64);
        assert_eq!(v["node"]["cpu"]["usageNanoCores"], 250_000_000u64);
        assert_eq!(v["node"]["memory"]["workingSetBytes"], 600);
        assert_eq!(v["node"]["memory"]["availableBytes"], 400);
        assert_eq!(v["node"]["fs"]["capacityBytes"], 100);
        assert_eq!(v["node"]["fs"]["inodesUsed"], 3);
        let p = &v["pods"][0];
        assert_eq!(
            p["podRef"],
            serde_json::json!({"name": "agent-0", "namespace": "ns", "uid": "u-1"})
        );
        assert_eq!(p["startTime"], "2026-08-12T09:59:00Z");
        assert_eq!(p["cpu"]["time"], "2026-08-12T10:00:00Z");
        assert_eq!(p["cpu"]["usageCoreNanoSeconds"], 2_000_000_000u64);
        assert_eq!(p["memory"]["workingSetBytes"], 512u64 << 20);
        assert_eq!(p["network"]["name"], "tapABC-0", "the default interface is inline");
        assert_eq!(p["network"]["rxBytes"], 10);
        assert_eq!(p["network"]["interfaces"][0]["name"], "tapABC-0");
        assert_eq!(p["ephemeral-storage"]["usedBytes"], 4096);
        assert_eq!(p["ephemeral-storage"]["capacityBytes"], 100);
        assert_eq!(p["process_stats"]["process_count"], 1);
        let c = &p["containers"][0];
        assert_eq!(c["name"], "agent");
        assert_eq!(c["startTime"], "2026-08-12T09:59:10Z");
        assert_eq!(c["rootfs"]["usedBytes"], 4096);
        assert_eq!(c["memory"]["rssBytes"], 512u64 << 20);
    }

    #[test]
    fn a_silent_nic_and_missing_sources_are_left_out() {
        let mut s = sample();
        s.vms[0].net.as_mut().unwrap().rx_bytes = 0;
        s.vms[0].rss = None;
        s.vms[0].cow = None;
        let v = serde_json::to_value(build(&s, "n")).unwrap();
        let p = &v["pods"][0];
        assert!(p.get("network").is_none());
        assert!(p.get("memory").is_none());
        assert!(p.get("ephemeral-storage").is_none());
        assert!(p.get("cpu").is_some(), "a missing scope reads as zero, not absent");
    }
}
