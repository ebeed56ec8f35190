//! Pure construction of the Node object: resources (capacity, allocatable), labels, taint,
//! addresses, endpoints, conditions — and the merge of our fields into an existing Node.

use super::capacity::HostResources;
use super::config::{KubeletConfig, ResourceOverrides};
use super::quantity::{Quantity, binary_size_suffix};
use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use std::collections::BTreeMap;
use std::net::IpAddr;

pub const LABEL_POOL: &str = "cocoonstack.io/pool";
pub const LABEL_SNAPSHOT_CPU_CLASS: &str = "cocoonstack.io/snapshot-cpu-class";
pub const LABEL_ROLE: &str = "node-role.kubernetes.io/cocoon-vm";
pub const TAINT_KEY: &str = "virtual-kubelet.io/provider";
pub const TAINT_VALUE: &str = "cocoon";
pub const TAINT_EFFECT: &str = "NoSchedule";

/// Capacity and allocatable, as resource name → quantity.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeResources {
    pub capacity: BTreeMap<String, K8sQuantity>,
    pub allocatable: BTreeMap<String, K8sQuantity>,
}

/// Capacity = measured (or overridden) host resources; allocatable = floor(v·(100−pct)/100) for
/// everything but pods (storage from the *available* bytes, or the override). CPU keeps milli
/// precision (4 cores at 20 % ⇒ `3200m`).
pub fn node_resources(
    host: &HostResources,
    overrides: &ResourceOverrides,
    max_pods: u32,
    reserve_percent: u8,
) -> NodeResources {
    let cpu = overrides.cpu.unwrap_or(Quantity::from_units(host.cpus));
    let memory = overrides.memory.unwrap_or(Quantity::from_units(host.memory_bytes));
    let storage_total = overrides
        .storage
        .unwrap_or(Quantity::from_units(host.storage_total_bytes));
    let storage_base = overrides
        .storage
        .unwrap_or(Quantity::from_units(host.storage_available_bytes));
    let mut capacity = BTreeMap::new();
    let mut allocatable = BTreeMap::new();
    let q = |s: String| K8sQuantity(s);
    capacity.insert("cpu".into(), q(cpu.to_cpu_string()));
    allocatable.insert("cpu".into(), q(cpu.minus_percent(reserve_percent).to_cpu_string()));
    capacity.insert("memory".into(), q(memory.to_units_string()));
    allocatable.insert(
        "memory".into(),
        q(memory.minus_percent(reserve_percent).to_units_string()),
    );
    capacity.insert("ephemeral-storage".into(), q(storage_total.to_units_string()));
    allocatable.insert(
        "ephemeral-storage".into(),
        q(storage_base.minus_percent(reserve_percent).to_units_string()),
    );
    capacity.insert("pods".into(), q(max_pods.to_string()));
    allocatable.insert("pods".into(), q(max_pods.to_string()));
    let page_size = host.hugepages.map_or(2 << 20, |h| h.page_size_bytes);
    let hugepages = overrides.hugepages.or_else(|| {
        host.hugepages
            .map(|h| Quantity::from_units(h.page_size_bytes * h.total_pages))
    });
    if let Some(hp) = hugepages.filter(|hp| hp.millis() > 0) {
        let key = format!("hugepages-{}", binary_size_suffix(page_size));
        capacity.insert(key.clone(), q(hp.to_units_string()));
        allocatable.insert(key, q(hp.minus_percent(reserve_percent).to_units_string()));
    }
    NodeResources { capacity, allocatable }
}

/// The labels vk-cocoon owns on its node.
pub fn node_labels(cfg: &KubeletConfig) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_POOL.to_string(), cfg.node_pool.clone());
    labels.insert(LABEL_ROLE.to_string(), String::new());
    labels.insert("kubernetes.io/hostname".to_string(), cfg.node_name.clone());
    labels.insert("kubernetes.io/os".to_string(), "linux".to_string());
    labels.insert("kubernetes.io/arch".to_string(), k8s_arch().to_string());
    labels.insert("type".to_string(), "virtual-kubelet".to_string());
    if let Some(class) = &cfg.snapshot_cpu_class {
        labels.insert(LABEL_SNAPSHOT_CPU_CLASS.to_string(), class.clone());
    }
    labels
}

