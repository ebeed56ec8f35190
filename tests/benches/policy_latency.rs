//! Policy decision latency: every slot's default policy on the daemon's fresh-instance path
//! (a new pooled instance per decision, facts lowered to WIT and the decision lifted back),
//! beside the same decision code called natively in the same process; the epoch clock's
//! wake-ups while the engine idles; and the start-up cost of loading all five slots from the
//! compile cache, beside compiling them from scratch.
//!
//! Each row's facts are written once, as a decision input (a pod manifest and host facts, the
//! shape of a case table), decoded by the host exactly as the daemon decodes a live pod; the
//! native baseline gets the same facts through serde (host and guest bindings are generated
//! from the same WIT, so they share one JSON shape), and the two decisions must agree.
//!
//! Then the languages table (issue 40): the Python and JavaScript example policies
//! (`policies/examples`, built by `policies/examples/build.sh` into `target/policy-examples` or
//! `$VK_POLICY_EXAMPLES_DIR`) beside the Rust default of the same slot, on the same facts and
//! deciding the same: p50/p99 per decision, a fresh instance alone, the compile and its cache
//! entry's size. Without the built examples those rows are skipped, saying why.
//!
//! Then the decision log's cost (logging every decision, beside the log off), and decisions on a
//! loaded machine (three busy threads per core; failures beside the decisions a wall-clock
//! deadline would have failed).
//!
//! Run: `cargo bench --bench policy_latency` (release profile). Prints a table; figures are
//! ratios to the native baseline measured in the same run. `cargo bench --bench policy_latency
//! -- decision-log` runs only the decision log's section (the others take minutes).

use std::hint::black_box;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde::de::DeserializeOwned;
use vk_cocoon::policy::input::{DecisionInput, facts_for};
use vk_cocoon::policy::slots::{BringUp, CpuClassAdmission, GuestFixup, ResourceTranslation, SnapshotBeforeDestroy};
use vk_cocoon::policy::{
    CompileCache, LoadedPolicy, Policies, PolicyEngine, PolicyMetrics, PolicySlot, SandboxLimits, Slot,
};

const WARMUP: usize = 500;
const SAMPLES: usize = 20_000;
const STARTUP_RUNS: usize = 15;
/// The languages table: a CPython decision costs milliseconds, so fewer samples per row.
const LANG_WARMUP: usize = 50;
const LANG_SAMPLES: usize = 2_000;

/// The pod every row decides about: a managed main agent of CocoonSet `demo`, pinned to CPU
/// class genoa.
const POD: &str = r#"
metadata:
  namespace: ns
  name: demo-0
  uid: 0b0d2a4e-5c43-4c6f-9f1e-0d5a9a2d7e11
  labels: {cocoonset.cocoonstack.io/name: demo}
  ownerReferences: [{apiVersion: cocoonset.cocoonstack.io/v1, kind: CocoonSet, name: demo, uid: cs-1, controller: true}]
  annotations:
    vm.cocoonstack.io/name: vk-ns-demo-0-505043
    cocoonset.cocoonstack.io/managed: "true"
    cocoonset.cocoonstack.io/image: agent-base:v3
    cocoonset.cocoonstack.io/snapshot-policy: main-only
    cocoonset.cocoonstack.io/network: net-a
spec:
  nodeSelector: {cocoonstack.io/snapshot-cpu-class: genoa}
  containers: [{name: agent, resources: {requests: {cpu: 500m, memory: 2Gi}, limits: {cpu: "2"}}}]
status: {phase: Running}
"#;

/// `host:` facts of each row (merged over the slot's defaults).
fn host(slot: Slot) -> &'static str {
    match slot {
        Slot::SnapshotBeforeDestroy => "{pusher-configured: true, vm-running: true}",
        Slot::BringUp => "{evidence: None, registry-configured: true, node-restore-mode: Mmap}",
        Slot::CpuClassAdmission => "{context: Create, node-name: node-a, node-class: genoa}",
        Slot::ResourceTranslation => "{path: Run}",
        // A firecracker clone with a static and a DHCP NIC: the default policy's longest script
        // (MACs re-applied, one networkd file per NIC).
        Slot::GuestFixup => {
            r#"{vm-id: fc-0b0d2a4e, hypervisor: Firecracker, origin: Clone, source-image: "agent-base:v3",
                nics: [{mac: "02:fc:00:00:00:01", ip: 10.0.0.2, gateway: 10.0.0.1, prefix: 24},
                       {mac: "02:fc:00:00:00:02", ip: "", gateway: "", prefix: 0}]}"#
        }
    }
}

