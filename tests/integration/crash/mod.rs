//! A crash anywhere loses nothing: every operation is run once clean with its cocoon calls
//! recorded, then once per crash point in a fresh world — the daemon killed right after its
//! N-th call, and once inside it (the call did its work but never answered) — restarted on the
//! same simulator, state directory and apiserver, left to converge, and checked against the
//! invariants by replaying what happened (`README.md` beside this file).

mod create;
mod delete;
mod hibernate;
mod wake;

use crate::provider_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cocoon_sim::util::monotonic_ns;
use provider_support::*;
use vk_cocoon::provider::Timings;

pub const IMAGE: &str = "cocoonset.cocoonstack.io/image";
pub const NETWORK: &str = "cocoonset.cocoonstack.io/network";
pub const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";
pub const ID: &str = "vm.cocoonstack.io/id";
pub const IP: &str = "vm.cocoonstack.io/ip";
/// The guests are DHCP guests (the simulator gives `*dhcp*` networks no static address), so
/// their leases are released through cocoon-net and the lease invariant has something to check.
pub const DHCP: &str = "dhcp-net";
pub const POD: &str = "agent-0";

/// How long a run may take to converge before it is reported as a failure (not a wait: a
/// converged run is checked as soon as it is).
const CONVERGE_LIMIT: Duration = Duration::from_secs(60);
/// How long a daemon may sit with nothing to do for the pod before its end state holds.
const IDLE_LIMIT: Duration = Duration::from_secs(10);
/// How many crash runs of one operation go at once.
const PARALLEL: usize = 3;

/// What the operation leaves when it is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The pod is ready on a running VM.
    Ready,
    /// The guest is in the registry's `:hibernate` tag and no VM runs.
    Hibernated,
    /// The pod is gone and so is its VM.
    Gone,
}

/// One operation the harness crashes.
#[async_trait]
pub trait Operation: Send + Sync {
    fn name(&self) -> &'static str;
    /// The pod's VM name.
    fn vm(&self) -> &'static str;
    fn end(&self) -> End;
    /// The pod's guest state exists only as a snapshot at some point of the operation (a
    /// hibernate, a wake): it must never be lost and never be replaced by a fresh boot.
    fn guards_hibernated_state(&self) -> bool {
        false
    }
    /// The tag the policy asks for before the VM may be destroyed (`latest` for a delete that
    /// snapshots, `hibernate` for a hibernate).
    fn push_before_remove(&self) -> Option<&'static str> {
        None
    }
    /// An argv element the clean run's call that makes the pod's VM carries: the operation
    /// took the path it is named for (the crash runs may take another one to recover).
    fn path_marker(&self) -> Option<&'static str> {
        None
    }
    /// Snapshots the operation keeps on purpose besides `base` and the pod's own (a pulled
    /// image's local copy, a fork baseline): not reported as leftovers.
    fn kept_snapshots(&self) -> &'static [&'static str] {
        &[]
    }
    /// A fresh world for one run.
    async fn world(&self) -> World {
        World::new().await
    }
    /// Builds the world up to the moment before the operation; returns the running daemon.
    async fn setup(&self, w: &World) -> Daemon;
    /// Asks for the operation.
    async fn trigger(&self, w: &World);
}

/// Lease releases with the time they were asked for, on the simulator's clock.
#[derive(Default)]
pub struct TimedReleaser {
    pub released: Mutex<Vec<(u64, String)>>,
}

#[async_trait]
impl vk_cocoon::provider::ports::LeaseReleaser for TimedReleaser {
    async fn release(&self, mac: &str) -> Result<(), vk_cocoon::provider::ports::ReleaseError> {
        self.released
            .lock()
            .unwrap()
            .push((monotonic_ns(), mac.to_ascii_lowercase()));
        Ok(())
    }
}

