//! Registry throughput: push and pull of a snapshot (the simulator's guest memory file dominates it)
//! through a loopback docker-registry, the way the daemon moves one (`provider::transfer`: `cocoon
//! snapshot export` / `import` included), against the limits measured in the same run on the same bytes:
//!
//! - the registry's ingest limit — one monolithic PUT of the pre-hashed memory blob with curl;
//! - the registry's serve limit — one GET of it with curl to /dev/null;
//! - in-process SHA-256 with the `sha2` crate the pull verifies with (its SHA-NI path when the CPU has
//!   it; `openssl dgst -sha256` beside it shows it is the hardware rate), `sha256sum` as a secondary row;
//! - `skopeo copy` push and pull of the same blob (`--preserve-digests`: no recompression);
//! - the simulator's `snapshot export` to /dev/null and `snapshot import` from a file: the floors under
//!   vk-cocoon's rows, which include them (the daemon's path is export → push, pull → import);
//! - the daemon's pull written into a sink instead of the import: its own rate, apart from the
//!   simulator's, with the cores it and the registry kept busy meanwhile (CPU time over wall time;
//!   the registry's from `/proc`), beside the registry's while it serves curl: on loopback the
//!   registry, the receive and the hash share the machine's cores.
//!
//! A second table pushes and pulls one guest-like snapshot (zero, text-like and random pages) as v1 and as
//! v2 (zstd, chunked), alternately, for the v2 target: wall time against v1's on the same snapshot
//! (and both pulls again into a sink, without the import), with curl's PUT and GET of the memory file
//! beside them. It is measured once per link in `BENCH_WIRE_MBIT` (default `0,1000`): plain loopback,
//! where bytes cost nothing but CPU, and a shaped 1 Gbit/s wire (a proxy on loopback, `loopback_wire`),
//! where they cost time as on a node's network; no byte leaves the machine either way.
//!
//! Every figure is the median of `BENCH_RUNS` repetitions (default 3) with the spread (min–max), and a
//! ratio to its limit. Peak RSS (VmHWM, reset before each transfer after `malloc_trim`; glibc capped at two
//! arenas as in the daemon) is this process's. Rows per size in
//! `BENCH_SNAPSHOT_MIB` (default `1024`; e.g. `1024,4096`); each size's data lives in temporary
//! directories removed when its row is done.
//!
//! `cargo bench --bench registry_throughput` (needs `cargo build --release -p cocoon-sim`, Debian's
//! docker-registry, curl, openssl and skopeo).

mod loopback_wire;
mod registry_baselines;

use loopback_wire::{Wire, WireShape};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vk_cocoon::registry::{Progress, RegistryAuth, TransferSettings};
use vk_cocoon::runtime::{CocoonRuntime, CpuPolicy, RunSpec};
use vk_test_support::bench::{cpu_time, env_list, env_u64, locate_sim, status_kib};
use vk_test_support::registry_support::{TestRegistry, TransferClient, transfer_client_at};
use vk_test_support::runtime_support;

const IMG: &str = "ghcr.io/cocoonstack/cocoon/ubuntu:24.04";
const MIB: f64 = 1048576.0;