/// The virtual-kubelet taint.
pub fn provider_taint() -> Taint {
    Taint {
        key: TAINT_KEY.into(),
        value: Some(TAINT_VALUE.into()),
        effect: TAINT_EFFECT.into(),
        time_added: None,
    }
}

fn k8s_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn condition(type_: &str, status: &str, reason: &str, message: &str, now: &Time) -> NodeCondition {
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message.into()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

/// The static conditions the Go daemon always reported (Ready, no disk, memory or PID pressure,
/// network available), heartbeat at `now`. Transition times are kept from `previous` when the
/// condition's status did not change.
pub fn node_conditions(now: &Time, previous: Option<&[NodeCondition]>) -> Vec<NodeCondition> {
    let mut conditions = vec![
        condition("Ready", "True", "KubeletReady", "vk-cocoon is ready", now),
        condition(
            "DiskPressure",
            "False",
            "KubeletHasNoDiskPressure",
            "kubelet has no disk pressure",
            now,
        ),
        condition(
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
            now,
        ),
        condition(
            "PIDPressure",
            "False",
            "KubeletHasSufficientPID",
            "kubelet has sufficient PID available",
            now,
        ),
        condition(
            "NetworkUnavailable",
            "False",
            "RouteCreated",
            "NodeController create implicit route",
            now,
        ),
    ];
    if let Some(prev) = previous {
        for c in &mut conditions {
            if let Some(p) = prev.iter().find(|p| p.type_ == c.type_ && p.status == c.status)
                && p.last_transition_time.is_some()
            {
                c.last_transition_time = p.last_transition_time.clone();
            }
        }
    }
    conditions
}

/// The node status vk-cocoon publishes.
pub fn node_status(
    cfg: &KubeletConfig,
    node_ip: IpAddr,
    resources: &NodeResources,
    now: &Time,
    previous: Option<&NodeStatus>,
) -> NodeStatus {
    NodeStatus {
        capacity: Some(resources.capacity.clone()),
        allocatable: Some(resources.allocatable.clone()),
        conditions: Some(node_conditions(now, previous.and_then(|p| p.conditions.as_deref()))),
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".into(),
                address: node_ip.to_string(),
            },
            NodeAddress {
                type_: "Hostname".into(),
                address: cfg.hostname.clone(),
            },
        ]),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: cfg.kubelet_port as i32,
            }),
        }),
        node_info: Some(NodeSystemInfo {
            kubelet_version: cfg.kubelet_version.clone(),
            operating_system: "linux".into(),
            architecture: k8s_arch().into(),
            ..Default::default()
        }),
        phase: Some("Running".into()),
        declared_features: (!cfg.declared_features.is_empty()).then(|| cfg.declared_features.clone()),
        ..Default::default()
    }
}

/// A fresh Node object for `create`.
pub fn build_node(cfg: &KubeletConfig, node_ip: IpAddr, resources: &NodeResources, now: &Time) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(cfg.node_name.clone()),
            labels: Some(node_labels(cfg)),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![provider_taint()]),
            provider_id: cfg.provider_id.clone(),
            ..Default::default()
        }),
        status: Some(node_status(cfg, node_ip, resources, now, None)),
    }
}

