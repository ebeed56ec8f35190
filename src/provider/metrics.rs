//! The provider's Prometheus metrics (the Go daemon's names: namespace `cocoon`, subsystem `vk`)
//! and the `/metrics` endpoint.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

#[derive(Clone)]
pub struct ProviderMetrics {
    pub pod_lifecycle: IntCounterVec,
    pub snapshot_pull: IntCounterVec,
    pub snapshot_save: IntCounterVec,
    pub snapshot_push: IntCounterVec,
    pub snapshot_verify: IntCounterVec,
    pub clone_from_dir: IntCounterVec,
    pub vm_table_size: IntGauge,
    pub orphan_vm: IntCounter,
    pub reconcile_adopt_by_name: IntCounter,
    pub stale_create_reconcile: IntCounterVec,
    pub startup_resume: IntCounterVec,
    pub hibernate_evidence: IntCounterVec,
    pub wake: IntCounterVec,
    pub lease_release: IntCounterVec,
    pub vm_boot_duration: HistogramVec,
    pub snapshot_save_duration: Histogram,
    pub snapshot_push_duration: Histogram,
    pub snapshot_pull_duration: Histogram,
    pub probe_duration: Histogram,
    pub hibernate: IntCounterVec,
    pub wake_ip_wait: IntCounterVec,
    pub wake_renew_nudge: IntCounterVec,
    pub postclone: IntCounterVec,
    pub postclone_retry_attempts: HistogramVec,
    pub vm_inspect_transient_fail: IntCounter,
    pub pod_evict_failure: IntCounter,
    pub snapshot_reclaimed: IntCounterVec,
    pub bring_ups_waiting: IntGauge,
    pub bring_ups_running: IntGauge,
    pub bring_up_wait_duration: Histogram,
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help).namespace("cocoon").subsystem("vk")
}

fn hopts(name: &str, help: &str, buckets: &[f64]) -> HistogramOpts {
    HistogramOpts::new(name, help)
        .namespace("cocoon")
        .subsystem("vk")
        .buckets(buckets.to_vec())
}