fn input(slot: Slot) -> DecisionInput {
    let mut pod: serde_json::Value = serde_yaml_ng::from_str(POD).expect("pod manifest");
    if slot == Slot::GuestFixup {
        pod["metadata"]["annotations"]["vm.cocoonstack.io/backend"] = "firecracker".into();
    }
    DecisionInput {
        pod,
        host: serde_yaml_ng::from_str(host(slot)).expect("host facts"),
    }
}

struct Stats {
    p50: Duration,
    p99: Duration,
}

fn measure(mut f: impl FnMut(), samples: usize) -> Stats {
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        f();
        times.push(start.elapsed());
    }
    times.sort();
    Stats {
        p50: times[samples / 2],
        p99: times[samples * 99 / 100],
    }
}

fn us(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e6)
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

/// One row: `S`'s default policy through the sandbox, beside `native` (the same guest crate's
/// `decide`) on the same facts.
fn row<S: PolicySlot, F: DeserializeOwned, D: Serialize>(engine: &PolicyEngine, native: fn(&F) -> D) {
    let policy = LoadedPolicy::<S>::builtin(engine, None).expect("default policy loads");
    let facts = facts_for::<S>(&input(S::SLOT)).expect("the row's facts");
    let native_facts: F =
        serde_json::from_value(serde_json::to_value(&facts).unwrap()).expect("host facts fit the guest's types");
    let wasm_decision = policy.decide(engine, &facts).expect("the default decides");
    assert_eq!(
        serde_json::to_value(&wasm_decision).unwrap(),
        serde_json::to_value(native(&native_facts)).unwrap(),
        "{}: the component and the native build decide alike",
        S::SLOT
    );
    // A decision that misses its wall-clock deadline on a starved machine is counted, not fatal.
    let missed = std::cell::Cell::new(0usize);
    let wasm_once = || {
        if policy.decide(engine, black_box(&facts)).is_err() {
            missed.set(missed.get() + 1);
        }
    };
    let native_once = || {
        black_box(native(black_box(&native_facts)));
    };
    for _ in 0..WARMUP {
        wasm_once();
        native_once();
    }
    let wasm = measure(wasm_once, SAMPLES);
    let base = measure(native_once, SAMPLES);
    println!(
        "{:<26} {:>12} {:>12} {:>13} {:>13} {:>9.1}x {:>9.1}x",
        S::NAME,
        us(wasm.p50),
        us(wasm.p99),
        us(base.p50),
        us(base.p99),
        wasm.p50.as_secs_f64() / base.p50.as_secs_f64(),
        wasm.p99.as_secs_f64() / base.p99.as_secs_f64(),
    );
    if missed.get() > 0 {
        println!(
            "  ({} of {} decisions missed the deadline on this run)",
            missed.get(),
            WARMUP + SAMPLES
        );
    }
}

/// Context switches (voluntary and not) of this process's thread named `name`.
fn thread_switches(name: &str) -> Option<u64> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).ok()?;
        return Some(
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches"))
                .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
                .sum(),
        );
    }
    None
}

/// The epoch clock's wake-ups per second while the engine has nothing to decide.
fn idle_wakeups(engine: &PolicyEngine) {
    let window = Duration::from_secs(3);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !engine.clock_parked() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let (ticks, switches) = (engine.clock_ticks(), thread_switches("policy-epoch"));
    std::thread::sleep(window);
    let per_s = |n: u64| n as f64 / window.as_secs_f64();
    println!();
    println!("idle engine over {window:?} (after the last decision and the clock's linger)");
    println!(
        "{:<34} {:>10}",
        "epoch ticks per second",
        per_s(engine.clock_ticks() - ticks)
    );
    if let (Some(before), Some(after)) = (switches, thread_switches("policy-epoch")) {
        println!(
            "{:<34} {:>10}",
            "clock thread wake-ups per second",
            per_s(after - before)
        );
    }
}

