//! Peer restore vs registry restore (issue 18): waking a pod whose hibernated guest holds 1 GiB of
//! memory and a sparse disk, once through the registry tier (docker-registry on loopback, the
//! daemon's pull into `cocoon snapshot import`) and once through the peer tier (node A's
//! `PeerServer` on loopback over mutual TLS, staged sparse, every file checked against the
//! registry's digests, `vm clone --from-dir`), in the same run, on the same
//! daemon. Target: the peer wake ≥ 2× faster. The figures are create → Ready of the pod (what a
//! user waits for) and the transfer part alone (the pull's and the peer restore's histograms),
//! the median of `BENCH_ROUNDS` (default 3) interleaved rounds (the shared machine is noisy).
//!
//! Both tiers share this machine's cores with their sender (docker-registry, or node A in this
//! process), so each round also reports the CPU time each side spent: the waking node (the
//! daemon's threads and the cocoon processes it ran) and the sender (node A's threads, or the
//! registry process). On two cores, where both tiers are CPU-bound, the wall-clock ratio can
//! be no better than the ratio of those sums.
//!
//! `cargo bench --bench peer_restore --profile dev` (dependencies optimised, this crate and
//! cocoon-sim not; a release build works the same way). Needs Debian's docker-registry.
//! `BENCH_MEMORY_MIB` (default 1024) sets the guest memory; the disk is 8 GiB apparent, 64 MiB
//! of data.
//!
//! Each round also measures the floor on the peer round's snapshot (`peer_floor.rs`): the CPU
//! no peer tier under its trust rules can avoid (AES-GCM on both ends, SHA-256 of every byte,
//! the loopback socket). From it the bench prints the least a peer wake could take on this
//! machine, and so the most any peer tier could gain over this run's registry tier.

mod peer_floor;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use cocoon_sim::Sim;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;
use vk_cocoon::peer::server::MAX_STREAMS;
use vk_cocoon::peer::{KubeNodes, PeerClient, PeerMetrics, PeerServer, PeerTier, PeerToken, Staging, Timeouts};
use vk_cocoon::provider::ports::SnapshotRegistry;
use vk_cocoon::runtime::{CocoonCli, CocoonRuntime};
use vk_test_support::bench::{self, cpu_time};
use vk_test_support::provider_support::fleet_ca::FleetCa;
use vk_test_support::provider_support::*;
use vk_test_support::runtime_support;

const IMAGE: &str = "cocoonset.cocoonstack.io/image";
const RESTORE: &str = "vm.cocoonstack.io/restore-from-hibernate";
const TOKEN: &str = "peer-token-for-the-benchmark-0123456789";
const NODE_A: &str = "node-a";

/// CPU seconds spent so far, split by side: the waking node (the test daemon's threads, named
/// `daemon`, and the child processes this process has reaped: the cocoon calls) and the sender
/// (every other thread of this process: node A's peer server; and the docker-registry process).
/// Per thread, so a thread that ends between two samples takes its time with it; the blocking
/// pools keep idle threads for seconds, longer than a wake's tail.
#[derive(Debug, Clone, Default)]
struct CpuSample {
    threads: HashMap<u32, (bool, f64)>,
    children: f64,
    registry: f64,
}

/// `(waking, sending)` CPU seconds between `before` and `after`.
fn cpu_between(before: &CpuSample, after: &CpuSample) -> (f64, f64) {
    let (mut waking, mut sending) = (after.children - before.children, after.registry - before.registry);
    for (tid, &(daemon, secs)) in &after.threads {
        let spent = secs - before.threads.get(tid).map_or(0.0, |&(_, s)| s);
        if daemon {
            waking += spent;
        } else {
            sending += spent;
        }
    }
    (waking, sending)
}

/// A `/proc/.../stat` line cut into the name (`comm`, which may hold spaces) and the fields
/// after it (the line's third field first).
fn stat_fields(stat: &str) -> Option<(&str, Vec<&str>)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    Some((
        &stat[open + 1..close],
        stat.get(close + 2..)?.split_whitespace().collect(),
    ))
}

