//! The stats behind `/stats/summary` and `/metrics/resource` with 1,000 VMs tracked: one sample
//! read uncached (every file parsed) and served from the cache, each endpoint's body built from
//! it, against the floor — reading the same files once, unparsed. Plus this process's memory.
//!
//! `cargo bench --bench kubelet_stats` (`BENCH_VMS` overrides the 1,000). The host tree is
//! synthetic but real-format files on disk (`VK_PROC_ROOT` / `VK_CGROUP_ROOT` exist for this):
//! per VM a `cpu.stat`, a `/proc/<pid>/{status,stat,net/dev}` copied from this process's own with
//! the VM's TAP added, and a sparse COW file with 64 KiB allocated.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vk_cocoon::kubelet_api::{resource_metrics, summary};
use vk_cocoon::stats::families;
use vk_cocoon::stats::sample::{self, VmTarget};
use vk_cocoon::stats::{HostPaths, Sampler, VmTargets};
use vk_test_support::bench::status_kib;

struct Table(Vec<VmTarget>);
impl VmTargets for Table {
    fn vm_targets(&self) -> Vec<VmTarget> {
        self.0.clone()
    }
}

fn build_tree(root: &Path, n: usize) -> (HostPaths, Vec<VmTarget>) {
    let paths = HostPaths::from_lookup(|k| match k {
        "VK_PROC_ROOT" => Some(root.join("proc").display().to_string()),
        "VK_CGROUP_ROOT" => Some(root.join("cgroup").display().to_string()),
        "COCOON_ROOT_DIR" => Some(root.join("cocoon").display().to_string()),
        _ => None,
    })
    .unwrap();
    std::fs::create_dir_all(&paths.proc_root).unwrap();
    std::fs::create_dir_all(&paths.root_dir).unwrap();
    for f in ["stat", "meminfo"] {
        std::fs::copy(format!("/proc/{f}"), paths.proc_file(f)).unwrap();
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let net = std::fs::read_to_string("/proc/self/net/dev").unwrap();
    let mut targets = Vec::with_capacity(n);
    for i in 0..n {
        let id = format!("VM{i:024}");
        let pid = 100_000 + i as i64;
        let tap = format!("tap{}-0", &id[..8]);
        let pid_dir = paths.proc_root.join(pid.to_string());
        std::fs::create_dir_all(pid_dir.join("net")).unwrap();
        std::fs::write(pid_dir.join("status"), &status).unwrap();
        std::fs::write(pid_dir.join("stat"), &stat).unwrap();
        std::fs::write(
            pid_dir.join("net/dev"),
            format!("{net}{tap}: {} 10 0 0 0 0 0 0 {} 20 0 0 0 0 0 0\n", 1000 + i, 2000 + i),
        )
        .unwrap();
        let scope = paths.cpu_stat(&id);
        std::fs::create_dir_all(scope.parent().unwrap()).unwrap();
        std::fs::write(
            &scope,
            format!(
                "usage_usec {}\nuser_usec 1\nsystem_usec 1\nnr_periods 9\nnr_throttled 3\nthrottled_usec 77\n",
                1_000_000 + i
            ),
        )
        .unwrap();
        let run = paths.vm_run_dir(&vk_cocoon::hypervisor::Hypervisor::CloudHypervisor, &id);
        std::fs::create_dir_all(&run).unwrap();
        let cow = std::fs::File::create(run.join("cow.raw")).unwrap();
        cow.set_len(10 << 30).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&cow, &vec![1u8; 64 * 1024], 0).unwrap();
        targets.push(VmTarget {
            namespace: format!("ns-{}", i % 10),
            pod: format!("agent-{i}"),
            uid: format!("uid-{i}"),
            container: "agent".into(),
            vm_id: id.clone(),
            vm_name: format!("vk-ns-agent-{i}"),
            hypervisor: "cloud-hypervisor".into(),
            pid,
            tap: Some(tap),
            pod_start: None,
        });
    }
    (paths, targets)
}