/// The daemon's decision path (`Policies::decide`: metrics, fail-safe handling) with the
/// decision log off — the default, one branch — beside the same path logging every decision to
/// a file (VK_DECISION_LOG=path) on the same facts, interleaved per block so drift hits both.
///
/// Before each *off* block the bench waits until the log's writer has written every record of
/// the *on* blocks before it (`DecisionLog::flush`, which answers once the writer reaches a
/// marker queued behind them): a writer still working off a backlog would otherwise share the
/// cores with the baseline, and the baseline must be free of the log. The *on* blocks pay the
/// writer's work as the daemon does, concurrently.
fn decision_log_cost() {
    use vk_cocoon::policy::decision_log::{DecisionLog, LogTarget};
    let dir = tempfile::tempdir().expect("temp dir");
    let new_policies = |log: Option<DecisionLog>| {
        let engine = PolicyEngine::new(SandboxLimits::default()).expect("engine");
        Policies::with_defaults(engine, None, PolicyMetrics::unregistered())
            .expect("defaults load")
            .with_decision_log(log)
    };
    let off = new_policies(None);
    let target = LogTarget::File {
        path: dir.path().join("decisions.jsonl"),
        max_bytes: 256 << 20,
    };
    let on = new_policies(Some(DecisionLog::open(target).expect("open the log")));
    let facts = facts_for::<BringUp>(&input(Slot::BringUp)).expect("facts");
    for _ in 0..WARMUP {
        black_box(off.decide::<BringUp>(black_box(&facts)));
        black_box(on.decide::<BringUp>(black_box(&facts)));
    }
    let log = on.decision_log().expect("the log is on");
    let (mut off_times, mut on_times) = (Vec::new(), Vec::new());
    for _ in 0..10 {
        assert!(
            log.flush(),
            "the decision log's writer did not catch up within its flush wait"
        );
        off_times.push(measure(
            || {
                black_box(off.decide::<BringUp>(black_box(&facts)));
            },
            SAMPLES / 10,
        ));
        on_times.push(measure(
            || {
                black_box(on.decide::<BringUp>(black_box(&facts)));
            },
            SAMPLES / 10,
        ));
    }
    let median = |v: &[Stats], f: fn(&Stats) -> Duration| {
        let mut d: Vec<Duration> = v.iter().map(f).collect();
        d.sort();
        d[d.len() / 2]
    };
    let (off50, off99) = (median(&off_times, |s| s.p50), median(&off_times, |s| s.p99));
    let (on50, on99) = (median(&on_times, |s| s.p50), median(&on_times, |s| s.p99));
    println!();
    println!("decision log: bring-up through Policies::decide (median of 10 interleaved blocks)");
    println!("{:<34} {:>12} {:>12}", "VK_DECISION_LOG", "p50 us", "p99 us");
    println!("{:<34} {:>12} {:>12}", "off (baseline)", us(off50), us(off99));
    println!("{:<34} {:>12} {:>12}", "a file", us(on50), us(on99));
    println!(
        "{:<34} {:>11.2}x {:>11.2}x",
        "on / off",
        on50.as_secs_f64() / off50.as_secs_f64(),
        on99.as_secs_f64() / off99.as_secs_f64()
    );
    // A ratio bought by dropping records would be no ratio: say how many lines were written.
    assert!(log.flush(), "the decision log's writer did not catch up");
    let written = std::fs::read_to_string(dir.path().join("decisions.jsonl"))
        .map(|text| text.lines().count())
        .unwrap_or(0);
    println!(
        "{:<34} {:>12} {:>12}",
        "records written / dropped",
        written,
        log.dropped()
    );
    // What a record costs the writer thread, which shares the cores with the decisions.
    if let Some(cpu) = thread_cpu("decision-log") {
        println!(
            "{:<34} {:>12}",
            "writer CPU us per record",
            us(cpu / u32::try_from(written.max(1)).unwrap_or(u32::MAX))
        );
    }
}

/// CPU time the thread named `name` has run (the scheduler's own count, in ns).
fn thread_cpu(name: &str) -> Option<Duration> {
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == name {
            let schedstat = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
            let ns = schedstat.split_whitespace().next()?.parse::<u64>().ok()?;
            return Some(Duration::from_nanos(ns));
        }
    }
    None
}

