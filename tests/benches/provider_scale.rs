//! Provider scale: the startup reconcile of 10,000 pods / 10,000 VMs against the fake apiserver
//! and cocoon-sim, as a ratio to its I/O floor (the VM list and the pod list read at once, as a
//! startup must), and CreatePod's own overhead (wall time minus the time spent inside the cocoon
//! CLI) on that node, plus this process's RSS.
//!
//! `cargo bench --bench provider_scale` (needs `cargo build --release -p cocoon-sim`).
//! `BENCH_PODS` (default 10000) and `BENCH_CREATES` (default 50) override the sizes.
//!
//! The simulator's VMs are seeded through its state file (`cocoon_sim::store::Store`, one
//! read-modify-write), copying one VM really cloned by the CLI, so no 10,000 CLI calls are needed.
//! Cocoon time is measured by a decorator around the real CLI client that sums the wall time of
//! every `CocoonRuntime` call.
//!
//! A second pass of `BENCH_PROFILE_CREATES` creates (default 50) prints CreatePod's per-stage
//! profile: each create waits until its pod's Ready is published before the next one starts, and
//! every stage (the provider's `create.*` spans, each cocoon call, each apiserver write) is
//! timed from the create's entry (`provider_scale_stages.rs`).
//!
//! The figures and their history: `BENCHMARKS.md` beside this file, *Provider*.

#[path = "provider_scale_stages.rs"]
mod stages;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::stream::BoxStream;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::io::AsyncRead;
use vk_cocoon::kubelet::Provider;
use vk_cocoon::kubelet::events::EventSink;
use vk_cocoon::provider::cocoon_net::LeaseFile;
use vk_cocoon::provider::metrics::ProviderMetrics;
use vk_cocoon::provider::ports::{KubePodPatcher, PodPatcher, SnapshotRegistry};
use vk_cocoon::provider::reconcile::OrphanPolicy;
use vk_cocoon::provider::{CocoonProvider, Ports, ProviderConfig, Timings};
use vk_cocoon::runtime::{
    CloneSource, CloneSpec, CocoonCli, CocoonRuntime, ExecIo, ExecSpec, ImageRecord, Result as RtResult, RunSpec,
    SnapshotRecord, StaleCreateOutcome, VmRecord, WatchItem,
};
use vk_test_support::bench::{env_usize, locate_sim, ms, status_kib};
use vk_test_support::provider_support::*;

fn rss() -> (f64, f64) {
    (
        status_kib("VmHWM:") as f64 / 1024.0,
        status_kib("VmRSS:") as f64 / 1024.0,
    )
}

tokio::task_local! {
    /// Set around the operation being measured.
    static MEASURED: ();
}

/// The real CLI client, summing the wall time of every call (the time "inside cocoon", including
/// process spawn and JSON parsing of its output).
struct TimedRuntime {
    inner: Arc<CocoonCli>,
    nanos: AtomicU64,
    calls: AtomicU64,
    clones: AtomicU64,
    count_all: std::sync::atomic::AtomicBool,
}

impl TimedRuntime {
    fn new(inner: Arc<CocoonCli>) -> Self {
        Self {
            inner,
            nanos: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            clones: AtomicU64::new(0),
            count_all: true.into(),
        }
    }
    fn reset(&self) {
        self.nanos.store(0, Ordering::SeqCst);
        self.calls.store(0, Ordering::SeqCst);
        self.clones.store(0, Ordering::SeqCst);
    }
    fn spent(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::SeqCst))
    }
    fn n_calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
    /// Times every call (`count_all`, the startup: it leaves no cocoon work behind), or only the
    /// calls of the measured operation itself (CreatePod: the guest fixup it leaves behind runs
    /// in a spawned task, outside the `MEASURED` scope, and is not counted).
    async fn time<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        if !self.count_all.load(Ordering::SeqCst) && MEASURED.try_with(|_| ()).is_err() {
            return f.await;
        }
        let t = Instant::now();
        let r = f.await;
        self.nanos.fetch_add(t.elapsed().as_nanos() as u64, Ordering::SeqCst);
        self.calls.fetch_add(1, Ordering::SeqCst);
        r
    }

    /// [`Self::time`], the call also recorded as a stage of a profiled create (`verb`).
    async fn call<T>(&self, verb: &str, f: impl std::future::Future<Output = T>) -> T {
        stages::timed(|| format!("cocoon {verb}"), self.time(f)).await
    }
}