/// `(comm, user + system seconds)` of a `/proc/.../stat` line.
#[allow(unsafe_code)]
fn stat_cpu(stat: &str) -> Option<(String, f64)> {
    let (comm, fields) = stat_fields(stat)?;
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf only reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((comm.to_string(), ticks / hz))
}

/// The CPU time of both sides now (see [`CpuSample`]).
fn cpu_sample(registry_pid: Option<u32>) -> CpuSample {
    let mut threads = HashMap::new();
    for entry in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(tid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Some((comm, secs)) = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .as_deref()
            .and_then(stat_cpu)
        {
            threads.insert(tid, (comm == "daemon", secs));
        }
    }
    let registry = registry_pid
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .as_deref()
        .and_then(stat_cpu)
        .map_or(0.0, |(_, s)| s);
    CpuSample {
        threads,
        children: cpu_time(libc::RUSAGE_CHILDREN).as_secs_f64(),
        registry,
    }
}

/// The docker-registry process this bench started (a child of this process).
fn registry_pid() -> Option<u32> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        let (comm, fields) = stat_fields(&stat)?;
        // The parent's pid is the line's fourth field, the second after the name.
        (comm == "docker-registry" && fields.get(1) == Some(&me.as_str())).then_some(pid)
    })
}

/// Wakes `vm` through a new pod; returns create → Ready. The pod is deleted again (no snapshot
/// on delete).
async fn wake(env: &Env, pod: &str, vm: &str) -> f64 {
    let started = Instant::now();
    let never = ("cocoonset.cocoonstack.io/snapshot-policy", "never");
    create(env, &managed(pod, vm, &[(IMAGE, "base"), (RESTORE, "true"), never])).await;
    eventually(600, &format!("{pod} woken"), || {
        lifecycle(env, pod).as_deref() == Some("ready") && ready(env, pod)
    })
    .await;
    let took = started.elapsed().as_secs_f64();
    delete(env, pod).await;
    eventually(120, &format!("{pod} gone"), || get(env, pod).is_none()).await;
    took
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The floor's medians, and what they allow: a peer wake can take no less than its own time
/// outside the transfer (`outside`) plus the floor's bound on this machine's cores.
fn print_floor(floors: &[peer_floor::Floor], outside: f64, registry_wake: f64) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let secs = |of: &dyn Fn(&peer_floor::Floor) -> std::time::Duration| {
        bench::median(floors.iter().map(of).collect()).as_secs_f64()
    };
    let bound = secs(&|f| f.bound(cores));
    println!(
        "floor: the CPU no peer tier under these trust rules can avoid, on the snapshot's {} MiB of data",
        floors[0].bytes >> 20
    );
    println!(
        "| AES-256-GCM seal (sender) | open (receiver) | SHA-256 (receiver) | loopback socket (both ends) | all | longest single hash | least time on {cores} cores |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s |",
        secs(&|f| f.seal),
        secs(&|f| f.open),
        secs(&|f| f.hash),
        secs(&|f| f.socket),
        secs(&|f| f.cpu()),
        secs(&|f| f.longest_hash),
        bound
    );
    let least = outside + bound;
    println!(
        "a peer wake cannot take less than {outside:.2} s outside the transfer + the least time = {least:.2} s: at most {:.2}× over this run's registry wake",
        registry_wake / least
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bench());
}

