//! Shared harness of the provider's end-to-end tests (tests/integration/provider, the benches,
//! the real-apiserver suite): the fake apiserver, cocoon-sim behind the real CLI client, an
//! in-memory registry implementing the provider's `SnapshotRegistry` port (`fake_registry`), the
//! default policies, and the real `CocoonProvider` inside a `VirtualNode`; `pods` builds and
//! reads pods, `history` follows readiness, leases and a pod's recorded changes.

mod fake_registry;
pub mod fleet_ca;
mod history;
pub mod loopback;
mod pods;
pub use fake_registry::*;
pub use history::*;
pub use pods::*;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use cocoon_sim::Sim;
use fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use vk_cocoon::kubelet::events::EventSink;
use vk_cocoon::kubelet::{KubeletConfig, VirtualNode};
use vk_cocoon::policy::{Policies, PolicyEngine, PolicyMetrics, SandboxLimits};
use vk_cocoon::provider::cocoon_net::LeaseFile;
use vk_cocoon::provider::metrics::ProviderMetrics;
use vk_cocoon::provider::ports::{Artifact, KubePodPatcher, SnapshotMeta, SnapshotRegistry};
use vk_cocoon::provider::probe::{NetProber, Prober};
use vk_cocoon::provider::reconcile::OrphanPolicy;
use vk_cocoon::provider::transfer::{TransferError, Transfers};
use vk_cocoon::provider::{CocoonProvider, Ports, ProbeTimings, ProviderConfig, Timings};
use vk_cocoon::registry::{CloudImageSource, Progress, PullReport, PushReport, RegistryError, SnapshotSource};
use vk_cocoon::runtime::{CocoonCli, CocoonRuntime, RunSpec};

use crate::{kubelet_support, registry_support, runtime_support};

pub use crate::kubelet_support::{NODE, eventually};
pub use vk_cocoon::provider::ports::SnapshotRegistry as _;
pub use vk_cocoon::runtime::CocoonRuntime as _;

/// Everything a daemon runs against; survives daemon restarts.
pub struct Env {
    pub server: FakeApiServer,
    pub sim_dir: tempfile::TempDir,
    pub sim: Sim,
    pub runtime: Arc<CocoonCli>,
    /// The cocoon-macos simulator's state directory (beside the cocoon root, same subnet) and
    /// the daemon's client for it.
    pub mac: Sim,
    pub macos: Arc<vk_cocoon::runtime::macos::MacosCli>,
    pub registry: Option<Arc<FakeRegistry>>,
    /// A real OCI registry (Debian's docker-registry) and the daemon's client for it, when the
    /// test runs against one instead of the in-memory fake.
    pub oci: Option<Oci>,
    pub policies: Arc<Policies>,
    pub leases: std::path::PathBuf,
    /// What the loopback guard refused during this test (checked when the Env is dropped).
    pub refused: loopback::Refusals,
}

impl Drop for Env {
    fn drop(&mut self) {
        // A test that already failed keeps its own message (a second panic would abort).
        if !std::thread::panicking() {
            self.refused.assert_none();
        }
    }
}

