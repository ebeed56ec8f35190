//! `/stats/summary` and `/metrics/resource` through the apiserver's nodes proxy, decoded the
//! way metrics-server decodes them.

use super::*;

// The kubelet's stats types, as metrics-server decodes them (the fields it reads).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Summary {
    node: NodeStats,
    pods: Vec<PodStats>,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeStats {
    node_name: String,
    cpu: CpuStats,
    memory: MemoryStats,
    fs: FsStats,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodStats {
    pod_ref: PodRef,
    containers: Vec<ContainerStats>,
    cpu: CpuStats,
    memory: MemoryStats,
    network: Option<NetworkStats>,
    #[serde(rename = "ephemeral-storage")]
    ephemeral_storage: FsStats,
}
#[derive(Deserialize)]
struct PodRef {
    name: String,
    namespace: String,
    uid: String,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerStats {
    name: String,
    cpu: CpuStats,
    memory: MemoryStats,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CpuStats {
    time: String,
    usage_core_nano_seconds: u64,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MemoryStats {
    working_set_bytes: u64,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkStats {
    name: String,
    rx_bytes: u64,
    tx_bytes: u64,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FsStats {
    used_bytes: Option<u64>,
    capacity_bytes: Option<u64>,
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_summary_and_resource_metrics_through_the_nodes_proxy() {
    let Some(node) = node_with_pod("stats").await else {
        return;
    };
    node.machine.sim.set_cpu_stat("vm-web", 2_500_000, 300_000, 4).unwrap();
    let pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(node.admin.clone(), &node.ns)
        .get("web-0")
        .await
        .unwrap();
    // The sample is cached for 2 s: wait for one taken after the write.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let s = loop {
        let (status, body) = node.as_apiserver("/stats/summary").await;
        assert_eq!(status, 200, "{body}");
        let s: Summary = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        if s.pods.iter().any(|p| p.cpu.usage_core_nano_seconds == 2_500_000_000) {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "the VM's CPU never shows: {body}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(s.node.node_name, node.machine.node);
    assert!(s.node.cpu.usage_core_nano_seconds > 0 && s.node.memory.working_set_bytes > 0);
    assert!(s.node.fs.capacity_bytes.unwrap_or(0) > 0);
    assert_eq!(s.pods.len(), 1, "one pod on the node");
    let p = &s.pods[0];
    assert_eq!(
        (
            p.pod_ref.namespace.as_str(),
            p.pod_ref.name.as_str(),
            p.pod_ref.uid.as_str()
        ),
        (node.ns.as_str(), "web-0", pod.metadata.uid.as_deref().unwrap())
    );
    assert_eq!(p.containers[0].name, "agent");
    assert_eq!(p.containers[0].cpu.usage_core_nano_seconds, 2_500_000_000);
    assert!(!p.cpu.time.is_empty());
    assert!(
        p.memory.working_set_bytes >= 8 << 20 && p.containers[0].memory.working_set_bytes == p.memory.working_set_bytes,
        "the VMM's RSS holds the 8 MiB it touched: {}",
        p.memory.working_set_bytes
    );
    assert!(
        p.ephemeral_storage.used_bytes.unwrap_or(0) >= 64 * 1024,
        "the COW disk's allocation"
    );
    let vm = node.machine.vms_named("vm-web").await.remove(0);
    if vk_cocoon::host::process::effective_uid() == 0 {
        let net = p.network.as_ref().expect("the TAP's traffic");
        assert_eq!(net.name, vm.network_configs[0].tap);
        assert_eq!(
            (net.tx_bytes, net.rx_bytes),
            (3000, 0),
            "what the guest sent on its TAP"
        );
    }

    let (status, text) = node.as_apiserver("/metrics/resource").await;
    assert_eq!(status, 200, "{text}");
    let series = |name: &str| -> Vec<(String, f64, i64)> {
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .map(|l| {
                let mut parts = l.rsplitn(3, ' ');
                let ts = parts.next().unwrap().parse().unwrap();
                let v = parts.next().unwrap().parse().unwrap();
                (parts.next().unwrap().to_string(), v, ts)
            })
            .collect()
    };
    let labels = format!(r#"{{namespace="{}",pod="web-0"}}"#, node.ns);
    let pod_cpu = series("pod_cpu_usage_seconds_total");
    assert_eq!(pod_cpu.len(), 1, "{text}");
    assert_eq!(pod_cpu[0].0, format!("pod_cpu_usage_seconds_total{labels}"));
    assert_eq!(pod_cpu[0].1, 2.5);
    let now_ms = chrono::Utc::now().timestamp_millis();
    assert!(
        (now_ms - pod_cpu[0].2).abs() < 60_000,
        "a sample timestamp: {}",
        pod_cpu[0].2
    );
    let c = series("container_cpu_cfs_throttled_periods_total");
    assert_eq!(c[0].1, 4.0, "{text}");
    assert!(series("container_memory_working_set_bytes")[0].1 >= (8 << 20) as f64);
    assert_eq!(series("node_cpu_usage_seconds_total").len(), 1);
    assert!(text.contains("resource_scrape_error 0"), "{text}");

    // The same sample on :9091.
    let m = node.daemon.scrape_metrics().unwrap();
    assert!(m.contains(&format!(
        r#"cocoon_vk_vm_cpu_seconds_total{{backend="cloud-hypervisor",namespace="{}",pod="web-0",vm="vm-web"}} 2.5"#,
        node.ns
    )), "{m}");
}

/// `usageNanoCores` of the node, of pod web-0 and of its container in a Summary, and the
/// pod's `usageCoreNanoSeconds`.
fn rates(summary: &serde_json::Value) -> (Option<u64>, Option<u64>, Option<u64>, u64) {
    let pod = &summary["pods"][0];
    (
        summary["node"]["cpu"]["usageNanoCores"].as_u64(),
        pod["cpu"]["usageNanoCores"].as_u64(),
        pod["containers"][0]["cpu"]["usageNanoCores"].as_u64(),
        pod["cpu"]["usageCoreNanoSeconds"].as_u64().unwrap_or(0),
    )
}

async fn summary_json(node: &Node) -> serde_json::Value {
    let (status, body) = node.as_apiserver("/stats/summary").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_summary_carries_the_cpu_rate_over_the_last_two_samples() {
    let Some(node) = node_with_pod("rate").await else {
        return;
    };
    node.machine.sim.set_cpu_stat("vm-web", 1_000_000, 0, 0).unwrap();
    // A rate needs an interval: the daemon has been up for a while before anyone asks (a
    // kubelet's first Summary after a few seconds carries it too).
    let up = std::time::Instant::now();
    eventually(30, "the daemon is 3 s older", || async {
        up.elapsed() > Duration::from_secs(3)
    })
    .await;

    // The first Summary anyone asks for. (The pod's rate may still be missing here, as on a
    // kubelet: its VM may be younger than the sample before.)
    let asked = std::time::Instant::now();
    let first = summary_json(&node).await;
    let (node_rate, pod_rate, container_rate, _) = rates(&first);
    assert!(
        node_rate.is_some_and(|r| r > 0),
        "the node's usageNanoCores (its CPUs are never idle while the tests run): {first}"
    );
    assert_eq!(container_rate, pod_rate, "the container is the pod's one VM");

    // The VM uses 4 core-seconds: the Summary that first shows it has the rate over that
    // sample and the one before. Samples are at least the cache's life (2 s) apart, and the
    // one before was taken at most 2 s before `first` was asked for (`first` was at most that
    // old) — so the interval is between 2 s and the time since then plus 2 s.
    node.machine.sim.set_cpu_stat("vm-web", 5_000_000, 0, 0).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let seen = loop {
        let s = summary_json(&node).await;
        if rates(&s).3 == 5_000_000_000 {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the VM's new CPU time never shows: {s}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let longest = asked.elapsed() + Duration::from_millis(2500);
    let (_, pod_rate, container_rate, _) = rates(&seen);
    let pod_rate = pod_rate.unwrap_or_else(|| panic!("the pod's usageNanoCores: {seen}"));
    // 1.5 s rather than 2 s: the rate is over wall-clock time, the cache's life monotonic.
    let (low, high) = ((4e9 / longest.as_secs_f64()) as u64, (4e9 / 1.5) as u64);
    assert!(
        (low..=high).contains(&pod_rate),
        "4 core-seconds over 1.5 to {longest:?} between two samples: {pod_rate} nanocores"
    );
    assert_eq!(container_rate, Some(pod_rate));

    // /metrics/resource has the same counter (the kubelet's resource metrics carry no rate).
    let (status, text) = node.as_apiserver("/metrics/resource").await;
    assert_eq!(status, 200, "{text}");
    let pod_cpu = format!(
        r#"pod_cpu_usage_seconds_total{{namespace="{}",pod="web-0"}} 5 "#,
        node.ns
    );
    assert!(text.contains(&pod_cpu), "{pod_cpu} in:\n{text}");
}