/// Decisions on a loaded machine (issue 39): busy threads, three per usable core, share the cores
/// with the deciding thread while the default admission policy decides with a 2 ms deadline
/// (some 200 times what a decision costs). The baseline, counted in the same run: decisions that
/// took longer than the deadline in wall time (the thread waited for a core mid-decision) — each
/// one a failure under a wall-clock deadline. The figure: decisions that failed.
fn loaded_machine() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    const TIMEOUT: Duration = Duration::from_millis(2);
    const DECISIONS: usize = 20_000;
    let engine = PolicyEngine::new(SandboxLimits {
        timeout: TIMEOUT,
        ..SandboxLimits::default()
    })
    .expect("engine");
    let policy = LoadedPolicy::<CpuClassAdmission>::builtin(&engine, None).expect("default policy loads");
    let facts = facts_for::<CpuClassAdmission>(&input(Slot::CpuClassAdmission)).expect("the row's facts");
    let cores = vk_cocoon::host::cpu::usable_cpus() as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = (0..3 * cores)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let (mut failed, mut past_deadline) = (0usize, 0usize);
    let mut times = Vec::with_capacity(DECISIONS);
    for _ in 0..DECISIONS {
        let started = Instant::now();
        let decided = policy.decide(&engine, black_box(&facts)).is_ok();
        let took = started.elapsed();
        failed += usize::from(!decided);
        past_deadline += usize::from(took > TIMEOUT);
        times.push(took);
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    stop.store(true, Relaxed);
    busy.into_iter().for_each(|t| t.join().expect("busy thread"));
    times.sort();
    println!();
    println!(
        "loaded machine: {} busy threads on {cores} cores beside the deciding one; {DECISIONS} decisions, deadline {TIMEOUT:?}; load average {}",
        3 * cores,
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!(
        "{:<44} {:>10}",
        "decision p50 / p99 us (wall)",
        format!("{} / {}", us(times[DECISIONS / 2]), us(times[DECISIONS * 99 / 100]))
    );
    println!(
        "{:<44} {:>10}",
        "past the deadline in wall time (baseline)", past_deadline
    );
    println!("{:<44} {:>10}", "failed decisions", failed);
}

/// Bytes under `dir` (the compile cache's entries).
fn dir_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Where the example components are, or why their rows are skipped.
fn examples_dir() -> Result<std::path::PathBuf, String> {
    let dir = std::env::var_os("VK_POLICY_EXAMPLES_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/policy-examples"));
    let missing: Vec<&str> = ["snapshot-before-destroy-py.wasm", "cpu-class-admission-js.wasm"]
        .into_iter()
        .filter(|f| !dir.join(f).exists())
        .collect();
    if missing.is_empty() {
        Ok(dir)
    } else {
        Err(format!(
            "{} not in {} (build them with policies/examples/build.sh, or set VK_POLICY_EXAMPLES_DIR)",
            missing.join(", "),
            dir.display()
        ))
    }
}

/// One row of the languages table: `bytes` (a component of slot `S`) compiled into a fresh
/// cache, then decided on the bench's facts — it must decide as the Rust default does — with a
/// fresh instance per decision, and instantiated alone.
fn lang_row<S: PolicySlot>(engine: &PolicyEngine, language: &str, bytes: &[u8], expected: &serde_json::Value) {
    let cache_dir = tempfile::tempdir().expect("temp dir");
    let cache = CompileCache::new(cache_dir.path());
    let origin = vk_cocoon::policy::Origin::File(format!("{}-{language}.wasm", S::NAME).into());
    let started = Instant::now();
    let policy = LoadedPolicy::<S>::load(engine, Some(&cache), origin.clone(), bytes).expect("the component loads");
    let compile = started.elapsed();
    let started = Instant::now();
    black_box(LoadedPolicy::<S>::load(engine, Some(&cache), origin, bytes).expect("loads from the cache"));
    let from_cache = started.elapsed();
    let facts = facts_for::<S>(&input(S::SLOT)).expect("the row's facts");
    let decision = policy.decide(engine, &facts).expect("the component decides");
    assert_eq!(
        &serde_json::to_value(&decision).unwrap(),
        expected,
        "{} in {language}: decides as the Rust default does",
        S::SLOT
    );
    let missed = std::cell::Cell::new(0usize);
    let decide_once = || {
        if policy.decide(engine, black_box(&facts)).is_err() {
            missed.set(missed.get() + 1);
        }
    };
    let instantiate_once = || {
        if policy.instantiate_only(engine).is_err() {
            missed.set(missed.get() + 1);
        }
    };
    for _ in 0..LANG_WARMUP {
        decide_once();
        instantiate_once();
    }
    let decisions = measure(decide_once, LANG_SAMPLES);
    let instances = measure(instantiate_once, LANG_SAMPLES);
    println!(
        "{:<26} {:<11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>9}",
        S::NAME,
        language,
        us(decisions.p50),
        us(decisions.p99),
        us(instances.p50),
        us(instances.p99),
        ms(compile),
        ms(from_cache),
        dir_bytes(cache_dir.path()) >> 10,
    );
    if missed.get() > 0 {
        println!("  ({} decisions or instantiations failed on this run)", missed.get());
    }
}