/// Our metadata/spec fields merged into an existing Node (for `replace`): our labels set, the
/// CPU-class label removed when unset, the taint added when no taint with its key exists,
/// providerID set when configured. Everything else (other labels, taints, annotations) is kept.
/// Returns `None` when nothing would change.
pub fn merge_into_existing(existing: &Node, cfg: &KubeletConfig) -> Option<Node> {
    let mut node = existing.clone();
    let labels = node.metadata.labels.get_or_insert_with(BTreeMap::new);
    for (k, v) in node_labels(cfg) {
        labels.insert(k, v);
    }
    if cfg.snapshot_cpu_class.is_none() {
        labels.remove(LABEL_SNAPSHOT_CPU_CLASS);
    }
    let spec = node.spec.get_or_insert_with(NodeSpec::default);
    let taints = spec.taints.get_or_insert_with(Vec::new);
    if !taints.iter().any(|t| t.key == TAINT_KEY) {
        taints.push(provider_taint());
    }
    if let Some(id) = &cfg.provider_id {
        spec.provider_id = Some(id.clone());
    }
    (node != *existing).then_some(node)
}

#[cfg(test)]
mod tests {
    use super::super::capacity::HugePages;
    use super::super::config::KubeletConfig;
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn host() -> HostResources {
        HostResources {
            cpus: 4,
            memory_bytes: 16 << 30,
            storage_total_bytes: 1000 << 30,
            storage_available_bytes: 500 << 30,
            hugepages: None,
        }
    }

