//! Creates as users feel them (issue 39), on the real kube-apiserver with `vk-cocoon run` as its
//! own process and the cocoon simulator, on one warm node (the snapshot local, its image known,
//! one pod already up):
//!
//! * Create → Ready of one clone-mode pod (the pod POSTed, until a watch sees lifecycle `ready`
//!   and Ready=True), against one bare `cocoon vm clone` of the same snapshot run directly on the
//!   same simulator in the same round (target ≤ 1.3×);
//! * a burst of `BENCH_BURST` (default 100) pods POSTed at once: until all are up, against
//!   `BENCH_BURST` × one create of the same node (target ≤ 0.5×), at several bounds of
//!   `VK_MAX_CONCURRENT_BRING_UPS` (`BENCH_BOUNDS`, default `4,8,16,32`), each on its own node;
//!   beside it the most `vm clone` that ran at once (the simulator's call log).
//!
//! The simulator's `vm clone` takes `BENCH_CLONE_MS` (default 300 ms: its
//! `settings.create_delay_ms`, the time a VM stays `creating`): a real clone makes the COW disk
//! (a reflink), sets up the NIC through CNI and restores the memory; without it the clone would
//! be instant and the ratios would measure only the daemon. The figure is an assumption, not a
//! measurement of cocoon; set it to what your machines show. For one create the table also
//! lists the cocoon calls it made with their start offsets and durations (`calls.log`,
//! `ends.log`, on the same monotonic clock as the bench).
//!
//! `cargo build --release -p cocoon-sim && COCOON_SIM_BIN=target/release/cocoon-sim
//! VK_KUBE_TOOLS_DIR=../shared/tools/kubernetes cargo bench --bench create_burst`. Without
//! `VK_KUBE_TOOLS_DIR` it prints why it measured nothing. `BENCH_ROUNDS` (default 9) single
//! creates per node, `BENCH_BURST_ROUNDS` (default 3) bursts per bound. Everything is on loopback.

use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use vk_cocoon::runtime::CocoonRuntime;
// The real-apiserver tests' harness: the control plane and a node machine running the daemon.
use vk_test_support::bench::{env_usize, median, ms};
use vk_test_support::daemon::{self, IMAGE, Machine, create_pod, managed_pod, wait_up};
use vk_test_support::{kube_support, provider_support, runtime_support};

/// One bare `cocoon vm clone` of `snapshot` on the machine's simulator, as a user would run it;
/// the VM is removed afterwards (not timed).
async fn bare_clone(machine: &Machine, snapshot: &str, name: &str) -> Duration {
    let (key, root) = machine.sim.env();
    let started = Instant::now();
    let out = Command::new(runtime_support::sim_bin())
        .env(key, root)
        .args(["vm", "clone", "--name", name, snapshot])
        .output()
        .expect("run cocoon-sim");
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "vm clone: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for vm in machine.vms_named(name).await {
        machine.runtime.remove(&vm.id).await.unwrap();
    }
    took
}

/// What one node measured.
struct Node {
    bound: usize,
    bare: Duration,
    create: Duration,
    burst: Duration,
    /// When the burst's last `vm clone` returned (median over the bursts).
    clones_done: Duration,
    most_at_once: usize,
    /// The cocoon calls of its last single create: (verb, start offset, duration).
    calls: Vec<(String, Duration, Option<Duration>)>,
    /// Its Create → Ready.
    calls_total: Duration,
}