/// One fresh world: apiserver, simulator, in-memory registry, the lease file kept by a
/// cocoon-net stand-in, and the releaser every daemon of the world shares.
pub struct World {
    pub env: Env,
    pub releaser: Arc<TimedReleaser>,
    leases: tokio::task::JoinHandle<()>,
    /// The port of the peer tier every daemon of this world dials, when it has one.
    pub peer_port: Mutex<Option<u16>>,
    /// What the world keeps alive beside the daemon (another node).
    pub keep: Mutex<Vec<Box<dyn std::any::Any + Send>>>,
    /// Tags of the real registry (a world with one) present when the operation was asked for:
    /// it keeps no journal, and a wake never deletes a tag.
    tags_at_arm: Mutex<BTreeSet<(String, String)>>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.leases.abort();
        let _ = self.env.sim.kill_everything();
    }
}

impl World {
    pub async fn new() -> Self {
        Self::on(env(true).await).await
    }

    /// A world whose registry is a real one (`docker-registry` on loopback).
    pub async fn with_oci() -> Self {
        Self::on(env_with_oci().await).await
    }

    async fn on(env: Env) -> Self {
        // cocoon-net's part: every DHCP guest the simulator holds gets a lease for its MAC (read
        // from the journal, so the stand-in makes no cocoon call the crash staging would count).
        let sim = env.sim.clone();
        let path = env.leases.clone();
        let subnet = sim.subnet().to_string();
        let leases = tokio::spawn(async move {
            let mut ips: BTreeMap<String, String> = BTreeMap::new();
            let mut written = String::new();
            loop {
                let mut live: BTreeMap<String, String> = BTreeMap::new();
                for l in sim.journal().unwrap_or_default() {
                    if l.kind == "vm" && !l.mac.is_empty() {
                        if l.op == "add" {
                            live.insert(l.id, l.mac.to_ascii_lowercase());
                        } else {
                            live.remove(&l.id);
                        }
                    }
                }
                let rows: Vec<String> = live
                    .values()
                    .map(|mac| {
                        let n = ips.len();
                        let ip = ips
                            .entry(mac.clone())
                            .or_insert_with(|| format!("{subnet}.200.{}", n + 2))
                            .clone();
                        format!(r#"{{"mac":"{mac}","ip":"{ip}","expiry":"2999-01-01T00:00:00Z"}}"#)
                    })
                    .collect();
                let text = format!("[{}]", rows.join(","));
                if text != written {
                    let tmp = path.with_extension("tmp");
                    if std::fs::write(&tmp, &text).is_ok() && std::fs::rename(&tmp, &path).is_ok() {
                        written = text;
                    }
                }
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        });
        seed_base(&env).await;
        World {
            env,
            releaser: Arc::default(),
            leases,
            peer_port: Mutex::new(None),
            keep: Mutex::new(Vec::new()),
            tags_at_arm: Mutex::new(BTreeSet::new()),
        }
    }

    /// Notes the real registry's `<vm>:hibernate` (a world without the in-memory one).
    async fn arm(&self, vm: &str) -> u64 {
        if let Some(oci) = &self.env.oci {
            let found = matches!(
                oci.client.manifest(vm, "hibernate").await,
                Ok(vk_cocoon::registry::ManifestLookup::Found(_))
            );
            if found {
                self.tags_at_arm
                    .lock()
                    .unwrap()
                    .insert((vm.to_string(), "hibernate".to_string()));
            }
        }
        monotonic_ns()
    }

    /// A daemon on this world, once it has registered its node and its background `snapshot
    /// list` landed (its startup, with the calls it makes, is over: they are not the
    /// operation's, and what a create asks depends on whether the list landed).
    pub async fn start(&self) -> Daemon {
        let d = start(
            &self.env,
            Options {
                releaser: Some(self.releaser.clone()),
                // Limits, not waits: the emulated lease and the fixup land in milliseconds, and
                // the harness tests no expiry. Under a loaded machine the tests' 3 s limits
                // were reached in clean runs.
                timings: Timings {
                    ip_wait: Duration::from_secs(30),
                    fixup_budget: Duration::from_secs(30),
                    ..fast_timings()
                },
                ..Default::default()
            },
        );
        if let Some(port) = *self.peer_port.lock().unwrap() {
            d.provider.set_peer_tier(peer_tier(&self.env, port));
        }
        eventually(60, "node registered", || {
            self.env
                .server
                .store()
                .get_as::<k8s_openapi::api::core::v1::Node>(None, NODE)
                .is_some()
        })
        .await;
        eventually(60, "the startup snapshot list landed", || {
            d.provider.snapshot_list_landed()
        })
        .await;
        d
    }

    pub fn registry(&self) -> &FakeRegistry {
        self.env.registry.as_deref().unwrap()
    }
}

/// The peer tier of a daemon of `env` dialing `port` on the peer node's InternalIP.
fn peer_tier(env: &Env, port: u16) -> Arc<vk_cocoon::peer::PeerTier> {
    use crate::provider::hibernate::peer_tier::{FLEET, TOKEN};
    use vk_cocoon::peer::{KubeNodes, PeerClient, PeerMetrics, PeerTier, PeerToken, Staging, Timeouts};
    Arc::new(PeerTier {
        client: PeerClient::new(
            PeerToken::new(TOKEN).unwrap(),
            &FLEET.node_tls(NODE),
            Staging::new(env.sim_dir.path().join("vk-staging")),
            Timeouts::default(),
        ),
        nodes: Arc::new(KubeNodes::new(env.server.client())),
        port,
        metrics: PeerMetrics::unregistered(),
    })
}

/// The local snapshot `base`, taken from a DHCP guest (its clones are DHCP guests too).
async fn seed_base(env: &Env) {
    let image = "ghcr.io/x/base:1";
    env.runtime.image_pull(image, false).await.unwrap();
    let vm = env
        .runtime
        .run(&vk_cocoon::runtime::RunSpec {
            name: Some("seed-base".into()),
            image: image.into(),
            network: Some(DHCP.into()),
            ..Default::default()
        })
        .await
        .unwrap();
    env.runtime.snapshot_save("base", &vm.id).await.unwrap();
    env.runtime.remove(&vm.id).await.unwrap();
}

/// A managed DHCP pod of VM `vm` from the local snapshot `base`.
pub fn pod(vm: &str, extra: &[(&str, &str)]) -> k8s_openapi::api::core::v1::Pod {
    let mut a = vec![(IMAGE, "base"), (NETWORK, DHCP)];
    a.extend_from_slice(extra);
    managed(POD, vm, &a)
}

pub async fn wait_ready(env: &Env) {
    eventually(60, "ready", || {
        lifecycle(env, POD).as_deref() == Some("ready") && ready(env, POD)
    })
    .await;
}

pub async fn wait_hibernated(env: &Env) {
    eventually(60, "hibernated", || {
        lifecycle(env, POD).as_deref() == Some("hibernated")
    })
    .await;
}

/// Where a crash run stops the daemon.
#[derive(Debug, Clone, Copy)]
struct Point {
    /// Counted calls that finished before the crash.
    after: u64,
    /// The crash comes inside the `after`-th call: it did its work but never answered.
    inside: bool,
}

impl std::fmt::Display for Point {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.inside {
            write!(f, "inside call {}", self.after)
        } else {
            write!(f, "after call {}", self.after)
        }
    }
}

/// One operation explored: its calls, the crash points run, what failed.
struct Explored {
    calls: Vec<String>,
    points: usize,
    failures: Vec<String>,
    /// What runs left behind (reported, not failed): how many runs, and the first one's point.
    leftovers: BTreeMap<String, (usize, String)>,
}

impl Explored {
    fn leftover(&mut self, p: &str, what: String) {
        let e = self.leftovers.entry(what).or_insert((0, p.to_string()));
        e.0 += 1;
    }
}

/// Runs `op` clean, then crashed at every point of its recorded calls; panics with every
/// violation found.
pub async fn explore(op: Arc<dyn Operation>) {
    let started = Instant::now();
    let (calls, clean_leftovers) = match clean_run(op.as_ref()).await {
        Ok(r) => r,
        Err(e) => panic!("{}: the clean run failed: {e}", op.name()),
    };
    let mut points: Vec<Point> = vec![Point {
        after: 0,
        inside: false,
    }];
    for n in 1..=calls.len() as u64 {
        points.push(Point { after: n, inside: true });
        points.push(Point {
            after: n,
            inside: false,
        });
    }
    let mut explored = Explored {
        calls: calls.clone(),
        points: points.len(),
        failures: Vec::new(),
        leftovers: BTreeMap::new(),
    };
    for l in clean_leftovers {
        explored.leftover("the clean run", l);
    }
    let calls = Arc::new(calls);
    // A few runs at a time, a new one as soon as one finishes.
    let mut pending = points.into_iter();
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < PARALLEL {
            let Some(p) = pending.next() else { break };
            let op = op.clone();
            let calls = calls.clone();
            running.spawn(async move { (p, crash_run(op.as_ref(), &calls, p).await) });
        }
        let Some(r) = running.join_next().await else { break };
        let (p, outcome) = r.expect("a crash run panicked");
        match outcome {
            Ok(leftovers) => {
                for l in leftovers {
                    explored.leftover(&p.to_string(), l);
                }
            }
            Err(e) => explored.failures.push(format!("crash {p}: {e}")),
        }
    }
    eprintln!(
        "crash {}: {} cocoon calls ({}), {} crash points, {} violations, {:.1} s",
        op.name(),
        explored.calls.len(),
        explored.calls.join(", "),
        explored.points,
        explored.failures.len(),
        started.elapsed().as_secs_f64()
    );
    for (what, (runs, first)) in &explored.leftovers {
        eprintln!("crash {}: leftover {what} in {runs} runs (first: {first})", op.name());
    }
    assert!(
        explored.failures.is_empty(),
        "{}: {} of {} crash points violate an invariant:\n{}",
        op.name(),
        explored.failures.len(),
        explored.points,
        explored.failures.join("\n")
    );
}