async fn bench() {
    let mib: u64 = std::env::var("BENCH_MEMORY_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;

    // Node A hibernates two guests of the same size per round, one woken through each tier:
    // vm-reg-* name a from-node without a Node object, so their wakes skip the peer tier (as for
    // a node gone). A hibernated guest is woken once: node B remembers the snapshot it woke
    // under a name, and a second wake of the same tag would find no hibernated state.
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::new(dir.path().join("sim")).unwrap();
    sim.set_settings(|s| {
        s.snapshot_memory_bytes = mib << 20;
        s.snapshot_cow_bytes = 8 << 30;
        s.snapshot_cow_data_bytes = 64 << 20;
    })
    .unwrap();
    let a = Arc::new(CocoonCli::new(runtime_support::config(&sim)));
    seed_snapshot_on(&a, "base", "ghcr.io/x/base:1").await;
    let registry = env.oci.as_ref().unwrap();
    let pusher = registry.server.lock().unwrap().transfer_client("", NODE_A);
    let gone = registry.server.lock().unwrap().transfer_client("", "node-gone");
    let mut data_bytes = 0;
    let guests: Vec<(String, _)> = (0..rounds)
        .flat_map(|round| {
            [
                (format!("vm-reg-{round}"), &gone),
                (format!("vm-peer-{round}"), &pusher),
            ]
        })
        .collect();
    for (vm, pusher) in guests {
        let vm = vm.as_str();
        let v = clone_direct_on(&a, "base", vm, None).await;
        a.snapshot_save(vm, &v.id).await.unwrap();
        a.remove(&v.id).await.unwrap();
        let t = Instant::now();
        let report = pusher
            .push_snapshot(a.as_ref(), vm, vm, "hibernate", "base")
            .await
            .unwrap();
        data_bytes = report.total_size;
        eprintln!(
            "hibernated {vm} on node A: pushed {} MiB in {:.1?}",
            report.total_size >> 20,
            t.elapsed()
        );
    }
    let store = sim
        .snapshot_dir("vm-peer-0")
        .unwrap()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let server = PeerServer::new(
        NODE_A.into(),
        a.clone() as Arc<dyn CocoonRuntime>,
        pusher.registry.clone() as Arc<dyn SnapshotRegistry>,
        store,
        PeerToken::new(TOKEN).unwrap(),
        MAX_STREAMS,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let stop = CancellationToken::new();
    let limits = vk_cocoon::listener::Limits::with_cap(256);
    // Mutual TLS as the daemon speaks it: node certificates of one fleet CA.
    let fleet = FleetCa::new("fleet CA");
    let peer_listener = PeerServer::listener(&fleet.node_tls(NODE_A), limits);
    tokio::spawn(server.serve(listener, peer_listener, stop.clone()));
    let nodes: kube::Api<Node> = kube::Api::all(env.server.client());
    let mut node = Node::default();
    node.metadata.name = Some(NODE_A.into());
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let status = serde_json::json!({"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}});
    nodes
        .patch_status(NODE_A, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();

    // Node B with its peer tier; the rounds alternate the tiers.
    let b = start(&env, Options::default());
    let metrics = PeerMetrics::unregistered();
    let tier = Arc::new(PeerTier {
        client: PeerClient::new(
            PeerToken::new(TOKEN).unwrap(),
            &fleet.node_tls(NODE),
            Staging::new(env.sim_dir.path().join("vk-staging")),
            Timeouts::default(),
        ),
        nodes: Arc::new(KubeNodes::new(env.server.client())),
        port,
        metrics: metrics.clone(),
    });
    b.provider.set_peer_tier(tier.clone());
    let last_clone = |env: &Env| calls(env, "vm clone").pop().unwrap();
    let (mut registry_wakes, mut peer_wakes, mut pulls, mut restores) = (vec![], vec![], vec![], vec![]);
    let registry_pid = registry_pid();
    assert!(
        registry_pid.is_some(),
        "the docker-registry process of this bench was not found"
    );
    let (mut registry_cpu, mut peer_cpu, mut floors) = (vec![], vec![], vec![]);
    for round in 0..rounds {
        let pulled = b.provider.metrics().snapshot_pull_duration.get_sample_sum();
        let (reg_vm, peer_vm) = (format!("vm-reg-{round}"), format!("vm-peer-{round}"));
        let before = cpu_sample(registry_pid);
        registry_wakes.push(wake(&env, &format!("agent-reg-{round}"), &reg_vm).await);
        registry_cpu.push(cpu_between(&before, &cpu_sample(registry_pid)));
        pulls.push(b.provider.metrics().snapshot_pull_duration.get_sample_sum() - pulled);
        assert_eq!(
            last_clone(&env).last().map(String::as_str),
            Some(format!("{reg_vm}-hibernate-import").as_str()),
            "the registry round pulled"
        );
        let restored = metrics.restore_duration.get_sample_sum();
        let before = cpu_sample(registry_pid);
        peer_wakes.push(wake(&env, &format!("agent-peer-{round}"), &peer_vm).await);
        peer_cpu.push(cpu_between(&before, &cpu_sample(registry_pid)));
        restores.push(metrics.restore_duration.get_sample_sum() - restored);
        assert_eq!(
            metrics.count("ok"),
            round as u64 + 1,
            "the peer round used the peer tier"
        );
        assert!(
            last_clone(&env).iter().any(|a| a == "--from-dir"),
            "cloned from the staged directory"
        );
        let snapshot = sim.snapshot_dir(&peer_vm).unwrap().unwrap();
        let floor = tokio::task::spawn_blocking(move || peer_floor::measure(&snapshot))
            .await
            .unwrap();
        eprintln!(
            "round {round}: floor of {} MiB: seal {:.2?}, open {:.2?}, SHA-256 {:.2?} (longest {:.2?}), socket {:.2?}",
            floor.bytes >> 20,
            floor.seal,
            floor.open,
            floor.hash,
            floor.longest_hash,
            floor.socket
        );
        floors.push(floor);
        eprintln!(
            "round {round}: registry wake {:.2} s (pull {:.2} s; CPU {:.2} s waking, {:.2} s sending), peer wake {:.2} s (restore {:.2} s; CPU {:.2} s waking, {:.2} s sending)",
            registry_wakes[round],
            pulls[round],
            registry_cpu[round].0,
            registry_cpu[round].1,
            peer_wakes[round],
            restores[round],
            peer_cpu[round].0,
            peer_cpu[round].1
        );
    }
    let (registry_wake, pull) = (median(registry_wakes), median(pulls));
    let (peer_wake, peer) = (median(peer_wakes), median(restores));
    let sides = |cpu: &[(f64, f64)]| {
        (
            median(cpu.iter().map(|c| c.0).collect()),
            median(cpu.iter().map(|c| c.1).collect()),
        )
    };
    let ((registry_waking, registry_sending), (peer_waking, peer_sending)) = (sides(&registry_cpu), sides(&peer_cpu));

    let rate = |secs: f64| (data_bytes as f64 / (1 << 20) as f64) / secs;
    println!();
    println!(
        "peer restore vs registry restore: {mib} MiB memory + 8 GiB sparse disk (64 MiB data); {} MiB of file data per snapshot",
        data_bytes >> 20
    );
    println!("median of {rounds} interleaved rounds");
    println!("| tier | wake (create → Ready) | transfer | transfer MiB/s | CPU, waking node | CPU, sender |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| registry (pull + import) | {:.2} s | {:.2} s | {:.0} | {registry_waking:.2} s | {registry_sending:.2} s |",
        registry_wake,
        pull,
        rate(pull)
    );
    println!(
        "| peer (plan + slices, staged) | {:.2} s | {:.2} s | {:.0} | {peer_waking:.2} s | {peer_sending:.2} s |",
        peer_wake,
        peer,
        rate(peer)
    );
    let ratio = registry_wake / peer_wake;
    println!(
        "wake speed-up: {ratio:.2}× (target ≥ 2×: {}); transfer speed-up {:.2}×",
        if ratio >= 2.0 { "met" } else { "NOT met" },
        pull / peer
    );
    println!(
        "CPU of both sides: registry {:.2} s, peer {:.2} s ({:.2}×); of the waking node alone {:.2}×",
        registry_waking + registry_sending,
        peer_waking + peer_sending,
        (registry_waking + registry_sending) / (peer_waking + peer_sending),
        registry_waking / peer_waking
    );
    println!(
        "memory holding received bytes for the registry check (whole chunk buffers): at most {:.0} MiB at once (the node's budget {} MiB)",
        tier.client.hold_budget().peak() as f64 / (1 << 20) as f64,
        vk_cocoon::peer::arrivals::HOLD_LIMIT >> 20
    );
    print_floor(&floors, peer_wake - peer, registry_wake);
    stop.cancel();
    let _ = sim.kill_everything();
    drop(b);
}