impl ProviderMetrics {
    fn build() -> prometheus::Result<Self> {
        let result = |n: &str, h: &str| IntCounterVec::new(opts(n, h), &["result"]);
        Ok(Self {
            pod_lifecycle: IntCounterVec::new(
                opts("pod_lifecycle_total", "Pod operations by op, result and reason."),
                &["op", "result", "reason"],
            )?,
            snapshot_pull: result("snapshot_pull_total", "Snapshot pulls from the registry.")?,
            snapshot_save: result("snapshot_save_total", "Local snapshot saves.")?,
            snapshot_push: result("snapshot_push_total", "Snapshot pushes to the registry.")?,
            snapshot_verify: result(
                "snapshot_verify_total",
                "Verifications of a local wake snapshot against :hibernate.",
            )?,
            clone_from_dir: result("clone_from_dir_total", "Clones from an exported snapshot directory.")?,
            vm_table_size: IntGauge::with_opts(opts("vm_table_size", "Tracked VM rows."))?,
            orphan_vm: IntCounter::with_opts(opts(
                "orphan_vm_total",
                "VMs without a pod found at startup (alert policy).",
            ))?,
            reconcile_adopt_by_name: IntCounter::with_opts(opts(
                "reconcile_adopt_by_name_total",
                "Pods adopted by VM name at startup.",
            ))?,
            stale_create_reconcile: IntCounterVec::new(
                opts("stale_create_reconcile_total", "Stale creates reconciled at startup."),
                &["outcome"],
            )?,
            startup_resume: IntCounterVec::new(opts("startup_resume_total", "Work resumed after a restart."), &["op"])?,
            hibernate_evidence: IntCounterVec::new(
                opts("hibernate_evidence_total", "Hibernate evidence verdicts in CreatePod."),
                &["verdict"],
            )?,
            wake: result("wake_total", "Restores from hibernate.")?,
            lease_release: result("lease_release_total", "cocoon-net lease releases.")?,
            vm_boot_duration: HistogramVec::new(
                hopts(
                    "vm_boot_duration_seconds",
                    "VM bring-up time.",
                    &[0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0],
                ),
                &["mode", "backend"],
            )?,
            snapshot_save_duration: Histogram::with_opts(hopts(
                "snapshot_save_duration_seconds",
                "Snapshot save time.",
                &[1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0],
            ))?,
            snapshot_push_duration: Histogram::with_opts(hopts(
                "snapshot_push_duration_seconds",
                "Snapshot push time.",
                &[1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0],
            ))?,
            snapshot_pull_duration: Histogram::with_opts(hopts(
                "snapshot_pull_duration_seconds",
                "Snapshot pull time.",
                &[1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0],
            ))?,
            probe_duration: Histogram::with_opts(hopts(
                "probe_duration_seconds",
                "Readiness probe time.",
                &[0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0],
            ))?,
            hibernate: IntCounterVec::new(
                opts("hibernate_total", "Hibernate steps by phase and result."),
                &["phase", "result"],
            )?,
            wake_ip_wait: result("wake_ip_wait_total", "Waits for a fresh DHCP lease before Ready.")?,
            wake_renew_nudge: result(
                "wake_renew_nudge_total",
                "ipconfig /renew nudges of Windows guests without a lease.",
            )?,
            postclone: IntCounterVec::new(
                opts("postclone_total", "Guest fixups after a clone, fork or wake."),
                &["kind", "result"],
            )?,
            postclone_retry_attempts: HistogramVec::new(
                hopts(
                    "postclone_retry_attempts",
                    "vm exec attempts a guest fixup took.",
                    &[1.0, 2.0, 5.0, 10.0, 20.0, 40.0, 60.0],
                ),
                &["result"],
            )?,
            vm_inspect_transient_fail: IntCounter::with_opts(opts(
                "vm_inspect_transient_fail_total",
                "Inconclusive inspects after a VM event.",
            ))?,
            pod_evict_failure: IntCounter::with_opts(opts(
                "pod_evict_failure_total",
                "Evictions the apiserver did not accept.",
            ))?,
            snapshot_reclaimed: IntCounterVec::new(
                opts(
                    "snapshot_reclaimed_total",
                    "Local snapshots the reclaimer removed, by rule (stale_import, no_hibernate_tag, stale_id).",
                ),
                &["reason"],
            )?,
            bring_ups_waiting: IntGauge::with_opts(opts(
                "bring_ups_waiting",
                "Creates waiting for a bring-up turn (VK_MAX_CONCURRENT_BRING_UPS).",
            ))?,
            bring_ups_running: IntGauge::with_opts(opts(
                "bring_ups_running",
                "Creates running their bring-up (at most VK_MAX_CONCURRENT_BRING_UPS).",
            ))?,
            bring_up_wait_duration: Histogram::with_opts(hopts(
                "bring_up_wait_seconds",
                "How long creates waited for a bring-up turn.",
                &[0.001, 0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0],
            ))?,
        })
    }

    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self::build()?;
        registry.register(Box::new(m.pod_lifecycle.clone()))?;
        registry.register(Box::new(m.snapshot_pull.clone()))?;
        registry.register(Box::new(m.snapshot_save.clone()))?;
        registry.register(Box::new(m.snapshot_push.clone()))?;
        registry.register(Box::new(m.snapshot_verify.clone()))?;
        registry.register(Box::new(m.clone_from_dir.clone()))?;
        registry.register(Box::new(m.vm_table_size.clone()))?;
        registry.register(Box::new(m.orphan_vm.clone()))?;
        registry.register(Box::new(m.reconcile_adopt_by_name.clone()))?;
        registry.register(Box::new(m.stale_create_reconcile.clone()))?;
        registry.register(Box::new(m.startup_resume.clone()))?;
        registry.register(Box::new(m.hibernate_evidence.clone()))?;
        registry.register(Box::new(m.wake.clone()))?;
        registry.register(Box::new(m.lease_release.clone()))?;
        registry.register(Box::new(m.vm_boot_duration.clone()))?;
        registry.register(Box::new(m.snapshot_save_duration.clone()))?;
        registry.register(Box::new(m.snapshot_push_duration.clone()))?;
        registry.register(Box::new(m.snapshot_pull_duration.clone()))?;
        registry.register(Box::new(m.probe_duration.clone()))?;
        registry.register(Box::new(m.hibernate.clone()))?;
        registry.register(Box::new(m.wake_ip_wait.clone()))?;
        registry.register(Box::new(m.wake_renew_nudge.clone()))?;
        registry.register(Box::new(m.postclone.clone()))?;
        registry.register(Box::new(m.postclone_retry_attempts.clone()))?;
        registry.register(Box::new(m.vm_inspect_transient_fail.clone()))?;
        registry.register(Box::new(m.pod_evict_failure.clone()))?;
        registry.register(Box::new(m.snapshot_reclaimed.clone()))?;
        registry.register(Box::new(m.bring_ups_waiting.clone()))?;
        registry.register(Box::new(m.bring_ups_running.clone()))?;
        registry.register(Box::new(m.bring_up_wait_duration.clone()))?;
        Ok(m)
    }

    /// Metrics nobody scrapes (tests).
    pub fn unregistered() -> Self {
        Self::build().expect("metric definitions are valid")
    }

    pub fn lifecycle(&self, op: &str, result: &str, reason: &str) {
        self.pod_lifecycle.with_label_values(&[op, result, reason]).inc();
    }

    pub fn lifecycle_count(&self, op: &str, result: &str, reason: &str) -> u64 {
        self.pod_lifecycle.with_label_values(&[op, result, reason]).get()
    }

    /// `hibernate_total{phase,result}`.
    pub fn hibernate_step(&self, phase: &str, ok: bool) {
        self.hibernate
            .with_label_values(&[phase, if ok { "ok" } else { "failed" }])
            .inc();
    }

    /// `wake_total{result}` for a boot that was a wake (`wake`); nothing for any other boot.
    pub fn wake_ended(&self, wake: bool, ok: bool) {
        if wake {
            Self::count(&self.wake, ok);
        }
    }

    /// Counts a `{result}` counter by outcome.
    pub fn count(counter: &IntCounterVec, ok: bool) {
        counter.with_label_values(&[if ok { "ok" } else { "failed" }]).inc();
    }
}

