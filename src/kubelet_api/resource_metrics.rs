//! `GET /metrics/resource`: the kubelet's resource metrics (what metrics-server scrapes), with
//! the sample's timestamp on every series, from a sample (pure).

use std::time::UNIX_EPOCH;

use prometheus::proto::MetricFamily;

use crate::stats::families::Family;
use crate::stats::sample::Sample;

/// The families of `sample`.
pub fn families(sample: &Sample) -> Vec<MetricFamily> {
    let ts = sample
        .time
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as i64);
    let mut node_cpu = Family::counter(
        "node_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
    );
    let mut node_mem = Family::gauge(
        "node_memory_working_set_bytes",
        "[STABLE] Current working set of the node in bytes",
    );
    let mut c_cpu = Family::counter(
        "container_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
    );
    let mut c_mem = Family::gauge(
        "container_memory_working_set_bytes",
        "[STABLE] Current working set of the container in bytes",
    );
    let mut c_start = Family::gauge(
        "container_start_time_seconds",
        "[STABLE] Start time of the container since unix epoch in seconds",
    );
    let mut c_thr_s = Family::counter(
        "container_cpu_cfs_throttled_seconds_total",
        "Total time duration the container has been throttled",
    );
    let mut c_thr_p = Family::counter(
        "container_cpu_cfs_throttled_periods_total",
        "Number of throttled period intervals",
    );
    let mut p_cpu = Family::counter(
        "pod_cpu_usage_seconds_total",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
    );
    let mut p_mem = Family::gauge(
        "pod_memory_working_set_bytes",
        "[STABLE] Current working set of the pod in bytes",
    );
    let mut scrape_error = Family::gauge(
        "resource_scrape_error",
        "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise",
    );

    node_cpu.push(&[], sample.node.cpu_usage_ns as f64 / 1e9, ts);
    node_mem.push(&[], sample.node.memory_used() as f64, ts);
    for vm in &sample.vms {
        let t = &vm.target;
        let c = [
            ("container", t.container.as_str()),
            ("namespace", t.namespace.as_str()),
            ("pod", t.pod.as_str()),
        ];
        let p = [("namespace", t.namespace.as_str()), ("pod", t.pod.as_str())];
        let cpu = vm.cpu.usage_usec as f64 / 1e6;
        c_cpu.push(&c, cpu, ts);
        p_cpu.push(&p, cpu, ts);
        if let Some(rss) = vm.rss {
            c_mem.push(&c, rss as f64, ts);
            p_mem.push(&p, rss as f64, ts);
        }
        if let Some(start) = vm.started.or(t.pod_start)
            && let Ok(d) = start.duration_since(UNIX_EPOCH)
        {
            c_start.push(&c, d.as_secs_f64(), ts);
        }
        c_thr_s.push(&c, vm.cpu.throttled_usec as f64 / 1e6, ts);
        c_thr_p.push(&c, vm.cpu.nr_throttled as f64, ts);
    }
    scrape_error.push(&[], 0.0, 0);
    [
        c_thr_p,
        c_thr_s,
        c_cpu,
        c_mem,
        c_start,
        node_cpu,
        node_mem,
        p_cpu,
        p_mem,
        scrape_error,
    ]
    .into_iter()
    .filter(|f| !f.is_empty())
    .map(Family::build)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::parse::CpuStat;
    use crate::stats::sample::{NodeSample, VmSample, VmTarget};
    use std::time::Duration;

    #[test]
    fn kubelet_families_with_timestamps() {
        let t = UNIX_EPOCH + Duration::from_millis(1_786_528_800_123);
        let s = Sample {
            time: Some(t),
            node: NodeSample {
                cpu_usage_ns: 3_000_000_000,
                mem_total: 10,
                mem_available: 4,
                ..Default::default()
            },
            vms: vec![VmSample {
                target: VmTarget {
                    namespace: "ns".into(),
                    pod: "p".into(),
                    container: "agent".into(),
                    ..Default::default()
                },
                cpu: CpuStat {
                    usage_usec: 1_250_000,
                    throttled_usec: 500_000,
                    nr_throttled: 7,
                    nr_periods: 9,
                },
                rss: Some(2048),
                started: Some(UNIX_EPOCH + Duration::from_secs(1_786_528_000)),
                ..Default::default()
            }],
        };
        let text = crate::stats::families::encode(&families(&s));
        for line in [
            "node_cpu_usage_seconds_total 3 1786528800123",
            "node_memory_working_set_bytes 6 1786528800123",
            r#"container_cpu_usage_seconds_total{container="agent",namespace="ns",pod="p"} 1.25 1786528800123"#,
            r#"container_memory_working_set_bytes{container="agent",namespace="ns",pod="p"} 2048 1786528800123"#,
            r#"container_start_time_seconds{container="agent",namespace="ns",pod="p"} 1786528000 1786528800123"#,
            r#"container_cpu_cfs_throttled_seconds_total{container="agent",namespace="ns",pod="p"} 0.5 1786528800123"#,
            r#"container_cpu_cfs_throttled_periods_total{container="agent",namespace="ns",pod="p"} 7 1786528800123"#,
            r#"pod_cpu_usage_seconds_total{namespace="ns",pod="p"} 1.25 1786528800123"#,
            r#"pod_memory_working_set_bytes{namespace="ns",pod="p"} 2048 1786528800123"#,
            "resource_scrape_error 0",
        ] {
            assert!(text.contains(&format!("{line}\n")), "missing {line}:\n{text}");
        }
        assert!(text.contains("# TYPE node_cpu_usage_seconds_total counter"));
    }
}