/// Runs the operation without a crash and records its counted calls (in the order they were
/// counted), checking the invariants on the way.
async fn clean_run(op: &dyn Operation) -> Result<(Vec<String>, Vec<String>), String> {
    let w = op.world().await;
    let d = op.setup(&w).await;
    let armed = w.arm(op.vm()).await;
    w.env.sim.stage_crash(u64::MAX, false).unwrap();
    op.trigger(&w).await;
    converge(op, &w, &d, armed).await?;
    // A restore from the registry removes its import snapshot in a background task once the
    // clone took it, and the end state may be published first. The recording waits for that
    // call to have returned: the simulator records a counted call once it is done, after the
    // removal itself, and its process is live until then. A crash run that reaches the call
    // would otherwise find one the clean run never made.
    let import = format!("{}-hibernate-import", op.vm());
    eventually(60, "the clean run's import snapshot removed", || {
        !live_snapshot(&w, &import) && w.env.sim.pids_of("snapshot rm").unwrap().is_empty()
    })
    .await;
    let mut log = w.env.sim.crash_log().unwrap();
    log.sort_by_key(|l| l.n);
    let calls = log.into_iter().map(|l| l.verb).collect();
    w.env.sim.clear_crash().unwrap();
    if let Some(marker) = op.path_marker() {
        let made = w
            .env
            .sim
            .journal()
            .unwrap()
            .into_iter()
            .filter(|l| l.at >= armed && l.kind == "vm" && l.op == "add" && l.name == op.vm())
            .map(|l| l.argv)
            .collect::<Vec<_>>();
        if !made.iter().any(|argv| argv.iter().any(|a| a == marker)) {
            return Err(format!("the VM was not made with `{marker}`: {made:?}"));
        }
    }
    d.provider.reclaim_snapshots().await;
    let leftovers = check(op, &w, armed).await?;
    d.kill().await;
    Ok((calls, leftovers))
}