/// The floor: read every file the sample reads, once, without parsing.
fn read_once(paths: &HostPaths, targets: &[VmTarget]) -> usize {
    let mut bytes = 0;
    for f in ["stat", "meminfo"] {
        bytes += std::fs::read(paths.proc_file(f)).map_or(0, |b| b.len());
    }
    for t in targets {
        bytes += std::fs::read(paths.cpu_stat(&t.vm_id)).map_or(0, |b| b.len());
        for f in ["status", "net/dev", "stat"] {
            bytes += std::fs::read(paths.pid_file(t.pid, f)).map_or(0, |b| b.len());
        }
        for cow in paths.cow_candidates(&t.hypervisor, &t.vm_id) {
            if let Ok(m) = std::fs::metadata(cow) {
                bytes += m.len() as usize & 1;
                break;
            }
        }
    }
    bytes
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time(rounds: usize, mut f: impl FnMut()) -> Duration {
    f();
    median(
        (0..rounds)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

fn main() {
    let n: usize = std::env::var("BENCH_VMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let dir = tempfile::tempdir().unwrap();
    let rss_start = status_kib("VmRSS:");
    let (paths, targets) = build_tree(dir.path(), n);
    let rounds = 30;

    let floor = time(rounds, || {
        std::hint::black_box(read_once(&paths, &targets));
    });
    let table: Arc<dyn VmTargets> = Arc::new(Table(targets.clone()));
    let sampler = Sampler::new(paths.clone(), table.clone(), Duration::from_secs(3600));
    let uncached_sample = time(rounds, || {
        std::hint::black_box(sample::collect(&paths, table.vm_targets()));
    });
    let rss_before_cache = status_kib("VmRSS:");
    let cached = sampler.sample_blocking();
    let summary_bytes = serde_json::to_vec(&summary::build(&cached, "node")).unwrap().len();
    let metrics_bytes = families::encode(&resource_metrics::families(&cached)).len();
    let rss_cached = status_kib("VmRSS:");

    let summary_uncached = time(rounds, || {
        sampler.invalidate();
        let s = sampler.sample_blocking();
        std::hint::black_box(serde_json::to_vec(&summary::build(&s, "node")).unwrap());
    });
    let metrics_uncached = time(rounds, || {
        sampler.invalidate();
        let s = sampler.sample_blocking();
        std::hint::black_box(families::encode(&resource_metrics::families(&s)));
    });
    let _ = sampler.sample_blocking();
    let summary_cached = time(rounds, || {
        let s = sampler.sample_blocking();
        std::hint::black_box(serde_json::to_vec(&summary::build(&s, "node")).unwrap());
    });
    let metrics_cached = time(rounds, || {
        let s = sampler.sample_blocking();
        std::hint::black_box(families::encode(&resource_metrics::families(&s)));
    });

    println!("kubelet stats with {n} VMs tracked (median of {rounds} rounds, this machine, one run)");
    println!();
    println!("| measure | ms | × the floor |");
    println!("|---|---|---|");
    let row = |name: &str, d: Duration| {
        println!("| {name} | {} | {:.2}× |", ms(d), d.as_secs_f64() / floor.as_secs_f64());
    };
    row("floor: read the same files once, unparsed (baseline)", floor);
    row("one sample, uncached (read + parse)", uncached_sample);
    row("/stats/summary body, uncached sample", summary_uncached);
    row("/stats/summary body, cached sample", summary_cached);
    row("/metrics/resource body, uncached sample", metrics_uncached);
    row("/metrics/resource body, cached sample", metrics_cached);
    println!();
    println!(
        "bodies: summary {:.1} KiB, resource metrics {:.1} KiB",
        summary_bytes as f64 / 1024.0,
        metrics_bytes as f64 / 1024.0
    );
    println!(
        "memory: VmRSS {:.1} MiB at start, {:.1} MiB with the {n}-VM table, {:.1} MiB with a cached sample \
         and both bodies built; VmHWM {:.1} MiB",
        rss_start as f64 / 1024.0,
        rss_before_cache as f64 / 1024.0,
        rss_cached as f64 / 1024.0,
        status_kib("VmHWM:") as f64 / 1024.0
    );
}