async fn measure_node(cluster: &kube_support::KubeCluster, cache: &std::path::Path, bound: usize) -> Node {
    let rounds = env_usize("BENCH_ROUNDS", 9);
    let burst_rounds = env_usize("BENCH_BURST_ROUNDS", 3);
    let burst = env_usize("BENCH_BURST", 100);
    let clone_ms = env_usize("BENCH_CLONE_MS", 300) as u64;
    let admin = cluster.admin_client().await;
    let mut machine = Machine::new("vk-burst");
    // Debug logging of a burst would measure the log: the operator's level.
    machine.daemon_env.push(("VK_LOG_LEVEL".into(), "info".into()));
    machine
        .daemon_env
        .push(("VK_MAX_CONCURRENT_BRING_UPS".into(), bound.to_string()));
    // Every node after the first loads the compiled policies from the cache.
    machine
        .daemon_env
        .push(("VK_POLICY_CACHE_DIR".into(), cache.display().to_string()));
    provider_support::seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
    machine.sim.set_settings(|s| s.create_delay_ms = clone_ms).unwrap();
    let daemon = machine.start_daemon(cluster);
    machine.wait_registered(cluster).await;
    let ns = cluster.namespace("burst").await;
    // A warm node: one pod of the snapshot already up.
    let pod = |ns: &str, name: &str| managed_pod(ns, &machine.node, name, &format!("vm-{name}"), &[(IMAGE, "base")]);
    create_pod(&admin, &pod(&ns, "warm")).await;
    wait_up(&admin, &ns, "warm").await;

    let (mut bare, mut create) = (Vec::new(), Vec::new());
    let mut last = (0u64, 0u64);
    for r in 0..rounds {
        bare.push(bare_clone(&machine, "base", &format!("bare-{r}")).await);
        let name = format!("one-{r}");
        let mono = cocoon_sim::util::monotonic_ns();
        let started = Instant::now();
        create_pod(&admin, &pod(&ns, &name)).await;
        wait_up(&admin, &ns, &name).await;
        create.push(started.elapsed());
        last = (mono, cocoon_sim::util::monotonic_ns());
    }
    let calls_total = Duration::from_nanos(last.1 - last.0);
    let ends = machine.sim.call_ends().unwrap();
    let calls = machine
        .sim
        .calls()
        .unwrap()
        .into_iter()
        .filter(|c| c.at >= last.0 && c.at <= last.1)
        .map(|c| {
            let end = ends
                .iter()
                .filter(|e| e.pid == c.pid && e.at >= c.at)
                .map(|e| e.at)
                .min();
            (
                c.verb.clone(),
                Duration::from_nanos(c.at - last.0),
                end.map(|e| Duration::from_nanos(e - c.at)),
            )
        })
        .collect();

    let (mut bursts, mut clones_done) = (Vec::new(), Vec::new());
    for r in 0..burst_rounds {
        let ns = cluster.namespace("burst").await;
        let before = machine.vms().await.len();
        let mono = cocoon_sim::util::monotonic_ns();
        let started = Instant::now();
        futures::future::join_all((0..burst).map(|i| {
            let admin = admin.clone();
            let p = pod(&ns, &format!("b{r}-{i}"));
            async move { create_pod(&admin, &p).await }
        }))
        .await;
        bursts.push(
            daemon::wait_up_count(
                &Api::namespaced(admin.clone(), &ns),
                burst,
                started,
                Duration::from_secs(120),
            )
            .await,
        );
        // When the burst's last clone returned: what is left after it is the daemon's.
        let last_clone = machine
            .sim
            .call_ends()
            .unwrap()
            .into_iter()
            .filter(|e| e.verb == "vm clone" && e.at >= mono)
            .map(|e| e.at)
            .max()
            .expect("the burst cloned");
        clones_done.push(Duration::from_nanos(last_clone - mono));
        // The next burst starts from the same node: these pods and their VMs go first.
        Api::<Pod>::namespaced(admin.clone(), &ns)
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .unwrap();
        let machine = &machine;
        daemon::eventually(300, "the burst's VMs removed", || async move {
            machine.vms().await.len() <= before
        })
        .await;
    }
    let most_at_once = machine.sim.most_at_once("vm clone").unwrap();
    drop(daemon);
    Node {
        bound,
        bare: median(bare),
        create: median(create),
        burst: median(bursts),
        clones_done: median(clones_done),
        most_at_once,
        calls,
        calls_total,
    }
}

fn main() {
    if std::env::var_os("VK_KUBE_TOOLS_DIR").is_none() {
        println!(
            "create_burst: skipped: VK_KUBE_TOOLS_DIR is not set (the folder of the real kube-apiserver and etcd, e.g. ../shared/tools/kubernetes); nothing measured"
        );
        return;
    }
    let bounds: Vec<usize> = std::env::var("BENCH_BOUNDS")
        .unwrap_or_else(|_| "4,8,16,32".into())
        .split(',')
        .filter_map(|b| b.trim().parse().ok())
        .filter(|b| *b > 0)
        .collect();
    let burst = env_usize("BENCH_BURST", 100);
    let clone_ms = env_usize("BENCH_CLONE_MS", 300);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let Some(cluster) = kube_support::shared_apiserver_only().await else {
            println!("create_burst: skipped: no Kubernetes control plane in VK_KUBE_TOOLS_DIR; nothing measured");
            return;
        };
        let cache = tempfile::tempdir().unwrap();
        let mut nodes = Vec::new();
        for &bound in &bounds {
            nodes.push(measure_node(cluster, cache.path(), bound).await);
        }
        let default = vk_cocoon::provider::config::DEFAULT_MAX_BRING_UPS;
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "== create_burst: vk-cocoon run + real kube-apiserver + cocoon-sim (vm clone takes {clone_ms} ms); load average {} ==",
            load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
        );
        println!(
            "{:<12} {:>11} {:>14} {:>8} {:>14} {:>15} {:>8} {:>15} {:>15}",
            "bound",
            "bare clone",
            "create→Ready",
            "ratio",
            format!("{burst} at once"),
            format!("{burst} × one"),
            "ratio",
            "last clone done",
            "clones at once"
        );
        for n in &nodes {
            let label = if n.bound == default {
                format!("{} (default)", n.bound)
            } else {
                n.bound.to_string()
            };
            let serial = n.create * burst as u32;
            println!(
                "{:<12} {:>8.0} ms {:>11.0} ms {:>7.2}× {:>12.2} s {:>13.2} s {:>7.3}× {:>13.2} s {:>15}",
                label,
                ms(n.bare),
                ms(n.create),
                n.create.as_secs_f64() / n.bare.as_secs_f64(),
                n.burst.as_secs_f64(),
                serial.as_secs_f64(),
                n.burst.as_secs_f64() / serial.as_secs_f64(),
                n.clones_done.as_secs_f64(),
                n.most_at_once
            );
        }
        println!("targets: create→Ready ≤ 1.3× a bare clone; {burst} at once ≤ 0.5× {burst} × one create (medians)");
        for n in nodes.iter().filter(|n| n.bound == default).take(1) {
            println!(
                "the cocoon calls of one create (bound {}, Create→Ready {:.0} ms): start offset, duration",
                n.bound,
                ms(n.calls_total)
            );
            for (verb, at, took) in &n.calls {
                let took = took.map_or("running".to_string(), |t| format!("{:.0} ms", ms(t)));
                println!("  {:<24} +{:>6.0} ms  {:>10}", verb, ms(*at), took);
            }
        }
    });
}