#[async_trait]
impl CocoonRuntime for TimedRuntime {
    async fn run(&self, spec: &RunSpec) -> RtResult<VmRecord> {
        self.call("vm run", self.inner.run(spec)).await
    }
    async fn clone_vm(&self, spec: &CloneSpec) -> RtResult<VmRecord> {
        self.clones.fetch_add(1, Ordering::SeqCst);
        self.call("vm clone", self.inner.clone_vm(spec)).await
    }
    async fn inspect(&self, reference: &str) -> RtResult<VmRecord> {
        self.call("vm inspect", self.inner.inspect(reference)).await
    }
    async fn list(&self) -> RtResult<Vec<VmRecord>> {
        self.call("vm list", self.inner.list()).await
    }
    async fn remove(&self, reference: &str) -> RtResult<()> {
        self.call("vm rm", self.inner.remove(reference)).await
    }
    async fn start(&self, reference: &str) -> RtResult<()> {
        self.call("vm start", self.inner.start(reference)).await
    }
    async fn reconcile_stale_create(&self, reference: &str) -> RtResult<StaleCreateOutcome> {
        self.call(
            "vm reconcile-stale-create",
            self.inner.reconcile_stale_create(reference),
        )
        .await
    }
    async fn net_resize(&self, reference: &str, nics: u32) -> RtResult<()> {
        self.call("vm net-resize", self.inner.net_resize(reference, nics)).await
    }
    async fn exec(&self, reference: &str, spec: &ExecSpec, io: ExecIo<'_>) -> RtResult<()> {
        self.call("vm exec", self.inner.exec(reference, spec, io)).await
    }
    async fn logs(&self, reference: &str, tail: Option<u64>) -> RtResult<String> {
        self.call("vm logs", self.inner.logs(reference, tail)).await
    }
    fn watch_events(&self) -> BoxStream<'static, WatchItem> {
        self.inner.watch_events()
    }
    async fn snapshot_save(&self, name: &str, vm_id: &str) -> RtResult<()> {
        self.call("snapshot save", self.inner.snapshot_save(name, vm_id)).await
    }
    async fn snapshot_inspect(&self, name: &str) -> RtResult<SnapshotRecord> {
        self.call("snapshot inspect", self.inner.snapshot_inspect(name)).await
    }
    async fn snapshot_list(&self, vm: Option<&str>) -> RtResult<Vec<SnapshotRecord>> {
        self.call("snapshot list", self.inner.snapshot_list(vm)).await
    }
    async fn snapshot_remove_if_exists(&self, name: &str) -> RtResult<()> {
        self.call("snapshot rm", self.inner.snapshot_remove_if_exists(name))
            .await
    }
    async fn snapshot_import(&self, name: &str, tar: &mut (dyn AsyncRead + Unpin + Send)) -> RtResult<()> {
        self.call("snapshot import", self.inner.snapshot_import(name, tar))
            .await
    }
    async fn snapshot_export(&self, name: &str) -> RtResult<Box<dyn AsyncRead + Send + Unpin>> {
        self.call("snapshot export", self.inner.snapshot_export(name)).await
    }
    async fn snapshot_export_to_dir(&self, name: &str, dir: &std::path::Path) -> RtResult<()> {
        self.call("snapshot export", self.inner.snapshot_export_to_dir(name, dir))
            .await
    }
    async fn image_pull(&self, reference: &str, force: bool) -> RtResult<()> {
        self.call("image pull", self.inner.image_pull(reference, force)).await
    }
    async fn image_inspect(&self, reference: &str) -> RtResult<ImageRecord> {
        self.call("image inspect", self.inner.image_inspect(reference)).await
    }
    async fn image_import(&self, name: &str, data: &mut (dyn AsyncRead + Unpin + Send)) -> RtResult<()> {
        self.call("image import", self.inner.image_import(name, data)).await
    }
}