/// One crash run: the operation in a fresh world, the daemon killed at `p`, a new daemon on the
/// same world, convergence, the invariants.
async fn crash_run(op: &dyn Operation, calls: &[String], p: Point) -> Result<Vec<String>, String> {
    let w = op.world().await;
    let d = op.setup(&w).await;
    let armed = w.arm(op.vm()).await;
    w.env.sim.stage_crash(p.after, p.inside).unwrap();
    op.trigger(&w).await;
    // The moment of the crash: the `after`-th call finished (or, inside, parked); for a crash
    // before any call, the first call parked.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = w.env.sim.crash_log().unwrap();
        let reached = log.iter().any(|l| match (p.after, p.inside) {
            (0, _) => l.n == 1 && l.event == "parked",
            (n, true) => l.n == n && l.event == "parked",
            (n, false) => l.n == n && l.event == "done",
        });
        if reached {
            break;
        }
        if Instant::now() > deadline {
            let seen: Vec<String> = log.iter().map(|l| format!("{} {} {}", l.n, l.verb, l.event)).collect();
            return Err(format!(
                "the crash point was never reached; the calls were {seen:?}, the clean run's {calls:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    d.kill().await;
    // Its cocoon children die with it (the in-process daemon's kill takes its tasks; the
    // processes they ran are killed here, as the kernel would with the process group).
    let _ = w.env.sim.kill_everything();
    let mut log = w.env.sim.crash_log().unwrap();
    log.sort_by_key(|l| l.n);
    for l in &log {
        let want = calls.get(l.n as usize - 1);
        if want != Some(&l.verb) {
            return Err(format!(
                "call {} was `{}`, the clean run's was {:?}: the recorded order differs",
                l.n, l.verb, want
            ));
        }
    }
    w.env.sim.clear_crash().unwrap();
    let d = w.start().await;
    converge(op, &w, &d, armed).await?;
    // One pass of the snapshot reclaimer (its timer is off in tests): what a crash left behind
    // that it is meant to remove (a `vk-*` VM's stale import) is not a leftover.
    d.provider.reclaim_snapshots().await;
    let leftovers = check(op, &w, armed).await?;
    d.kill().await;
    Ok(leftovers)
}

/// Waits until the pod's end state is true and the daemon has nothing left to do for it: no
/// guest work, owed retry, resume or delete, its operation lock free. A daemon idle that long
/// without reaching the end state never will: it is reported then rather than at the limit.
async fn converge(op: &dyn Operation, w: &World, d: &Daemon, armed: u64) -> Result<(), String> {
    let key = format!("default/{POD}");
    let deadline = Instant::now() + CONVERGE_LIMIT;
    let mut idle_since: Option<Instant> = None;
    loop {
        let end = end_reached(op, w).await;
        let table = d.provider.state();
        let idle = !table.guest_work_running(&key)
            && table.owed_retry(&key).is_none()
            && !table.resume_claimed(&key)
            && !table.is_deleting(&key)
            && table.try_lock_op(&key).is_some();
        if end.is_ok() && idle {
            return Ok(());
        }
        idle_since = if idle {
            idle_since.or(Some(Instant::now()))
        } else {
            None
        };
        let stuck = idle_since.is_some_and(|t| t.elapsed() > IDLE_LIMIT);
        if stuck || Instant::now() > deadline {
            // What the replay says is the likelier cause than the symptom.
            let replay = check(op, w, armed).await.err().unwrap_or_default();
            return Err(format!(
                "not converged ({}): end state: {end:?}, daemon idle: {idle}; lifecycle {:?} ({}){}",
                if stuck {
                    "idle without reaching it"
                } else {
                    "time limit"
                },
                lifecycle(&w.env, POD),
                lifecycle_message(&w.env, POD),
                if replay.is_empty() {
                    String::new()
                } else {
                    format!("; replay: {replay}")
                }
            ));
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// The live VMs named `vm` (read from the journal: no cocoon call).
fn live_vms(w: &World, vm: &str) -> Vec<(String, String)> {
    let mut live: BTreeMap<String, (String, String)> = BTreeMap::new();
    for l in w.env.sim.journal().unwrap() {
        if l.kind == "vm" {
            if l.op == "add" {
                live.insert(l.id, (l.name, l.mac));
            } else {
                live.remove(&l.id);
            }
        }
    }
    live.into_iter()
        .filter(|(_, (name, _))| name == vm)
        .map(|(id, (_, mac))| (id, mac))
        .collect()
}

/// Whether a snapshot named `name` is registered now (read from the journal: no cocoon call).
fn live_snapshot(w: &World, name: &str) -> bool {
    let mut live = BTreeSet::new();
    for l in w.env.sim.journal().unwrap() {
        if l.kind == "snapshot" && l.name == name {
            if l.op == "add" {
                live.insert(l.id);
            } else {
                live.remove(&l.id);
            }
        }
    }
    !live.is_empty()
}

/// Whether the pod's end state is true, and the pod tells the truth about it.
async fn end_reached(op: &dyn Operation, w: &World) -> Result<(), String> {
    let env = &w.env;
    let vms = live_vms(w, op.vm());
    match op.end() {
        End::Ready => {
            if lifecycle(env, POD).as_deref() != Some("ready") || !ready(env, POD) {
                return Err("not ready".into());
            }
            let [(id, _)] = vms.as_slice() else {
                return Err(format!("{} VMs named {}", vms.len(), op.vm()));
            };
            if annotation(env, POD, ID).as_deref() != Some(id.as_str()) {
                return Err(format!(
                    "the pod's id {:?} is not its VM's {id}",
                    annotation(env, POD, ID)
                ));
            }
            match env.sim.vm_state(id).unwrap().as_deref() {
                Some("running") => {}
                s => return Err(format!("its VM is {s:?}")),
            }
            let ip = annotation(env, POD, IP);
            if ip.is_none() || pod_ip(env, POD) != ip {
                return Err(format!(
                    "the pod's ip {ip:?} is not its status's {:?}",
                    pod_ip(env, POD)
                ));
            }
            Ok(())
        }
        End::Hibernated => {
            if lifecycle(env, POD).as_deref() != Some("hibernated") {
                return Err("not hibernated".into());
            }
            if !vms.is_empty() {
                return Err(format!("a VM named {} still lives", op.vm()));
            }
            if annotation(env, POD, ID).is_some() || annotation(env, POD, IP).is_some() {
                return Err(format!(
                    "the pod still names a VM: id {:?}, ip {:?}",
                    annotation(env, POD, ID),
                    annotation(env, POD, IP)
                ));
            }
            if !w.registry().has(op.vm(), "hibernate") {
                return Err("no :hibernate tag".into());
            }
            Ok(())
        }
        End::Gone => {
            if get(env, POD).is_some() {
                return Err("the pod is still there".into());
            }
            if !vms.is_empty() {
                return Err(format!("a VM named {} still lives", op.vm()));
            }
            Ok(())
        }
    }
}

/// What happened, in order: the simulator's journal, the registry's and the lease releases.
#[derive(Debug)]
enum Happened {
    Vm {
        add: bool,
        id: String,
        name: String,
        mac: String,
        argv: Vec<String>,
    },
    Snapshot {
        add: bool,
        name: String,
    },
    Push {
        repo: String,
        tag: String,
    },
    Untag {
        repo: String,
        tag: String,
    },
    Release {
        mac: String,
    },
}

/// Replays everything since `armed` and checks the invariants; returns the leftovers worth
/// reporting (not failures).
async fn check(op: &dyn Operation, w: &World, armed: u64) -> Result<Vec<String>, String> {
    let vm = op.vm();
    let mut timeline: Vec<(u64, Happened)> = Vec::new();
    for l in w.env.sim.journal().unwrap() {
        let h = if l.kind == "vm" {
            Happened::Vm {
                add: l.op == "add",
                id: l.id,
                name: l.name,
                mac: l.mac.to_ascii_lowercase(),
                argv: l.argv,
            }
        } else {
            Happened::Snapshot {
                add: l.op == "add",
                name: l.name,
            }
        };
        timeline.push((l.at, h));
    }
    // A world with a real registry has no registry journal: its tags at the start stand.
    if let Some(registry) = &w.env.registry {
        for (at, repo, tag, push) in registry.journal.lock().unwrap().iter() {
            let (repo, tag) = (repo.clone(), tag.clone());
            timeline.push((
                *at,
                if *push {
                    Happened::Push { repo, tag }
                } else {
                    Happened::Untag { repo, tag }
                },
            ));
        }
    }
    for (at, mac) in w.releaser.released.lock().unwrap().iter() {
        timeline.push((*at, Happened::Release { mac: mac.clone() }));
    }
    timeline.sort_by_key(|(at, _)| *at);

    let mut vms: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut snapshots: BTreeMap<String, usize> = BTreeMap::new();
    let mut tags: BTreeSet<(String, String)> = w.tags_at_arm.lock().unwrap().clone();
    let mut pushed_since_armed: BTreeSet<String> = BTreeSet::new();
    let import = plan_import_name(vm);
    for (at, h) in &timeline {
        let after_arm = *at >= armed;
        match h {
            Happened::Vm {
                add: true,
                id,
                name,
                mac,
                argv,
            } => {
                vms.insert(id.clone(), (name.clone(), mac.clone()));
                if after_arm && name == vm && op.guards_hibernated_state() && !from_hibernated(argv, vm, &import) {
                    return Err(format!("the hibernated guest was booted fresh: `{}`", argv.join(" ")));
                }
            }
            Happened::Vm {
                add: false,
                id,
                name,
                argv,
                ..
            } => {
                vms.remove(id);
                if let Some(tag) = op.push_before_remove()
                    && after_arm
                    && name == vm
                    && argv.iter().any(|a| a == "rm")
                    && !pushed_since_armed.contains(tag)
                {
                    return Err(format!(
                        "VM {id} was removed before its snapshot was pushed to {vm}:{tag}"
                    ));
                }
            }
            Happened::Snapshot { add, name } => {
                let n = snapshots.entry(name.clone()).or_default();
                if *add {
                    *n += 1;
                } else {
                    *n = n.saturating_sub(1);
                }
            }
            Happened::Push { repo, tag } => {
                tags.insert((repo.clone(), tag.clone()));
                if after_arm && repo == vm {
                    pushed_since_armed.insert(tag.clone());
                }
            }
            Happened::Untag { repo, tag } => {
                tags.remove(&(repo.clone(), tag.clone()));
            }
            Happened::Release { mac } => {
                if let Some((id, (name, _))) = vms.iter().find(|(_, (_, m))| m == mac) {
                    return Err(format!(
                        "the lease of {mac} was released while its VM {name} ({id}) lives"
                    ));
                }
            }
        }
        let named = vms.values().filter(|(name, _)| name == vm).count();
        if named > 1 {
            return Err(format!("{named} VMs named {vm} at once"));
        }
        if after_arm && op.guards_hibernated_state() {
            let somewhere = named == 1
                || snapshots.get(vm).is_some_and(|n| *n > 0)
                || snapshots.get(&import).is_some_and(|n| *n > 0)
                || tags.contains(&(vm.to_string(), "hibernate".to_string()));
            if !somewhere {
                return Err(format!(
                    "the hibernated guest was lost after {h:?}: in no VM, snapshot or tag"
                ));
            }
        }
    }
    end_reached(op, w)
        .await
        .map_err(|e| format!("after convergence: {e}"))?;
    let mut leftovers = Vec::new();
    for (name, n) in &snapshots {
        if *n > 0 && name != "base" && name != vm && !op.kept_snapshots().contains(&name.as_str()) {
            leftovers.push(format!("snapshot {name}"));
        }
    }
    // A VM no pod names.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(w.env.server.client(), "default");
    let named: BTreeSet<String> = pods
        .list(&Default::default())
        .await
        .map_err(|e| e.to_string())?
        .items
        .iter()
        .filter_map(|p| p.metadata.annotations.as_ref()?.get("vm.cocoonstack.io/name").cloned())
        .collect();
    for (name, _) in vms.values() {
        if !named.contains(name) {
            leftovers.push(format!("VM {name} no pod names"));
        }
    }
    Ok(leftovers)
}

fn plan_import_name(vm: &str) -> String {
    vk_cocoon::provider::plan::hibernate_import_name(vm)
}

/// A VM of the hibernated guest comes from its snapshot: a clone of the local copy, of the
/// registry's import, or of a peer's files staged in a directory.
fn from_hibernated(argv: &[String], vm: &str, import: &str) -> bool {
    let clone = argv.windows(2).any(|w| w[0] == "vm" && w[1] == "clone");
    clone && (argv.iter().any(|a| a == "--from-dir") || argv.last().is_some_and(|a| a == vm || a == import))
}