/// The languages table: each example beside the Rust default of its slot.
fn languages(engine: &PolicyEngine) {
    println!();
    println!("languages: {LANG_SAMPLES} samples per row after {LANG_WARMUP} warm-up; a fresh instance per decision");
    println!(
        "{:<26} {:<11} {:>10} {:>10} {:>10} {:>10} {:>10} {:>11} {:>9}",
        "slot", "language", "p50 us", "p99 us", "inst p50", "inst p99", "compile ms", "cached ms", "cache KiB"
    );
    let dir = match examples_dir() {
        Ok(dir) => Some(dir),
        Err(why) => {
            println!("Python and JavaScript rows skipped: {why}");
            None
        }
    };
    fn expected<S: PolicySlot>(engine: &PolicyEngine) -> serde_json::Value {
        let builtin = LoadedPolicy::<S>::builtin(engine, None).expect("default policy loads");
        let facts = facts_for::<S>(&input(S::SLOT)).expect("the row's facts");
        serde_json::to_value(builtin.decide(engine, &facts).expect("the default decides")).unwrap()
    }
    let snapshot = expected::<SnapshotBeforeDestroy>(engine);
    lang_row::<SnapshotBeforeDestroy>(engine, "Rust", SnapshotBeforeDestroy::default_component(), &snapshot);
    if let Some(dir) = &dir {
        let bytes = std::fs::read(dir.join("snapshot-before-destroy-py.wasm")).expect("read the Python example");
        lang_row::<SnapshotBeforeDestroy>(engine, "Python", &bytes, &snapshot);
    }
    let admission = expected::<CpuClassAdmission>(engine);
    lang_row::<CpuClassAdmission>(engine, "Rust", CpuClassAdmission::default_component(), &admission);
    if let Some(dir) = &dir {
        let bytes = std::fs::read(dir.join("cpu-class-admission-js.wasm")).expect("read the JavaScript example");
        lang_row::<CpuClassAdmission>(engine, "JavaScript", &bytes, &admission);
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a bare word names the one section to run.
    let only: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    match only.as_deref() {
        None => {}
        Some("decision-log") => return decision_log_cost(),
        Some(other) => panic!("no section {other:?}; the one that runs alone is decision-log"),
    }
    let engine = PolicyEngine::new(SandboxLimits::default()).expect("engine");
    println!("policy decision latency, {SAMPLES} samples per row after {WARMUP} warm-up decisions");
    println!(
        "{:<26} {:>12} {:>12} {:>13} {:>13} {:>10} {:>10}",
        "slot", "wasm p50 us", "wasm p99 us", "native p50 us", "native p99 us", "p50 ratio", "p99 ratio"
    );
    row::<SnapshotBeforeDestroy, _, _>(&engine, snapshot_before_destroy_policy::decide);
    row::<BringUp, _, _>(&engine, bring_up_policy::decide);
    row::<CpuClassAdmission, _, _>(&engine, cpu_class_admission_policy::decide);
    row::<ResourceTranslation, _, _>(&engine, resource_translation_policy::decide);
    row::<GuestFixup, _, _>(&engine, guest_fixup_policy::decide);
    languages(&engine);
    idle_wakeups(&engine);
    decision_log_cost();
    loaded_machine();

    let cache_dir = tempfile::tempdir().expect("temp dir");
    let cache = CompileCache::new(cache_dir.path());
    let load_with = |worker: Option<&str>, cache: Option<CompileCache>| {
        let mut engine = PolicyEngine::new(SandboxLimits::default()).expect("engine");
        if let Some(exe) = worker {
            engine = engine.compile_in_worker(exe.into(), vk_cocoon::policy::compile_worker::CompileLimits::default());
        }
        black_box(Policies::with_defaults(engine, cache, PolicyMetrics::unregistered()).expect("defaults load"));
    };
    let load_all = |cache: Option<CompileCache>| load_with(None, cache);
    load_all(Some(cache.clone())); // fill the cache
    let cold = measure(|| load_all(None), 3);
    // The daemon's first start: each component compiled by a `vk-cocoon policy compile-worker`.
    let in_workers = measure(|| load_with(Some(env!("CARGO_BIN_EXE_vk-cocoon")), None), 3);
    let warm = measure(|| load_all(Some(cache.clone())), STARTUP_RUNS);
    println!();
    println!(
        "start-up: engine + all {} slots loaded and validated (median of runs)",
        Slot::ALL.len()
    );
    println!("{:<34} {:>10}", "path", "ms");
    println!("{:<34} {:>10}", "compiled from scratch (baseline)", ms(cold.p50));
    println!("{:<34} {:>10}", "compiled in worker processes", ms(in_workers.p50));
    println!("{:<34} {:>10}", "from the compile cache", ms(warm.p50));
    println!(
        "{:<34} {:>9.1}x",
        "cache speed-up",
        cold.p50.as_secs_f64() / warm.p50.as_secs_f64()
    );
}