/// The provider as the daemon builds it, on the timed runtime.
fn provider(env: &Env, runtime: Arc<TimedRuntime>) -> Arc<CocoonProvider> {
    let patcher: Arc<dyn PodPatcher> = Arc::new(KubePodPatcher::new(env.server.client()));
    let cfg = ProviderConfig {
        node_name: NODE.into(),
        node_class: String::new(),
        restore_mode: vk_cocoon::policy::contract::types::RestoreMode::Mmap,
        orphan_policy: OrphanPolicy::Alert,
        root_dir: env.sim_dir.path().join("root"),
        run_dir: env.sim_dir.path().join("root/run"),
        state_dir: Some(env.sim_dir.path().join("vk-state")),
        clone_roots: vk_cocoon::provider::clone_roots::CloneRoots::default_for(env.sim_dir.path()),
        guest_networks: guest_networks("127.0.0.0/8,::1/128"),
        network_mode: Default::default(),
        macos: Default::default(),
        max_bring_ups: vk_cocoon::provider::config::DEFAULT_MAX_BRING_UPS,
        timings: Timings {
            patch_retry: Duration::from_millis(50),
            reflush_interval: Duration::from_secs(3600),
            // No background loops run here, so no reclaimer: the startup lists the local
            // snapshots itself (with the reclaimer on, its first pass is that list).
            reclaim_interval: None,
            ..Timings::default()
        },
    };
    let ports = Ports {
        runtime: runtime as Arc<dyn CocoonRuntime>,
        macos: env.macos.clone(),
        registry: env.registry.clone().map(|r| r as Arc<dyn SnapshotRegistry>),
        leases: Arc::new(LeaseFile::new(&env.leases)),
        releaser: None,
        patcher: Arc::new(stages::TimedPatcher(patcher)),
        events: Arc::new(EventSink::new(env.server.client(), NODE)),
        prober: guarded_prober(env, None),
    };
    CocoonProvider::new(cfg, ports, env.policies.clone(), ProviderMetrics::unregistered()).unwrap()
}

/// Writes `n` copies of `template` (names `vm-p-<i>`, fresh ids and IPs) into the simulator's state in one update.
fn seed_vms(env: &Env, template_id: &str, n: usize) -> Vec<String> {
    let store = cocoon_sim::store::Store::new(env.sim.root());
    store
        .update(|s| -> std::io::Result<Vec<String>> {
            let template = s.vms.get(template_id).cloned().expect("template VM in the sim state");
            s.vms.remove(template_id);
            let mut ids = Vec::with_capacity(n);
            for i in 0..n {
                let mut e = template.clone();
                let id = cocoon_sim::util::new_id();
                e.vm.id = id.clone();
                e.vm.config.name = format!("vm-p-{i}");
                let k = i as u32 + 10;
                for nic in &mut e.vm.network_configs {
                    if let Some(net) = nic.network.as_mut() {
                        net.ip = format!("127.89.{}.{}", k / 250, k % 250 + 2);
                    }
                }
                e.seq = s.next_seq();
                e.vm.pid = 300_000 + i as i64;
                s.vms.insert(id.clone(), e);
                ids.push(id);
            }
            Ok(ids)
        })
        .unwrap()
}

/// Listed pods as the virtual node hands them to the provider: shared.
fn shared(pods: Vec<Pod>) -> Vec<Arc<Pod>> {
    pods.into_iter().map(Arc::new).collect()
}

/// Creates (in the apiserver) a managed clone-mode pod `name` of the warm image, VM `vm-<name>`.
async fn create_clone_pod(env: &Env, name: &str) -> Arc<Pod> {
    let pod = managed(
        name,
        &format!("vm-{name}"),
        &[("cocoonset.cocoonstack.io/image", "base")],
    );
    Arc::new(create(env, &pod).await)
}

