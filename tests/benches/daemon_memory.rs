//! Memory per tracked pod, with the daemon as its own process (issue 15 item 8): `vk-cocoon run`
//! under the deploy/rbac.yaml identity against the real kube-apiserver of `tests/real_apiserver`,
//! cloning VMs on the simulator (the guests answer the daemon's real probes on loopback). The
//! daemon's `/proc/PID/status` is read when it is idle (registered, no pod) on its first start
//! (an empty compile cache: the policies are compiled), then with 200 and with 1,000 pods up
//! (lifecycle `ready` and Ready=True, seen on a watch), and reported against
//! the idle baseline: RSS, its anonymous (heap, stacks) and file-backed (the binary's pages)
//! parts, the peak, threads, and the growth per pod.
//!
//! `cargo build --release -p cocoon-sim && cargo bench --bench daemon_memory` (the control
//! plane: `VK_KUBE_TOOLS_DIR` or `../shared/tools/kubernetes`). `BENCH_PODS` (default 1000) and
//! `BENCH_FIRST` (default 200) set the two sizes; `BENCH_DAEMON_ENV="K=V,K=V"` adds environment
//! to the daemon (e.g. `MALLOC_ARENA_MAX=2`, to tell allocator overhead from live data).

use std::time::{Duration, Instant};

use futures::{StreamExt, stream};
use kube::api::Api;
// The real-apiserver tests' harness: the control plane and a node machine running the daemon.
use vk_test_support::bench::env_usize;
use vk_test_support::daemon::{self, IMAGE, Machine, create_pod, managed_pod};
use vk_test_support::{kube_support, provider_support};

/// How many pods are created at once (a controller's burst, not the whole set in one go).
const CREATE_CONCURRENCY: usize = 32;

/// One reading of the daemon's `/proc/PID/status`, in MiB (threads as a count).
#[derive(Clone, Copy)]
struct Sample {
    rss: f64,
    anon: f64,
    file: f64,
    peak: f64,
    threads: f64,
}

fn sample(pid: i32) -> Sample {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon is running");
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    Sample {
        rss: field("VmRSS:") / 1024.0,
        anon: field("RssAnon:") / 1024.0,
        file: field("RssFile:") / 1024.0 + field("RssShmem:") / 1024.0,
        peak: field("VmHWM:") / 1024.0,
        threads: field("Threads:"),
    }
}

/// Creates pods `from..to` (clones of the seeded snapshot) and waits until all of them are up.
async fn grow(admin: &kube::Client, ns: &str, node: &str, from: usize, to: usize) -> Duration {
    let started = Instant::now();
    stream::iter(from..to)
        .for_each_concurrent(CREATE_CONCURRENCY, |i| async move {
            let pod = managed_pod(ns, node, &format!("agent-{i}"), &format!("vm-{i}"), &[(IMAGE, "base")]);
            create_pod(admin, &pod).await;
        })
        .await;
    daemon::wait_up_count(
        &Api::namespaced(admin.clone(), ns),
        to,
        started,
        Duration::from_secs(60),
    )
    .await
}

fn main() {
    let pods = env_usize("BENCH_PODS", 1000);
    let first = env_usize("BENCH_FIRST", 200).min(pods);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let Some(cluster) = kube_support::shared().await else {
            eprintln!("daemon_memory: no Kubernetes control plane (set VK_KUBE_TOOLS_DIR); nothing measured");
            return;
        };
        let admin = cluster.admin_client().await;
        let ns = cluster.namespace("memory").await;
        let mut machine = Machine::new("vk-memory");
        if let Ok(extra) = std::env::var("BENCH_DAEMON_ENV") {
            for pair in extra.split(',').filter(|p| !p.is_empty()) {
                let (k, v) = pair.split_once('=').expect("BENCH_DAEMON_ENV is K=V,K=V");
                machine.daemon_env.push((k.into(), v.into()));
            }
        }
        // Debug logging of 1,000 pods would measure the log, not the daemon: the operator's level.
        machine.daemon_env.push(("VK_LOG_LEVEL".into(), "info".into()));
        provider_support::seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
        // The worst case: a node's first start, with an empty compile cache. The daemon
        // compiles its policies in worker processes, so what it keeps resident is the same as
        // on any later start, which loads them from the cache.
        let daemon = machine.start_daemon(cluster);
        machine.wait_registered(cluster).await;
        let pid = daemon.pid();

        let idle = sample(pid);
        let t_first = grow(&admin, &ns, &machine.node, 0, first).await;
        let at_first = sample(pid);
        let t_all = grow(&admin, &ns, &machine.node, first, pods).await;
        let at_all = sample(pid);

        let extra = std::env::var("BENCH_DAEMON_ENV").unwrap_or_default();
        println!("== vk-cocoon run as a process, real kube-apiserver, clones on cocoon-sim ({extra}) ==");
        println!(
            "{:<22} {:>9} {:>9} {:>9} {:>9} {:>8} {:>14} {:>9}",
            "", "RSS MiB", "anon", "file", "peak", "threads", "KiB/pod (RSS)", "up in s"
        );
        let row = |label: &str, s: Sample, n: usize, took: Option<Duration>| {
            let per_pod = if n == 0 {
                String::from("-")
            } else {
                format!("{:.1}", (s.rss - idle.rss) * 1024.0 / n as f64)
            };
            let took = took.map_or(String::from("-"), |t| format!("{:.1}", t.as_secs_f64()));
            println!(
                "{:<22} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>8} {:>14} {:>9}",
                label, s.rss, s.anon, s.file, s.peak, s.threads, per_pod, took
            );
        };
        row("idle (first start)", idle, 0, None);
        row(&format!("{first} pods up"), at_first, first, Some(t_first));
        row(&format!("{pods} pods up"), at_all, pods, Some(t_all));
        println!(
            "target: <= 64 MiB RSS with {pods} pods: {:.1} MiB ({})",
            at_all.rss,
            if at_all.rss <= 64.0 { "met" } else { "missed" }
        );
        drop(daemon);
        drop(machine);
    });
}
