//! Registry throughput: push and pull of a ≥ 1 GiB snapshot (the simulator's `snapshot_memory_bytes`)
//! through a loopback docker-registry, against `sha256sum` of the same bytes measured in the same run,
//! plus this process's peak RSS (`VmHWM`). Targets: ≥ 50 % of the sha256 rate both ways, peak RSS ≤ 64 MiB.
//!
//! `cargo bench --bench registry_throughput` (needs `cargo build --release -p cocoon-sim` and Debian's
//! docker-registry). `BENCH_SNAPSHOT_MIB` overrides the memory size (default 1024).
//!
//! Measured once on the 2-core dev machine (release): sha256sum 179 MiB/s; push 118 MiB/s (66 %);
//! pull 374 MiB/s (209 %); peak RSS 33.6 MiB. With 4 MiB PATCH uploads instead of one streamed PUT per
//! blob, push was 56 MiB/s (41 %).

#[path = "../registry_support/mod.rs"]
mod registry_support;

use registry_support::TestRegistry;
use registry_support::runtime_support;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vk_cocoon::runtime::{CocoonRuntime, CpuPolicy, RunSpec};

const IMG: &str = "ghcr.io/cocoonstack/cocoon/ubuntu:24.04";

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("VmHWM:")
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn locate_sim() {
    if std::env::var_os("COCOON_SIM_BIN").is_some() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf();
    let candidates = [
        profile_dir.join("cocoon-sim"),
        profile_dir.parent().unwrap().join("debug/cocoon-sim"),
    ];
    let found = candidates
        .iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("cocoon-sim not found at {candidates:?}: run `cargo build --release -p cocoon-sim`"));
    // SAFETY: single-threaded here (before the tokio runtime starts).
    unsafe { std::env::set_var("COCOON_SIM_BIN", found) };
}

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / 1048576.0 / d.as_secs_f64()
}

fn main() {
    locate_sim();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let mib: u64 = std::env::var("BENCH_SNAPSHOT_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let reg = TestRegistry::start();
    let r = reg.transfer_client("bench", "bench-node");
    let h = runtime_support::harness_with(|c| c.timeouts.transfer = Duration::from_secs(1800));
    h.sim
        .set_settings(|s| {
            s.snapshot_memory_bytes = mib << 20;
            s.snapshot_cow_bytes = 256 << 20;
            s.snapshot_cow_data_bytes = 16 << 20;
        })
        .unwrap();
    h.client.image_pull(IMG, false).await.unwrap();
    let spec = RunSpec {
        name: Some("vm".into()),
        cpu: Some(2),
        cpu_policy: CpuPolicy::default(),
        memory: Some("1Gi".into()),
        image: IMG.into(),
        ..Default::default()
    };
    let vm = h.client.run(&spec).await.unwrap();
    eprintln!("saving a {mib} MiB snapshot…");
    h.client.snapshot_save("vm", &vm.id).await.unwrap();
    let id = h.client.snapshot_inspect("vm").await.unwrap().id;
    let snap_dir: PathBuf = h.dir.path().join("snapshots").join(&id);
    // The dense files (memory etc.): a sparse file's holes would read at memory speed and flatter the baseline.
    let files: Vec<PathBuf> = std::fs::read_dir(&snap_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(p).unwrap();
            m.is_file() && m.blocks() * 512 >= m.len()
        })
        .collect();

    // Baseline: sha256sum over the same files (page cache warmed by a first pass).
    let sha = || {
        let t = Instant::now();
        let out = std::process::Command::new("sha256sum")
            .args(&files)
            .output()
            .expect("sha256sum");
        assert!(out.status.success());
        t.elapsed()
    };
    let _ = sha();
    let sha_time = sha();
    let sha_bytes: u64 = files.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    let sha_rate = mib_s(sha_bytes, sha_time);

    let hwm_before = vm_hwm_kib();
    let t = Instant::now();
    let push = r
        .push_snapshot(&h.client, "vm", "vm", "latest", IMG)
        .await
        .expect("push");
    let push_time = t.elapsed();
    let push_rate = mib_s(push.total_size, push_time);

    let t = Instant::now();
    let pull = r
        .pull_snapshot(&h.client, "vm", "latest", "restored")
        .await
        .expect("pull");
    let pull_time = t.elapsed();
    let pull_rate = mib_s(pull.tar_bytes, pull_time);
    let hwm = vm_hwm_kib();

    let pct = |x: f64| 100.0 * x / sha_rate;
    println!();
    println!(
        "registry_throughput ({mib} MiB memory snapshot, loopback docker-registry, {} layers)",
        push.layer_count
    );
    println!("| measure              | bytes (MiB) | seconds | MiB/s   | vs sha256sum | target |");
    println!("|----------------------|-------------|---------|---------|--------------|--------|");
    println!(
        "| sha256sum (baseline) | {:>11.1} | {:>7.2} | {:>7.1} | {:>11.0}% |        |",
        sha_bytes as f64 / 1048576.0,
        sha_time.as_secs_f64(),
        sha_rate,
        100.0
    );
    println!(
        "| push                 | {:>11.1} | {:>7.2} | {:>7.1} | {:>11.0}% | ≥ 50 % |",
        push.total_size as f64 / 1048576.0,
        push_time.as_secs_f64(),
        push_rate,
        pct(push_rate)
    );
    println!(
        "| pull                 | {:>11.1} | {:>7.2} | {:>7.1} | {:>11.0}% | ≥ 50 % |",
        pull.tar_bytes as f64 / 1048576.0,
        pull_time.as_secs_f64(),
        pull_rate,
        pct(pull_rate)
    );
    println!(
        "peak RSS (VmHWM): {:.1} MiB (before the transfers: {:.1} MiB); target ≤ 64 MiB",
        hwm as f64 / 1024.0,
        hwm_before as f64 / 1024.0
    );
    let ok = pct(push_rate) >= 50.0 && pct(pull_rate) >= 50.0 && hwm <= 64 * 1024;
    println!("targets: {}", if ok { "met" } else { "MISSED" });
}