fn main() {
    if let Some(sim) = locate_sim() {
        println!("cocoon-sim: {}", sim.display());
    }
    stages::install();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let n_pods = env_usize("BENCH_PODS", 10_000);
    let n_creates = env_usize("BENCH_CREATES", 50);
    let (hwm_start, rss_start) = rss();

    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let template = env
        .runtime
        .clone_vm(&CloneSpec {
            name: Some("template".into()),
            network: None,
            no_direct_io: false,
            pull: true,
            restore_mode: None,
            nics: None,
            cpu_policy: Default::default(),
            backend: Default::default(),
            source: CloneSource::Snapshot("base".into()),
        })
        .await
        .unwrap();

    // ---- seeding -----------------------------------------------------------------------------
    let t = Instant::now();
    let ids = seed_vms(&env, &template.id, n_pods);
    let seed_vms_time = t.elapsed();
    let t = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        let name = format!("p-{i}");
        create(
            &env,
            &managed(
                &name,
                &format!("vm-{name}"),
                &[
                    ("cocoonset.cocoonstack.io/image", "base"),
                    ("vm.cocoonstack.io/id", id),
                    ("vm.cocoonstack.io/lifecycle-state", "ready"),
                ],
            ),
        )
        .await;
    }
    let seed_pods_time = t.elapsed();
    println!(
        "seeded {n_pods} VMs in {:.0} ms (one state update) and {n_pods} pods in {:.0} ms",
        ms(seed_vms_time),
        ms(seed_pods_time)
    );

    let pods_api: Api<Pod> = Api::all(env.server.client());
    let lp = ListParams::default().fields(&format!("spec.nodeName={NODE}"));

    // ---- I/O floor: one vm list, one pod list (warm-up first, then the best of 3) ------------
    let _ = env.runtime.list().await.unwrap();
    let _ = pods_api.list(&lp).await.unwrap();
    let mut vm_list = Duration::MAX;
    let mut pod_list = Duration::MAX;
    let mut both_lists = Duration::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let vms = env.runtime.list().await.unwrap();
        vm_list = vm_list.min(t.elapsed());
        assert_eq!(vms.len(), n_pods);
        let t = Instant::now();
        let pods = pods_api.list(&lp).await.unwrap();
        pod_list = pod_list.min(t.elapsed());
        assert_eq!(pods.items.len(), n_pods);
        // The two lists at once, as a startup must read them: on a machine with fewer free cores
        // than the two need (the simulator, the JSON decoding of both, the apiserver serving),
        // they slow each other down, and no startup can beat this.
        let t = Instant::now();
        let (vms, pods) = tokio::join!(env.runtime.list(), pods_api.list(&lp));
        both_lists = both_lists.min(t.elapsed());
        assert_eq!((vms.unwrap().len(), pods.unwrap().items.len()), (n_pods, n_pods));
    }

    // ---- startup reconcile (as the daemon: prefetch the VM list, list the node's pods, reconcile) --
    let (hwm_pre_reconcile, _) = rss();
    let mut runs = Vec::new();
    let mut last: Option<(Arc<CocoonProvider>, Arc<TimedRuntime>)> = None;
    for _ in 0..3 {
        let timed = Arc::new(TimedRuntime::new(env.runtime.clone()));
        let p = provider(&env, timed.clone());
        let t = Instant::now();
        p.prefetch_vms();
        let pods = shared(pods_api.list(&lp).await.unwrap().items);
        let t_listed = t.elapsed();
        let t2 = Instant::now();
        p.reconcile(&pods).await.unwrap();
        let reconcile_only = t2.elapsed();
        let total = t.elapsed();
        assert_eq!(p.state().vm_count(), n_pods, "every VM adopted");
        let (spent, calls) = (timed.spent(), timed.n_calls());
        // The local snapshot list runs in the background after the reconcile (not part of the
        // startup: the node serves before it lands). It is waited for, so the next run's lists
        // do not share the machine with it, and reported beside the startup.
        tokio::time::timeout(Duration::from_secs(60), p.until_snapshot_list_landed())
            .await
            .expect("the background snapshot list landed");
        let landed = t.elapsed();
        runs.push((total, t_listed, reconcile_only, spent, calls, landed));
        last = Some((p, timed));
    }
    drop(last);
    let (hwm_post_reconcile, rss_post_reconcile) = rss();
    runs.sort_by_key(|r| r.0);
    let (rec_total, rec_podlist, rec_only, rec_cocoon, rec_calls, rec_landed) = runs[runs.len() / 2];
    let floor = both_lists;

    // ---- CreatePod overhead (clone mode, sequential) -----------------------------------------
    let timed = Arc::new(TimedRuntime::new(env.runtime.clone()));
    timed.count_all.store(false, Ordering::SeqCst);
    let p = provider(&env, timed.clone());
    p.reconcile(&shared(pods_api.list(&lp).await.unwrap().items))
        .await
        .unwrap();
    // The creates are measured on a warm node: the background snapshot list landed.
    tokio::time::timeout(Duration::from_secs(60), p.until_snapshot_list_landed())
        .await
        .expect("the background snapshot list landed");
    let mut new_pods = Vec::with_capacity(n_creates);
    for i in 0..n_creates {
        let name = format!("c-{i}");
        new_pods.push(create_clone_pod(&env, &name).await);
    }
    // Warm-up: one create not counted (first policy instantiations, connection pool).
    let warm = create_clone_pod(&env, "c-warm").await;
    MEASURED.scope((), p.create_pod(&warm)).await.unwrap();
    timed.reset();
    let mut per_pod_overhead = Vec::with_capacity(n_creates);
    let t = Instant::now();
    for pod in &new_pods {
        let before = timed.spent();
        let t1 = Instant::now();
        MEASURED.scope((), p.create_pod(pod)).await.unwrap();
        let wall = t1.elapsed();
        per_pod_overhead.push(wall.saturating_sub(timed.spent() - before));
    }
    let create_wall = t.elapsed();
    let create_cocoon = timed.spent();
    let create_calls = timed.n_calls();
    let clones = timed.clones.load(Ordering::SeqCst);
    assert_eq!(clones as usize, n_creates, "every create cloned");
    per_pod_overhead.sort();
    let pct = |q: f64| per_pod_overhead[((per_pod_overhead.len() - 1) as f64 * q).round() as usize];

    // ---- CreatePod per-stage profile (each create alone, until its pod's Ready) ---------------
    let n_profile = env_usize("BENCH_PROFILE_CREATES", 50);
    let mut profiled = Vec::with_capacity(n_profile);
    let mut profile_overhead = Vec::with_capacity(n_profile);
    // Every pod created above has its Ready first (the warm-up's included): their guest work
    // is done, and nothing but the profiled create runs.
    tokio::time::timeout(Duration::from_secs(120), stages::until_ready_count(n_creates + 1))
        .await
        .expect("the measured pods' Ready was published");
    for i in 0..n_profile {
        let name = format!("s-{i}");
        let pod = create_clone_pod(&env, &name).await;
        let before = timed.spent();
        let rec = stages::Recorder::new(&name);
        stages::set_active(Some(rec.clone()));
        MEASURED.scope((), p.create_pod(&pod)).await.unwrap();
        let returned = rec.now();
        profile_overhead.push(returned.saturating_sub(timed.spent() - before));
        tokio::time::timeout(Duration::from_secs(60), rec.until_ready())
            .await
            .expect("the profiled pod's Ready was published");
        stages::set_active(None);
        let mut marks = rec.marks();
        marks.push(stages::Mark {
            label: "= CreatePod returned".into(),
            start: returned,
            end: returned,
        });
        profiled.push(marks);
    }
    profile_overhead.sort();
    let (hwm_end, rss_end) = rss();

    // ---- table ------------------------------------------------------------------------------
    let n = n_pods as f64;
    println!();
    println!("== startup reconcile: {n_pods} pods / {n_pods} VMs (median of 3 runs, fresh provider each) ==");
    println!("{:<52} {:>12} {:>14}", "", "total ms", "per pod µs");
    let row = |label: &str, d: Duration| println!("{:<52} {:>12.1} {:>14.1}", label, ms(d), d.as_secs_f64() * 1e6 / n);
    row("I/O floor: one `cocoon vm list` (best of 3)", vm_list);
    row("I/O floor: one pod list from the apiserver (best of 3)", pod_list);
    row("I/O floor: both lists at once (best of 3)", both_lists);
    row("startup total (prefetch ∥ pod list, then reconcile)", rec_total);
    row("  of which pod list", rec_podlist);
    row("  of which reconcile() after the pod list", rec_only);
    row("  time inside cocoon CLI during the startup", rec_cocoon);
    row(
        "startup total minus floor (both lists at once)",
        rec_total.saturating_sub(floor),
    );
    println!(
        "{:<52} {:>12.2}",
        "ratio startup total / floor",
        rec_total.as_secs_f64() / floor.as_secs_f64()
    );
    println!(
        "{:<52} {:>12.2}",
        "ratio startup total / the slower list alone",
        rec_total.as_secs_f64() / vm_list.max(pod_list).as_secs_f64()
    );
    println!("{:<52} {:>12}", "cocoon calls during the startup", rec_calls);
    row("background snapshot list landed (from the start)", rec_landed);
    println!();
    println!("== CreatePod, clone mode, {n_creates} sequential creates ==");
    println!("{:<52} {:>12} {:>14}", "", "total ms", "per pod ms");
    let m = n_creates as f64;
    let row = |label: &str, d: Duration| println!("{:<52} {:>12.1} {:>14.2}", label, ms(d), ms(d) / m);
    row("wall time", create_wall);
    row("inside cocoon CLI (sum of call wall times)", create_cocoon);
    row("overhead = wall - cocoon", create_wall.saturating_sub(create_cocoon));
    println!(
        "{:<52} {:>12} {:>14.1}",
        "cocoon calls",
        create_calls,
        create_calls as f64 / m
    );
    println!(
        "{:<52} {:>12} {:>14.2}",
        "overhead per pod p50 / p90 / max (ms)",
        "",
        ms(pct(0.5))
    );
    println!("{:<52} {:>12} {:>14.2}", "", "p90", ms(pct(0.9)));
    println!("{:<52} {:>12} {:>14.2}", "", "max", ms(pct(1.0)));
    println!();
    println!(
        "== CreatePod per-stage profile: {n_profile} creates, each alone until its pod's Ready (p50 over the creates, ms from the create's entry) =="
    );
    println!(
        "{:<60} {:>8} {:>8} {:>8} {:>8}",
        "stage", "per pod", "start", "end", "took"
    );
    for r in stages::rows(&profiled) {
        println!(
            "{:<60} {:>8.2} {:>8.3} {:>8.3} {:>8.3}",
            r.label,
            r.per_create,
            ms(r.start),
            ms(r.end),
            ms(r.took)
        );
    }
    let q = |v: &[Duration], q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    println!(
        "{:<60} {:>8.3} {:>8.3}",
        "overhead in this pass p50 / p90 (ms)",
        ms(q(&profile_overhead, 0.5)),
        ms(q(&profile_overhead, 0.9))
    );
    println!();
    println!("== RSS of this process (daemon side: provider + client; apiserver and its store share it) ==");
    println!("{:<52} {:>10} {:>10}", "", "VmHWM MiB", "VmRSS MiB");
    println!("{:<52} {:>10.1} {:>10.1}", "start", hwm_start, rss_start);
    println!(
        "{:<52} {:>10.1} {:>10}",
        "after seeding, before the reconcile", hwm_pre_reconcile, ""
    );
    println!(
        "{:<52} {:>10.1} {:>10.1}",
        "after 3 reconciles", hwm_post_reconcile, rss_post_reconcile
    );
    println!("{:<52} {:>10.1} {:>10.1}", "end (after the creates)", hwm_end, rss_end);
}