    fn cfg(vars: &[(&str, &str)]) -> KubeletConfig {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        KubeletConfig::from_lookup(|k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())).unwrap()
    }

    fn get(m: &BTreeMap<String, K8sQuantity>, k: &str) -> String {
        m.get(k).map(|q| q.0.clone()).unwrap_or_default()
    }

    #[test]
    fn capacity_and_allocatable_with_reserve() {
        let r = node_resources(&host(), &ResourceOverrides::default(), 256, 20);
        assert_eq!(get(&r.capacity, "cpu"), "4");
        assert_eq!(get(&r.allocatable, "cpu"), "3200m");
        assert_eq!(get(&r.capacity, "memory"), (16u64 << 30).to_string());
        assert_eq!(get(&r.allocatable, "memory"), ((16u64 << 30) * 80 / 100).to_string());
        assert_eq!(get(&r.capacity, "ephemeral-storage"), (1000u64 << 30).to_string());
        // allocatable storage comes from the available bytes
        assert_eq!(
            get(&r.allocatable, "ephemeral-storage"),
            ((500u64 << 30) * 80 / 100).to_string()
        );
        assert_eq!(get(&r.capacity, "pods"), "256");
        assert_eq!(get(&r.allocatable, "pods"), "256");
        assert!(!r.capacity.keys().any(|k| k.starts_with("hugepages-")));
    }

    #[test]
    fn overrides_replace_measurements() {
        let o = ResourceOverrides {
            cpu: Some(Quantity::parse("7500m").unwrap()),
            memory: Some(Quantity::parse("8Gi").unwrap()),
            storage: Some(Quantity::parse("100G").unwrap()),
            hugepages: Some(Quantity::parse("1Gi").unwrap()),
        };
        let r = node_resources(&host(), &o, 10, 10);
        assert_eq!(get(&r.capacity, "cpu"), "7500m");
        assert_eq!(get(&r.allocatable, "cpu"), "6750m");
        assert_eq!(get(&r.capacity, "memory"), (8u64 << 30).to_string());
        assert_eq!(get(&r.capacity, "ephemeral-storage"), "100000000000");
        assert_eq!(get(&r.allocatable, "ephemeral-storage"), "90000000000");
        assert_eq!(get(&r.capacity, "hugepages-2Mi"), (1u64 << 30).to_string());
        assert_eq!(get(&r.capacity, "pods"), "10");
    }

    #[test]
    fn measured_hugepages_follow_the_page_size() {
        let mut h = host();
        h.hugepages = Some(HugePages {
            page_size_bytes: 1 << 30,
            total_pages: 4,
        });
        let r = node_resources(&h, &ResourceOverrides::default(), 256, 25);
        assert_eq!(get(&r.capacity, "hugepages-1Gi"), (4u64 << 30).to_string());
        assert_eq!(get(&r.allocatable, "hugepages-1Gi"), (3u64 << 30).to_string());
    }

    #[test]
    fn node_object_has_labels_taint_endpoints() {
        let c = cfg(&[
            ("VK_NODE_NAME", "vk-1"),
            ("VK_SNAPSHOT_CPU_CLASS", "icx"),
            ("VK_PROVIDER_ID", "cocoon://vk-1"),
            ("VK_KUBELET_PORT", "10255"),
            ("VK_NODE_HOSTNAME", "vk-1.example"),
        ]);
        let now = Time(Timestamp::UNIX_EPOCH);
        let n = build_node(
            &c,
            "10.0.0.9".parse().unwrap(),
            &node_resources(&host(), &c.overrides, 256, 20),
            &now,
        );
        let labels = n.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_POOL], "default");
        assert_eq!(labels[LABEL_SNAPSHOT_CPU_CLASS], "icx");
        assert_eq!(labels[LABEL_ROLE], "");
        let spec = n.spec.as_ref().unwrap();
        assert_eq!(spec.taints.as_ref().unwrap(), &vec![provider_taint()]);
        assert_eq!(spec.provider_id.as_deref(), Some("cocoon://vk-1"));
        let st = n.status.as_ref().unwrap();
        assert_eq!(
            st.daemon_endpoints
                .as_ref()
                .unwrap()
                .kubelet_endpoint
                .as_ref()
                .unwrap()
                .port,
            10255
        );
        let addrs = st.addresses.as_ref().unwrap();
        assert!(addrs.iter().any(|a| a.type_ == "InternalIP" && a.address == "10.0.0.9"));
        assert!(
            addrs
                .iter()
                .any(|a| a.type_ == "Hostname" && a.address == "vk-1.example")
        );
        let conds = st.conditions.as_ref().unwrap();
        let ready = conds.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("True", Some("KubeletReady"))
        );
        assert_eq!(conds.len(), 5);
        assert!(st.node_info.as_ref().unwrap().kubelet_version.starts_with('v'));
        assert_eq!(
            st.declared_features.as_deref(),
            Some(&["ExtendWebSocketsToKubelet".to_string()][..]),
            "a 1.36 apiserver forwards the streaming WebSockets to a node that declares this"
        );
    }

    #[test]
    fn merge_sets_our_fields_and_keeps_the_rest() {
        let c = cfg(&[("VK_NODE_NAME", "vk-1")]);
        let mut existing = Node::default();
        existing.metadata.name = Some("vk-1".into());
        existing.metadata.labels = Some(BTreeMap::from([
            ("other".to_string(), "keep".to_string()),
            (LABEL_SNAPSHOT_CPU_CLASS.to_string(), "stale".to_string()),
        ]));
        existing.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "x".into(),
                effect: "NoExecute".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let merged = merge_into_existing(&existing, &c).expect("changes");
        let labels = merged.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["other"], "keep");
        assert!(
            !labels.contains_key(LABEL_SNAPSHOT_CPU_CLASS),
            "unset class removes the label"
        );
        assert_eq!(labels[LABEL_POOL], "default");
        let taints = merged.spec.as_ref().unwrap().taints.as_ref().unwrap();
        assert_eq!(taints.len(), 2);
        // Idempotent: merging again changes nothing.
        assert_eq!(merge_into_existing(&merged, &c), None);
        // An existing taint with our key (any value/effect) is left alone.
        let mut custom = merged.clone();
        custom.spec.as_mut().unwrap().taints = Some(vec![Taint {
            key: TAINT_KEY.into(),
            effect: "NoExecute".into(),
            ..Default::default()
        }]);
        assert_eq!(merge_into_existing(&custom, &c), None);
    }

    #[test]
    fn transition_times_survive_a_heartbeat() {
        let t0 = Time(Timestamp::UNIX_EPOCH);
        let t1 = Time(Timestamp::from_second(60).unwrap());
        let first = node_conditions(&t0, None);
        let second = node_conditions(&t1, Some(&first));
        assert!(
            second
                .iter()
                .all(|c| c.last_transition_time == Some(t0.clone()) && c.last_heartbeat_time == Some(t1.clone()))
        );
    }
}