/// Resets VmHWM to the current RSS (`/proc/self/clear_refs`, value 5), after handing the heap's free
/// memory back (`malloc_trim`), so a row's peak is its own transfer's and not what earlier rows left
/// cached in the allocator.
#[allow(unsafe_code)]
fn reset_hwm() {
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The daemon's allocator setting (`main.rs`: at most two glibc arenas), so the peaks are the
/// daemon's and not those of a process with an arena per thread.
fn cap_malloc_arenas_like_the_daemon() {
    vk_cocoon::host::process::cap_malloc_arenas(2);
}

/// The daemon's pull without `cocoon snapshot import`: the same fetch, verification, decoding
/// and import tar, written into a sink. It separates the daemon's own rate from the
/// simulator's import, which bounds the pull rows. Returns the time, the tar's bytes and the
/// CPU time this process spent (user + system, every thread).
async fn pull_into_sink(client: &TransferClient, repo: &str) -> (Duration, u64, Duration) {
    let (t, cpu) = (Instant::now(), cpu_time(libc::RUSAGE_SELF));
    let source = client.open_snapshot(repo, "latest").await.expect("open the snapshot");
    let report = client
        .write_snapshot(&source, "restored", &mut tokio::io::sink(), &Progress::new())
        .await
        .expect("pull into a sink");
    (t.elapsed(), report.tar_bytes, cpu_time(libc::RUSAGE_SELF) - cpu)
}

/// The cores `cpu` kept busy over `wall`.
fn cores_busy(cpu: Duration, wall: Duration) -> f64 {
    cpu.as_secs_f64() / wall.as_secs_f64()
}

/// One measure: bytes moved and the time of each repetition.
struct Row {
    name: String,
    bytes: u64,
    times: Vec<Duration>,
}

impl Row {
    fn new(name: &str, bytes: u64) -> Row {
        Row {
            name: name.into(),
            bytes,
            times: Vec::new(),
        }
    }

    fn rates(&self) -> Vec<f64> {
        let mut r: Vec<f64> = self
            .times
            .iter()
            .map(|t| self.bytes as f64 / MIB / t.as_secs_f64())
            .collect();
        r.sort_by(|a, b| a.partial_cmp(b).unwrap());
        r
    }

    fn median_rate(&self) -> f64 {
        let r = self.rates();
        r[r.len() / 2]
    }

    fn median_secs(&self) -> f64 {
        let mut t: Vec<f64> = self.times.iter().map(Duration::as_secs_f64).collect();
        t.sort_by(|a, b| a.partial_cmp(b).unwrap());
        t[t.len() / 2]
    }

    fn spread(&self) -> String {
        let r = self.rates();
        format!("{:.0}–{:.0}", r[0], r[r.len() - 1])
    }
}

fn main() {
    loopback_wire::serve_if_asked();
    cap_malloc_arenas_like_the_daemon();
    locate_sim();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let runs = env_u64("BENCH_RUNS", 3).max(1) as usize;
    for mib in env_list("BENCH_SNAPSHOT_MIB", "1024") {
        rt.block_on(size_row(mib, runs));
    }
}

/// The guest-like memory of the v2 rows: percent of 4 KiB pages that are zero and text-like (the rest
/// random). An assumption, not a measurement of a real guest (none runs here): a small guest whose RAM
/// is half untouched and a quarter page cache of text. The table prints the compression it gives.
const GUEST_ZERO_PCT: u8 = 50;
const GUEST_TEXT_PCT: u8 = 25;

/// A simulator with VM `vm` running and its snapshot `vm` saved (`mib` MiB of guest memory: pseudo-random,
/// or the guest-like mix when `guest`).
async fn saved_snapshot(mib: u64, guest: bool) -> (runtime_support::Harness, PathBuf) {
    let h = runtime_support::harness_with(|c| c.timeouts.transfer = Duration::from_secs(3600));
    h.sim
        .set_settings(|s| {
            if guest {
                s.snapshot_memory_zero_pct = GUEST_ZERO_PCT;
                s.snapshot_memory_text_pct = GUEST_TEXT_PCT;
            }
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
    h.client.snapshot_save("vm", &vm.id).await.unwrap();
    let id = h.client.snapshot_inspect("vm").await.unwrap().id;
    let memory = h.dir.path().join("snapshots").join(&id).join("memory-ranges");
    (h, memory)
}

struct Measured {
    rows: Vec<Row>,
    push_hwm_kib: u64,
    pull_hwm_kib: u64,
    layers: usize,
    /// Cores this process and the registry kept busy (CPU time over wall time) in each pull into a
    /// sink.
    sink_cores: Vec<(f64, f64)>,
    /// Cores the registry kept busy while it served curl's GET.
    serve_cores: Vec<f64>,
}

async fn size_row(mib: u64, runs: usize) {
    eprintln!("[{mib} MiB] saving the snapshot…");
    let work = tempfile::tempdir().unwrap();
    let reg = tokio::task::spawn_blocking(TestRegistry::start).await.unwrap();
    let m = if table_wanted("limits") {
        let (h, memory) = saved_snapshot(mib, false).await;
        let m = measure(&reg, &h, &memory, work.path(), runs).await;
        drop(h);
        Some(m)
    } else {
        None
    };
    let v2 = if table_wanted("v2") {
        let (h, memory) = saved_snapshot(mib, true).await;
        let (digest, _) = registry_baselines::sha2_file(&memory);
        let mut tables = Vec::new();
        for (n, shape) in wires().into_iter().enumerate() {
            eprintln!("[{mib} MiB] guest-like memory, v1 against v2, {}…", wire_name(shape));
            let wire = shape.map(|shape| Wire::start(reg.addr(), shape));
            let host = wire.as_ref().map_or_else(|| reg.host(), Wire::host);
            let route = Route {
                host: &host,
                name: format!("w{n}"),
            };
            let m = measure_v2(&route, &h, (&memory, &digest), runs).await;
            tables.push((shape, m));
        }
        drop(h);
        Some(tables)
    } else {
        None
    };
    drop(reg);
    drop(work);
    if let Some(m) = m {
        print_table(mib, runs, &m);
    }
    for (shape, v2) in v2.iter().flatten() {
        print_v2_table(mib, runs, *shape, v2);
    }
}

/// `BENCH_TABLES` (default `limits,v2`): which tables to measure — `limits` (v1 against the registry's,
/// the hash's and skopeo's limits) and `v2` (guest-like memory, v1 against v2).
fn table_wanted(name: &str) -> bool {
    std::env::var("BENCH_TABLES")
        .unwrap_or_else(|_| "limits,v2".into())
        .split(',')
        .any(|t| t.trim() == name)
}

/// The links the v2 table is measured over: `BENCH_WIRE_MBIT` (default `0,1000`), megabits per second
/// each way, 0 for plain loopback; a rate runs the transfers through a [`Wire`] of that rate with a
/// one-way delay of `BENCH_WIRE_DELAY_MS` (default 1: a registry a couple of milliseconds' round trip
/// away). The v2 target is about a link on which bytes cost time; loopback alone has none.
fn wires() -> Vec<Option<WireShape>> {
    let delay = Duration::from_millis(env_u64("BENCH_WIRE_DELAY_MS", 1));
    env_list("BENCH_WIRE_MBIT", "0,1000")
        .into_iter()
        .map(|mbit_per_s| {
            (mbit_per_s > 0).then_some(WireShape {
                mbit_per_s,
                one_way_delay: delay,
            })
        })
        .collect()
}

fn wire_name(shape: Option<WireShape>) -> String {
    match shape {
        None => "plain loopback".into(),
        Some(s) => format!(
            "a {} Mbit/s wire ({:.0} MiB/s each way, {} ms one-way delay)",
            s.mbit_per_s,
            s.mib_per_s(),
            s.one_way_delay.as_millis()
        ),
    }
}

/// Where the v2 table's transfers go: the registry's address or a wire in front of it, and a name that
/// keeps each route's repositories apart (a push into a repository that already links a blob skips it).
struct Route<'a> {
    host: &'a str,
    name: String,
}

/// The v2 writer's settings in the bench: zstd `BENCH_V2_ZSTD_LEVEL` (default 1: on guest memory it
/// stores what level 3 stores for less CPU, and the push is CPU-bound), `BENCH_V2_CHUNK_MIB` chunks
/// (default 4), the rest as [`v1_settings`].
fn v2_settings() -> TransferSettings {
    TransferSettings {
        zstd_level: env_u64("BENCH_V2_ZSTD_LEVEL", 1) as i32,
        chunk_size: env_u64("BENCH_V2_CHUNK_MIB", 4) << 20,
        ..v1_settings()
    }
}

/// The v1 writer's settings in the v2 table: the defaults, with `BENCH_PULL_BUDGET_MIB` if set.
fn v1_settings() -> TransferSettings {
    let defaults = TransferSettings::default();
    TransferSettings {
        pull_budget: env_u64("BENCH_PULL_BUDGET_MIB", defaults.pull_budget >> 20) << 20,
        ..defaults
    }
}

struct MeasuredV2 {
    /// push v1, pull v1, push v2, pull v2, the pulls of v1 and v2 into a sink, then curl's PUT and GET
    /// of the memory file on the same route (the registry's ingest and serve limits through it).
    rows: Vec<Row>,
    /// Bytes the registry stores for the v1 and the v2 artifact.
    stored: (u64, u64),
    /// Peak RSS of each row.
    hwm_kib: [u64; 6],
}

/// The same guest-like snapshot pushed and pulled as v1 and as v2, alternately.
async fn measure_v2(
    route: &Route<'_>,
    h: &runtime_support::Harness,
    (memory, digest): (&Path, &str),
    runs: usize,
) -> MeasuredV2 {
    let client = |settings| transfer_client_at(route.host, "bench", "bench-node", RegistryAuth::Anonymous, settings);
    let (v1, v2): (TransferClient, TransferClient) = (client(v1_settings()), client(v2_settings()));
    let memory_bytes = std::fs::metadata(memory).unwrap().len();
    let mut rows = vec![
        Row::new("vk-cocoon push v1", 0),
        Row::new("vk-cocoon pull v1", 0),
        Row::new("vk-cocoon push v2", 0),
        Row::new("vk-cocoon pull v2", 0),
        Row::new("pull v1 into a sink (no import)", 0),
        Row::new("pull v2 into a sink (no import)", 0),
        Row::new("registry ingest: one PUT, curl", memory_bytes),
        Row::new("registry serve: one GET, curl", memory_bytes),
    ];
    let (mut stored, mut hwm) = ((0, 0), [0; 6]);
    for run in 0..runs {
        eprintln!("  run {}/{runs}", run + 1);
        let curl_repo = format!("bench/guest-{}-curl", route.name);
        rows[6]
            .times
            .push(registry_baselines::ingest(route.host, &curl_repo, memory, digest));
        rows[7]
            .times
            .push(registry_baselines::serve(route.host, &curl_repo, digest));
        for (i, client) in [&v1, &v2].into_iter().enumerate() {
            let repo = format!("guest-{}-{i}-{run}", route.name);
            reset_hwm();
            let t = Instant::now();
            let push = client
                .push_snapshot(&h.client, "vm", &repo, "latest", IMG)
                .await
                .expect("push");
            rows[2 * i].times.push(t.elapsed());
            rows[2 * i].bytes = push.file_bytes;
            hwm[2 * i] = hwm[2 * i].max(status_kib("VmHWM:"));
            if i == 0 {
                stored.0 = push.total_size;
            } else {
                assert!(push.v2, "{push:?}");
                stored.1 = push.total_size;
            }
            reset_hwm();
            let t = Instant::now();
            client
                .pull_snapshot(&h.client, &repo, "latest", "restored")
                .await
                .expect("pull");
            rows[2 * i + 1].times.push(t.elapsed());
            rows[2 * i + 1].bytes = push.file_bytes;
            hwm[2 * i + 1] = hwm[2 * i + 1].max(status_kib("VmHWM:"));
            h.client.snapshot_remove_if_exists("restored").await.unwrap();
            reset_hwm();
            let (took, _, _) = pull_into_sink(client, &repo).await;
            rows[4 + i].times.push(took);
            rows[4 + i].bytes = push.file_bytes;
            hwm[4 + i] = hwm[4 + i].max(status_kib("VmHWM:"));
        }
    }
    MeasuredV2 {
        rows,
        stored,
        hwm_kib: hwm,
    }
}

fn print_v2_table(mib: u64, runs: usize, shape: Option<WireShape>, m: &MeasuredV2) {
    let s = v2_settings();
    println!();
    println!(
        "registry_throughput v2 over {}: {mib} MiB guest-like memory ({GUEST_ZERO_PCT} % zero pages, {GUEST_TEXT_PCT} % text, the rest random); v2 = zstd {}, {} MiB chunks, {} transfers, {} MiB push and {} MiB pull budgets; median of {runs}",
        wire_name(shape),
        s.zstd_level,
        s.chunk_size >> 20,
        s.concurrency,
        s.push_budget >> 20,
        s.pull_budget >> 20
    );
    println!(
        "stored: v1 {:.0} MiB, v2 {:.0} MiB ({:.1} % of v1)",
        m.stored.0 as f64 / MIB,
        m.stored.1 as f64 / MIB,
        100.0 * m.stored.1 as f64 / m.stored.0 as f64
    );
    println!("| measure | MiB (files) | s | MiB/s | spread MiB/s | peak RSS MiB | ratio | target |");
    println!("|---|---|---|---|---|---|---|---|");
    let rate = |i: usize| m.rows[i].median_rate();
    let wall_vs = |i: usize, of: usize| 100.0 * m.rows[i].median_secs() / m.rows[of].median_secs();
    for (i, r) in m.rows.iter().enumerate() {
        let (ratio, target) = match i {
            0 => (format!("{:.0} % of curl's PUT", 100.0 * rate(0) / rate(6)), ""),
            4 => (format!("{:.0} % of curl's GET", 100.0 * rate(4) / rate(7)), ""),
            2 | 3 => (format!("wall {:.0} % of v1's", wall_vs(i, i - 2)), "≤ 50 % of v1"),
            5 => (format!("wall {:.0} % of v1's", wall_vs(5, 4)), ""),
            6 | 7 => match shape {
                Some(s) => (format!("{:.0} % of the wire", 100.0 * rate(i) / s.mib_per_s()), ""),
                None => ("limit".to_string(), ""),
            },
            _ => ("—".to_string(), ""),
        };
        let hwm = m
            .hwm_kib
            .get(i)
            .map_or("—".to_string(), |kib| format!("{:.1}", *kib as f64 / 1024.0));
        println!(
            "| {} | {:.0} | {:.2} | {:.0} | {} | {hwm} | {ratio} | {target} |",
            r.name,
            r.bytes as f64 / MIB,
            r.median_secs(),
            r.median_rate(),
            r.spread(),
        );
    }
    let ok = |i: usize| m.rows[i].median_secs() <= 0.5 * m.rows[i - 2].median_secs();
    let hwm = m.hwm_kib.iter().max().copied().unwrap_or(0);
    println!(
        "peak RSS (VmHWM, reset before each transfer): {:.1} MiB; targets: v2 push {}, v2 pull {}, RSS {}",
        hwm as f64 / 1024.0,
        if ok(2) { "met" } else { "MISSED" },
        if ok(3) { "met" } else { "MISSED" },
        if hwm <= 64 * 1024 { "met" } else { "MISSED" }
    );
}

async fn measure(
    reg: &TestRegistry,
    h: &runtime_support::Harness,
    memory: &Path,
    work: &Path,
    runs: usize,
) -> Measured {
    let host = reg.host();
    let blob_bytes = std::fs::metadata(memory).unwrap().len();
    let (digest, _) = registry_baselines::sha2_file(memory); // warms the page cache
    let layout = registry_baselines::oci_layout(&work.join("layout"), memory, &digest);
    let client: TransferClient = reg.transfer_client("bench", "bench-node");
    let mut rows = vec![
        Row::new("in-process SHA-256 (sha2)", blob_bytes),
        Row::new("openssl dgst -sha256", blob_bytes),
        Row::new("sha256sum (secondary)", blob_bytes),
        Row::new("registry ingest: one PUT, curl", blob_bytes),
        Row::new("registry serve: one GET, curl", blob_bytes),
        Row::new("skopeo copy push", blob_bytes),
        Row::new("skopeo copy pull", blob_bytes),
        Row::new("vk-cocoon push v1", 0),
        Row::new("vk-cocoon pull v1", 0),
        Row::new("cocoon export to /dev/null (sim)", 0),
        Row::new("cocoon import from a file (sim)", 0),
        Row::new("vk-cocoon pull v1 into a sink (no import)", 0),
    ];
    let (mut push_hwm, mut pull_hwm, mut layers) = (0, 0, 0);
    let (mut sink_cores, mut serve_cores) = (Vec::new(), Vec::new());
    for run in 0..runs {
        eprintln!("  run {}/{runs}", run + 1);
        let (d, t) = registry_baselines::sha2_file(memory);
        assert_eq!(d, digest);
        rows[0].times.push(t);
        rows[1].times.push(registry_baselines::openssl(memory));
        rows[2].times.push(registry_baselines::sha256sum(memory));
        rows[3]
            .times
            .push(registry_baselines::ingest(&host, "bench/ingest", memory, &digest));
        let registry_cpu = reg.cpu_time();
        let took = registry_baselines::serve(&host, "bench/ingest", &digest);
        rows[4].times.push(took);
        serve_cores.push(cores_busy(reg.cpu_time() - registry_cpu, took));
        let skopeo_repo = format!("bench/skopeo-{run}");
        rows[5]
            .times
            .push(registry_baselines::skopeo_push(&layout, &host, &skopeo_repo));
        rows[6]
            .times
            .push(registry_baselines::skopeo_pull(&host, &skopeo_repo, work));
        registry_baselines::unlink_blob(&host, &skopeo_repo, &digest);

        let repo = format!("vm-{run}");
        reset_hwm();
        let t = Instant::now();
        let push = client
            .push_snapshot(&h.client, "vm", &repo, "latest", IMG)
            .await
            .expect("push");
        rows[7].times.push(t.elapsed());
        rows[7].bytes = push.total_size;
        push_hwm = push_hwm.max(status_kib("VmHWM:"));
        layers = push.layer_count;

        reset_hwm();
        let t = Instant::now();
        let pull = client
            .pull_snapshot(&h.client, &repo, "latest", "restored")
            .await
            .expect("pull");
        rows[8].times.push(t.elapsed());
        rows[8].bytes = pull.tar_bytes;
        pull_hwm = pull_hwm.max(status_kib("VmHWM:"));
        h.client.snapshot_remove_if_exists("restored").await.unwrap();
        let registry_cpu = reg.cpu_time();
        let (took, tar_bytes, cpu) = pull_into_sink(&client, &repo).await;
        rows[11].times.push(took);
        rows[11].bytes = tar_bytes;
        sink_cores.push((cores_busy(cpu, took), cores_busy(reg.cpu_time() - registry_cpu, took)));

        // The simulator's own rates: the floor under the push (export) and the pull (import) rows.
        let tar = work.join("export.tar");
        let t = Instant::now();
        let mut export = h.client.snapshot_export("vm").await.unwrap();
        let n = tokio::io::copy(&mut export, &mut tokio::io::sink()).await.unwrap();
        rows[9].times.push(t.elapsed());
        rows[9].bytes = n;
        let mut export = h.client.snapshot_export("vm").await.unwrap();
        let mut f = tokio::fs::File::create(&tar).await.unwrap();
        tokio::io::copy(&mut export, &mut f).await.unwrap();
        drop(f);
        let mut f = tokio::fs::File::open(&tar).await.unwrap();
        let t = Instant::now();
        h.client.snapshot_import("restored", &mut f).await.unwrap();
        rows[10].times.push(t.elapsed());
        rows[10].bytes = n;
        std::fs::remove_file(&tar).unwrap();
        h.client.snapshot_remove_if_exists("restored").await.unwrap();
    }
    Measured {
        rows,
        push_hwm_kib: push_hwm,
        pull_hwm_kib: pull_hwm,
        layers,
        sink_cores,
        serve_cores,
    }
}

fn print_table(mib: u64, runs: usize, m: &Measured) {
    let rate = |i: usize| m.rows[i].median_rate();
    let (hash, ingest, serve, sk_push, sk_pull) = (rate(0), rate(3), rate(4), rate(5), rate(6));
    let pull_limit = serve.min(hash);
    let ratio = |i: usize| -> String {
        match i {
            0 => "limit (hash)".into(),
            1 | 2 => format!("{:.2}× sha2", rate(i) / hash),
            3 => "limit (ingest)".into(),
            4 => "limit (serve)".into(),
            5 => format!("{:.0} % of ingest", 100.0 * rate(i) / ingest),
            6 => format!("{:.0} % of min(serve, hash)", 100.0 * rate(i) / pull_limit),
            7 => format!(
                "{:.0} % of ingest; {:.2}× skopeo; {:.0} % of the export",
                100.0 * rate(i) / ingest,
                rate(i) / sk_push,
                100.0 * rate(i) / rate(9)
            ),
            8 => format!(
                "{:.0} % of min(serve, hash); {:.2}× skopeo; {:.0} % of the import",
                100.0 * rate(i) / pull_limit,
                rate(i) / sk_pull,
                100.0 * rate(i) / rate(10)
            ),
            9 => "floor under push".into(),
            10 => "floor under pull".into(),
            11 => format!(
                "{:.0} % of min(serve, hash); {:.2}× skopeo",
                100.0 * rate(i) / pull_limit,
                rate(i) / sk_pull
            ),
            _ => String::new(),
        }
    };
    let target = |i: usize| match i {
        7 => "≥ 90 % of ingest, ≥ 1.5× skopeo",
        8 => "≥ 80 % of min, ≥ 1.5× skopeo",
        _ => "",
    };
    println!();
    println!(
        "registry_throughput: {mib} MiB guest memory, {} layers, loopback docker-registry; median of {runs} (spread min–max); SHA-NI {}",
        m.layers,
        if registry_baselines::sha_ni() {
            "available"
        } else {
            "absent"
        }
    );
    println!("| measure | MiB | s | MiB/s | spread MiB/s | ratio | target |");
    println!("|---|---|---|---|---|---|---|");
    for (i, r) in m.rows.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.2} | {:.0} | {} | {} | {} |",
            r.name,
            r.bytes as f64 / MIB,
            r.median_secs(),
            r.median_rate(),
            r.spread(),
            ratio(i),
            target(i)
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "cores kept busy (CPU time over wall time, per run) of the {cores}: pull v1 into a sink {}; registry serving curl {}",
        m.sink_cores
            .iter()
            .map(|(us, registry)| format!("{us:.2} here + {registry:.2} registry"))
            .collect::<Vec<_>>()
            .join(", "),
        m.serve_cores
            .iter()
            .map(|c| format!("{c:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let push_ok = rate(7) >= 0.9 * ingest && rate(7) >= 1.5 * sk_push;
    let pull_ok = rate(8) >= 0.8 * pull_limit && rate(8) >= 1.5 * sk_pull;
    let hwm = m.push_hwm_kib.max(m.pull_hwm_kib);
    println!(
        "peak RSS (VmHWM, reset before each transfer): push {:.1} MiB, pull {:.1} MiB; target ≤ 64 MiB",
        m.push_hwm_kib as f64 / 1024.0,
        m.pull_hwm_kib as f64 / 1024.0
    );
    println!(
        "targets: push {}, pull {}, RSS {}",
        if push_ok { "met" } else { "MISSED" },
        if pull_ok { "met" } else { "MISSED" },
        if hwm <= 64 * 1024 { "met" } else { "MISSED" }
    );
}