pub async fn env(with_registry: bool) -> Env {
    if let Ok(filter) = std::env::var("RUST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
    let server = FakeApiServer::start().await;
    let sim_dir = tempfile::tempdir().unwrap();
    // The simulator's static guest addresses are on loopback, in a 127.N subnet of this root's
    // own: the daemon's real TCP and ICMP probes reach them without leaving the machine, and
    // never another test's guest.
    let sim = Sim::new(sim_dir.path()).unwrap();
    let runtime = Arc::new(CocoonCli::new(runtime_support::config(&sim)));
    let mac = sim.macos().unwrap();
    let macos = Arc::new(vk_cocoon::runtime::macos::MacosCli::new(runtime_support::macos_config(
        &mac,
    )));
    // A generous decision deadline: these tests share two cores with builds, and a policy
    // timeout (fail-safe refusal, retried) is not what they are about.
    let engine = PolicyEngine::new(SandboxLimits {
        timeout: Duration::from_secs(5),
        ..SandboxLimits::default()
    })
    .unwrap();
    let policies = Arc::new(Policies::with_defaults(engine, None, PolicyMetrics::unregistered()).unwrap());
    let leases = sim_dir.path().join("leases.json");
    std::fs::write(&leases, "null").unwrap();
    Env {
        server,
        sim_dir,
        sim,
        runtime,
        mac,
        macos,
        registry: with_registry.then(Arc::default),
        oci: None,
        policies,
        leases,
        refused: loopback::Refusals::default(),
    }
}

/// A real registry for the provider's tests.
pub struct Oci {
    pub server: Mutex<registry_support::TestRegistry>,
    /// The daemon's registry adapter (`client.registry`) with the transfer path around it.
    pub client: Arc<registry_support::TransferClient>,
}

impl Oci {
    /// Kills the registry process (every call fails until [`Oci::restart`]).
    pub fn kill(&self) {
        self.server.lock().unwrap().kill();
    }

    pub fn restart(&self) {
        self.server.lock().unwrap().restart();
    }
}

/// An environment whose registry is a real `docker-registry` on loopback.
pub async fn env_with_oci() -> Env {
    let mut env = env(false).await;
    let server = tokio::task::spawn_blocking(registry_support::TestRegistry::start)
        .await
        .unwrap();
    let client = Arc::new(server.transfer_client("", NODE));
    env.oci = Some(Oci {
        server: Mutex::new(server),
        client,
    });
    env
}

/// One running daemon (provider + virtual node) on its own tokio runtime, so that killing it
/// drops every task it started, as a crash of the process would.
pub struct Daemon {
    pub provider: Arc<CocoonProvider>,
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), vk_cocoon::kubelet::KubeletError>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Daemon {
    /// Stops it abruptly: no cleanup of in-flight work (its cocoon child processes die with it).
    pub async fn kill(mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

pub struct Options {
    pub orphan: OrphanPolicy,
    pub node_class: String,
    pub releaser: Option<Arc<dyn vk_cocoon::provider::ports::LeaseReleaser>>,
    pub timings: Timings,
    pub root_dir: Option<std::path::PathBuf>,
    /// The macOS path's node settings (VNC password, port range).
    pub macos: vk_cocoon::provider::macos::MacosSettings,
    /// What the loopback guard passes probes to (default: the daemon's real `NetProber`).
    pub prober: Option<Arc<dyn Prober>>,
    /// The daemon's guest networks (default: loopback, where the simulator's guests live).
    pub guest_networks: Option<vk_cocoon::provider::probe_scope::GuestNetworks>,
    /// The guests' DHCP family (default IPv4).
    pub network_mode: vk_cocoon::provider::plan::NetworkMode,
    /// `VK_MAX_CONCURRENT_BRING_UPS` (default: the daemon's).
    pub max_bring_ups: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            orphan: OrphanPolicy::Destroy,
            node_class: String::new(),
            releaser: None,
            timings: fast_timings(),
            root_dir: None,
            macos: Default::default(),
            prober: None,
            guest_networks: None,
            network_mode: Default::default(),
            max_bring_ups: vk_cocoon::provider::config::DEFAULT_MAX_BRING_UPS,
        }
    }
}

/// The spec's timings scaled down so background work finishes within a test. The restart
/// cooldown keeps its 30 s: the tests stop a VM twice well within it.
pub fn fast_timings() -> Timings {
    Timings {
        patch_retry: Duration::from_millis(50),
        stale_watch_budget: Duration::from_secs(20),
        reflush_interval: Duration::from_millis(300),
        probe: ProbeTimings {
            initial: Duration::from_millis(50),
            max_unready: Duration::from_millis(200),
            ready: Duration::from_millis(200),
            timeout: Duration::from_secs(1),
            failures_to_unready: 3,
        },
        fixup_interval: Duration::from_millis(200),
        fixup_budget: Duration::from_secs(3),
        sac: vk_cocoon::provider::sac::SacTimings {
            interval: Duration::from_millis(100),
            dial_budget: Duration::from_secs(5),
            enum_tries: 30,
            verify_tries: 10,
            reply_timeout: Duration::from_secs(2),
        },
        ip_wait: Duration::from_secs(3),
        ip_poll: Duration::from_millis(50),
        renew_nudge_after: Duration::from_millis(1500),
        inspect_retry: Duration::from_millis(50),
        recheck_initial: Duration::from_millis(100),
        recheck_max: Duration::from_millis(400),
        recheck_budget: Duration::from_secs(4),
        restart_cooldown: Duration::from_secs(30),
        status_initial: Duration::from_millis(200),
        status_period: Duration::from_millis(400),
        op_retry_min: Duration::from_millis(300),
        op_retry_max: Duration::from_secs(2),
        evict_backoff: Duration::from_millis(50),
        evict_retry_max: Duration::from_secs(1),
        classify_budget: Duration::from_secs(5),
        mac_reinspect: Duration::from_millis(500),
        // The reclaimer is driven by the tests that are about it.
        reclaim_interval: None,
    }
}

/// A cocoon-net control socket stand-in that records the released MACs, and for each the
/// daemon's call path (its `src/provider` frames, from a backtrace), so a test that sees an
/// unexpected release says which path released it.
#[derive(Default)]
pub struct RecordingReleaser {
    pub released: Mutex<Vec<String>>,
    pub paths: Mutex<Vec<String>>,
}

impl RecordingReleaser {
    /// `"mac: released by <frames>"` for every release so far.
    pub fn report(&self) -> String {
        let released = self.released.lock().unwrap().clone();
        let paths = self.paths.lock().unwrap().clone();
        released
            .iter()
            .zip(paths.iter())
            .map(|(mac, path)| format!("{mac}: released by {path}"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[async_trait]
impl vk_cocoon::provider::ports::LeaseReleaser for RecordingReleaser {
    async fn release(&self, mac: &str) -> Result<(), vk_cocoon::provider::ports::ReleaseError> {
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        // The `at src/provider/<file>.rs:<line>` lines of the daemon's frames, innermost first.
        let frames: Vec<&str> = trace
            .lines()
            .map(str::trim)
            .filter_map(|l| l.strip_prefix("at "))
            .filter_map(|l| l.find("src/provider/").map(|i| &l[i..]))
            .collect();
        self.paths.lock().unwrap().push(frames.join(" ← "));
        self.released.lock().unwrap().push(mac.to_string());
        Ok(())
    }
}

pub fn kubelet_config(node_class: &str) -> KubeletConfig {
    let mut vars: Vec<(&str, &str)> = vec![];
    if !node_class.is_empty() {
        vars.push(("VK_SNAPSHOT_CPU_CLASS", node_class));
    }
    kubelet_support::config(&vars)
}

pub fn provider(env: &Env, opts: &Options) -> Arc<CocoonProvider> {
    let cfg = ProviderConfig {
        node_name: NODE.into(),
        node_class: opts.node_class.clone(),
        restore_mode: vk_cocoon::policy::contract::types::RestoreMode::Mmap,
        orphan_policy: opts.orphan,
        root_dir: opts.root_dir.clone().unwrap_or_else(|| env.sim_dir.path().join("root")),
        // The simulator's layout when COCOON_ROOT_DIR is unset: `<sim root>/root/run`.
        run_dir: env.sim_dir.path().join("root/run"),
        // Kept beside the simulator's state: a restarted daemon of the same Env finds it.
        state_dir: Some(env.sim_dir.path().join("vk-state")),
        clone_roots: vk_cocoon::provider::clone_roots::CloneRoots::default_for(env.sim_dir.path()),
        guest_networks: opts
            .guest_networks
            .clone()
            .unwrap_or_else(|| guest_networks("127.0.0.0/8,::1/128")),
        network_mode: opts.network_mode,
        macos: opts.macos.clone(),
        max_bring_ups: opts.max_bring_ups,
        timings: opts.timings.clone(),
    };
    let ports = Ports {
        runtime: env.runtime.clone(),
        macos: env.macos.clone(),
        registry: match &env.oci {
            Some(oci) => Some(oci.client.registry.clone() as Arc<dyn SnapshotRegistry>),
            None => env.registry.clone().map(|r| r as Arc<dyn SnapshotRegistry>),
        },
        leases: Arc::new(LeaseFile::new(&env.leases)),
        releaser: opts.releaser.clone(),
        patcher: Arc::new(KubePodPatcher::new(env.server.client())),
        events: Arc::new(EventSink::new(env.server.client(), NODE)),
        prober: guarded_prober(env, opts.prober.clone()),
    };
    CocoonProvider::new(cfg, ports, env.policies.clone(), ProviderMetrics::unregistered()).unwrap()
}

/// Guest networks of `list` (CIDRs, comma-separated). The simulator's guests live on loopback.
pub fn guest_networks(list: &str) -> vk_cocoon::provider::probe_scope::GuestNetworks {
    vk_cocoon::provider::probe_scope::GuestNetworks::Listed(
        vk_cocoon::provider::probe_scope::ProbeNetworks::parse(list)
            .unwrap()
            .expect("a network"),
    )
}

/// The prober every test daemon gets: `inner` (default: the real `NetProber`) behind the
/// loopback guard, which refuses and reports any target off this machine.
pub fn guarded_prober(env: &Env, inner: Option<Arc<dyn Prober>>) -> Arc<dyn Prober> {
    let inner = inner.unwrap_or_else(|| Arc::new(NetProber::default()));
    Arc::new(loopback::LoopbackGuard::new(inner, env.refused.clone()))
}

pub fn start(env: &Env, opts: Options) -> Daemon {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("daemon")
        .enable_all()
        .build()
        .unwrap();
    let _inside = runtime.enter();
    let provider = provider(env, &opts);
    let node = VirtualNode::new(
        env.server.client(),
        kubelet_config(&opts.node_class),
        kubelet_support::fixed_host(),
        "127.0.0.1".parse().unwrap(),
        provider.clone(),
    );
    provider.set_notifier(Arc::new(node.notifier()));
    let shutdown = CancellationToken::new();
    provider.prefetch_vms();
    runtime.spawn(provider.clone().run_background(shutdown.clone()));
    let task = runtime.spawn(node.run(shutdown.clone()));
    drop(_inside);
    Daemon {
        provider,
        shutdown,
        task,
        runtime: Some(runtime),
    }
}

/// A cocoon-net stand-in that checks the rule a lease release must keep: at each release, no VM
/// with that MAC exists any more (a lease released under a live guest breaks its network).
/// Records every release and every breach, and can be told to fail its releases.
pub struct LeaseWitness {
    runtime: Arc<CocoonCli>,
    pub released: Mutex<Vec<String>>,
    /// `"mac: still on vm <id> (<name>)"` for each release made while a VM held the MAC.
    pub breaches: Mutex<Vec<String>>,
    /// Every release answers an error (cocoon-net down).
    pub failing: AtomicBool,
}

impl LeaseWitness {
    pub fn new(env: &Env) -> Arc<Self> {
        Arc::new(Self {
            runtime: env.runtime.clone(),
            released: Mutex::default(),
            breaches: Mutex::default(),
            failing: AtomicBool::new(false),
        })
    }

    pub fn released(&self) -> Vec<String> {
        self.released.lock().unwrap().clone()
    }

    pub fn assert_no_breach(&self) {
        let breaches = self.breaches.lock().unwrap().clone();
        assert!(breaches.is_empty(), "leases released under a live VM: {breaches:?}");
    }
}

#[async_trait]
impl vk_cocoon::provider::ports::LeaseReleaser for LeaseWitness {
    async fn release(&self, mac: &str) -> Result<(), vk_cocoon::provider::ports::ReleaseError> {
        let live = self
            .runtime
            .list()
            .await
            .map_err(|e| vk_cocoon::provider::ports::ReleaseError::Read(std::io::Error::other(e)))?;
        for vm in live
            .iter()
            .filter(|vm| vm.network_configs.iter().any(|nic| nic.mac.eq_ignore_ascii_case(mac)))
        {
            self.breaches
                .lock()
                .unwrap()
                .push(format!("{mac}: still on vm {} ({})", vm.id, vm.name()));
        }
        self.released.lock().unwrap().push(mac.to_ascii_lowercase());
        if self.failing.load(Ordering::SeqCst) {
            return Err(vk_cocoon::provider::ports::ReleaseError::Connect {
                path: "cocoon-net.sock".into(),
                source: std::io::ErrorKind::ConnectionRefused.into(),
            });
        }
        Ok(())
    }
}