/// Text exposition of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    let _ = TextEncoder::new().encode(&registry.gather(), &mut buf);
    String::from_utf8(buf).unwrap_or_default()
}

/// The `/metrics` listener.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Metrics")]
pub struct MetricsArgs {
    /// Address of the /metrics listener (host:port, or :port for every interface); loopback by
    /// default: the endpoint is unauthenticated and names every pod and VM of the node
    #[arg(long, env = "VK_METRICS_ADDR", value_name = "ADDR", default_value = "127.0.0.1:9091",
          value_parser = crate::settings::parser("VK_METRICS_ADDR", "host:port or :port", parse_listen_addr))]
    pub metrics_addr: std::net::SocketAddr,
}

/// A listen address that is neither `host:port` nor `:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not host:port or :port ({0})")]
pub struct NotAListenAddr(#[source] pub std::net::AddrParseError);

/// `host:port`, or `:port` for every interface (`0.0.0.0:port`).
pub fn parse_listen_addr(value: &str) -> Result<std::net::SocketAddr, NotAListenAddr> {
    let v = value.trim();
    let full = if v.starts_with(':') {
        format!("0.0.0.0{v}")
    } else {
        v.to_string()
    };
    full.parse().map_err(NotAListenAddr)
}

/// The `/metrics` listener: plain HTTP within `limits`.
pub fn listener(limits: crate::listener::Limits) -> std::sync::Arc<crate::listener::Listener> {
    crate::listener::Listener::new("metrics", limits, None)
}

/// Renders running at once. Each takes a thread of the blocking pool (shared with peer reads,
/// log reads and policy fetches) and the stats sampler's lock; a scrape flood waits for a turn
/// on the async side instead of filling the pool.
pub const MAX_RENDERS: usize = 2;

/// Serves `GET /metrics` on `tcp` through `listener` until `shutdown`. Gathering runs off the
/// async workers (collectors such as the VM stats read files), at most [`MAX_RENDERS`] at once.
pub async fn serve(
    tcp: tokio::net::TcpListener,
    listener: std::sync::Arc<crate::listener::Listener>,
    registry: Registry,
    shutdown: tokio_util::sync::CancellationToken,
) {
    use axum::routing::get;
    let renders = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_RENDERS));
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let registry = registry.clone();
            let renders = renders.clone();
            async move {
                // The turn goes with the render: a scraper that hangs up does not free it
                // before the blocking thread is done.
                let text = match renders.acquire_owned().await {
                    Ok(turn) => tokio::task::spawn_blocking(move || {
                        let _turn = turn;
                        render(&registry)
                    })
                    .await
                    .unwrap_or_default(),
                    Err(_) => String::new(),
                };
                ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
            }
        }),
    );
    listener.serve(tcp, app, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels_follow_the_spec() {
        let registry = Registry::new();
        let m = ProviderMetrics::register(&registry).unwrap();
        m.lifecycle("create", "skipped", "missing_vmname");
        m.vm_boot_duration
            .with_label_values(&["clone", "cloud-hypervisor"])
            .observe(1.5);
        let text = render(&registry);
        assert!(
            text.contains(r#"cocoon_vk_pod_lifecycle_total{op="create",reason="missing_vmname",result="skipped"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"cocoon_vk_vm_boot_duration_seconds_bucket{backend="cloud-hypervisor",mode="clone",le="2"} 1"#
            ),
            "{text}"
        );
    }

    /// A collector whose gather reads a `/proc` file `reads` times, the kind of work the VM
    /// stats sampler does under its lock, and records how many gathers ran at once.
    struct Slow {
        reads: usize,
        running: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
        desc: Vec<prometheus::core::Desc>,
    }

    impl prometheus::core::Collector for Slow {
        fn desc(&self) -> Vec<&prometheus::core::Desc> {
            self.desc.iter().collect()
        }

        fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
            use std::sync::atomic::Ordering;
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
            for _ in 0..self.reads {
                let stat = std::fs::read("/proc/self/stat").expect("reading /proc/self/stat");
                std::hint::black_box(stat);
            }
            self.running.fetch_sub(1, Ordering::SeqCst);
            Vec::new()
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scrape_flood_gathers_at_most_two_at_once() {
        let slow = std::sync::Arc::new(Slow {
            reads: 2000,
            running: Default::default(),
            most: Default::default(),
            desc: Vec::new(),
        });
        struct Shared(std::sync::Arc<Slow>);
        impl prometheus::core::Collector for Shared {
            fn desc(&self) -> Vec<&prometheus::core::Desc> {
                self.0.desc()
            }
            fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
                self.0.collect()
            }
        }
        let registry = Registry::new();
        registry.register(Box::new(Shared(slow.clone()))).unwrap();
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let server = listener(crate::listener::Limits::with_cap(1000));
        tokio::spawn(serve(tcp, server, registry, stop.clone()));
        let http = reqwest::Client::new();
        let scrapes: Vec<_> = (0..200)
            .map(|_| {
                let http = http.clone();
                tokio::spawn(async move {
                    http.get(format!("http://{addr}/metrics"))
                        .send()
                        .await
                        .map(|r| r.status())
                })
            })
            .collect();
        for s in scrapes {
            assert_eq!(s.await.unwrap().unwrap(), 200, "every scrape is answered");
        }
        let most = slow.most.load(std::sync::atomic::Ordering::SeqCst);
        assert!(most <= MAX_RENDERS, "{most} gathers ran at once on the blocking pool");
        stop.cancel();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn half_requests_to_metrics_are_closed_at_the_header_deadline_and_capped() {
        use std::time::Duration;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        use tokio::time::Instant;
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let limits = crate::listener::Limits {
            header_timeout: Duration::from_secs(1),
            ..crate::listener::Limits::with_cap(32)
        };
        let server = listener(limits);
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(serve(tcp, server.clone(), Registry::new(), stop.clone()));
        let flood: Vec<_> = (0..300)
            .map(|_| {
                tokio::spawn(async move {
                    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
                    let opened = Instant::now();
                    let _ = c.write_all(b"GET /metrics HTTP/1.1\r\n").await;
                    let mut buf = [0u8; 64];
                    let closed = async {
                        loop {
                            match c.read(&mut buf).await {
                                Ok(0) | Err(_) => return opened.elapsed(),
                                Ok(_) => {}
                            }
                        }
                    };
                    tokio::time::timeout(Duration::from_secs(15), closed)
                        .await
                        .expect("a half-request to /metrics is still open after 15 s")
                })
            })
            .collect();
        let mut closes = Vec::new();
        for c in flood {
            closes.push(c.await.unwrap());
        }
        let held = closes.iter().filter(|d| **d >= limits.header_timeout).count();
        assert!(held >= 32, "{held} connections waited for the deadline: {closes:?}");
        // One whose close was read late can look held: hence at least.
        assert!(server.refused_connections() as usize + held >= 300);
        assert!(closes.iter().all(|d| *d < limits.header_timeout * 3), "{closes:?}");
        stop.cancel();
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen_addr(":9091").unwrap().to_string(), "0.0.0.0:9091");
        let default = crate::settings::parse_lookup::<MetricsArgs>(|_| None).unwrap();
        assert_eq!(
            default.metrics_addr.to_string(),
            "127.0.0.1:9091",
            "loopback unless asked"
        );
        assert_eq!(parse_listen_addr("127.0.0.1:1").unwrap().to_string(), "127.0.0.1:1");
        assert!(parse_listen_addr("nope").is_err());
    }
}
