//! Shared harness of the `provider_*` end-to-end tests: the fake apiserver, cocoon-sim behind
//! the real CLI client, an in-memory registry implementing the provider's `SnapshotRegistry`
//! port, the default policies, and the real `CocoonProvider` inside a `VirtualNode`.
#![allow(dead_code)]

#[path = "../kubelet_support/mod.rs"]
pub mod kubelet_support;
pub mod loopback;
#[path = "../registry_support/mod.rs"]
pub mod registry_support;
pub use registry_support::runtime_support;

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

#[allow(unused_imports)]
pub use kubelet_support::{NODE, eventually};
#[allow(unused_imports)]
pub use vk_cocoon::provider::ports::SnapshotRegistry as _;
pub use vk_cocoon::runtime::CocoonRuntime as _;

pub const SNAPSHOT_V1: &str = "application/vnd.cocoonstack.snapshot.v1+json";

struct Stored {
    artifact: Artifact,
    meta: SnapshotMeta,
    tar: Vec<u8>,
}

/// An in-memory OCI registry behind the provider's port, with fault knobs.
#[derive(Default)]
pub struct FakeRegistry {
    store: Mutex<HashMap<(String, String), Stored>>,
    /// Every call answers "unavailable".
    pub down: AtomicBool,
    /// The next N pushes fail.
    pub failing_pushes: AtomicU32,
    pub pulls: AtomicU32,
    pub pushes: Mutex<Vec<(String, String, String)>>,
    pub deletes: Mutex<Vec<(String, String)>>,
}

impl FakeRegistry {
    fn check(&self) -> Result<(), RegistryError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(unavailable("registry.test", "connection refused"));
        }
        Ok(())
    }

    pub fn has(&self, repo: &str, tag: &str) -> bool {
        self.store.lock().unwrap().contains_key(&(repo.into(), tag.into()))
    }

    pub fn annotations(&self, repo: &str, tag: &str) -> Option<BTreeMap<String, String>> {
        self.store
            .lock()
            .unwrap()
            .get(&(repo.into(), tag.into()))
            .map(|s| s.artifact.annotations.clone())
    }
}

impl FakeRegistry {
    /// Seeds the fake as a daemon would push: `cocoon snapshot export <local>` into `repo:tag`.
    pub async fn push_snapshot(
        &self,
        rt: &dyn CocoonRuntime,
        local: &str,
        repo: &str,
        tag: &str,
        base_image: &str,
    ) -> Result<PushReport, TransferError> {
        Transfers::new().push(rt, self, local, repo, tag, base_image).await
    }
}

fn unavailable(artifact: &str, detail: &str) -> RegistryError {
    RegistryError::Unavailable {
        op: "talking to".into(),
        artifact: artifact.into(),
        registry: "registry.test".into(),
        detail: detail.into(),
    }
}

/// The export tar's `snapshot.json` config (the fake's "config blob").
fn snapshot_meta_of(tar: &[u8]) -> Result<SnapshotMeta, String> {
    let mut a = tar::Archive::new(tar);
    for e in a.entries().map_err(|e| e.to_string())? {
        let mut e = e.map_err(|e| e.to_string())?;
        if e.path().map_err(|e| e.to_string())?.to_string_lossy() == "snapshot.json" {
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut b).map_err(|e| e.to_string())?;
            let v: serde_json::Value = serde_json::from_slice(&b).map_err(|e| e.to_string())?;
            let s = |k: &str| v["config"][k].as_str().unwrap_or_default().to_string();
            return Ok(SnapshotMeta {
                snapshot_id: s("id"),
                image: s("image"),
                hypervisor: s("hypervisor"),
            });
        }
    }
    Err("the export has no snapshot.json".into())
}

#[async_trait]
impl SnapshotRegistry for FakeRegistry {
    async fn manifest(&self, repo: &str, tag: &str) -> Result<Option<Artifact>, RegistryError> {
        self.check()?;
        Ok(self
            .store
            .lock()
            .unwrap()
            .get(&(repo.into(), tag.into()))
            .map(|s| s.artifact.clone()))
    }

    async fn snapshot_meta(&self, repo: &str, tag: &str) -> Result<Option<SnapshotMeta>, RegistryError> {
        self.check()?;
        Ok(self
            .store
            .lock()
            .unwrap()
            .get(&(repo.into(), tag.into()))
            .map(|s| s.meta.clone()))
    }

    async fn push_snapshot(
        &self,
        mut export: Box<dyn AsyncRead + Send + Unpin>,
        repo: &str,
        tag: &str,
        base_image: &str,
        progress: Arc<Progress>,
    ) -> Result<PushReport, RegistryError> {
        self.check()?;
        let artifact = format!("{repo}:{tag}");
        if self
            .failing_pushes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(unavailable(&artifact, "503 Service Unavailable"));
        }
        let mut tar = Vec::new();
        export.read_to_end(&mut tar).await.map_err(|e| RegistryError::Source {
            artifact: artifact.clone(),
            detail: e.to_string(),
        })?;
        progress.advance(tar.len() as u64);
        let meta = snapshot_meta_of(&tar).map_err(|detail| RegistryError::Source {
            artifact: artifact.clone(),
            detail,
        })?;
        let digest = format!("sha256:{}", tar.len());
        let stored = Artifact {
            digest: digest.clone(),
            artifact_type: SNAPSHOT_V1.into(),
            annotations: BTreeMap::from([("cocoonstack.snapshot.baseimage".to_string(), base_image.to_string())]),
        };
        let size = tar.len() as u64;
        self.store.lock().unwrap().insert(
            (repo.into(), tag.into()),
            Stored {
                artifact: stored,
                meta,
                tar,
            },
        );
        self.pushes
            .lock()
            .unwrap()
            .push((repo.into(), tag.into(), base_image.into()));
        Ok(PushReport {
            repo: repo.into(),
            tag: tag.into(),
            manifest_digest: digest,
            manifest_bytes: 0,
            total_size: size,
            file_bytes: size,
            layer_count: 1,
            uploaded_bytes: size,
            v2: false,
        })
    }

    async fn open_snapshot(&self, repo: &str, tag: &str) -> Result<SnapshotSource, RegistryError> {
        self.check()?;
        let store = self.store.lock().unwrap();
        let s = store
            .get(&(repo.into(), tag.into()))
            .ok_or_else(|| RegistryError::NotFound {
                artifact: format!("{repo}:{tag}"),
                registry: "registry.test".into(),
                detail: String::new(),
            })?;
        Ok(SnapshotSource::described(
            repo,
            tag,
            &s.artifact.digest,
            &s.meta.snapshot_id,
            s.tar.len() as u64,
        ))
    }

    async fn write_snapshot(
        &self,
        src: &SnapshotSource,
        local_name: &str,
        sink: &mut (dyn AsyncWrite + Send + Unpin),
        progress: &Progress,
    ) -> Result<PullReport, RegistryError> {
        self.check()?;
        let tar = self
            .store
            .lock()
            .unwrap()
            .get(&(src.repo.clone(), src.tag.clone()))
            .map(|s| s.tar.clone())
            .ok_or_else(|| RegistryError::NotFound {
                artifact: format!("{}:{}", src.repo, src.tag),
                registry: "registry.test".into(),
                detail: " (deleted during the pull)".into(),
            })?;
        self.pulls.fetch_add(1, Ordering::SeqCst);
        sink.write_all(&tar).await.map_err(|e| RegistryError::Sink {
            artifact: format!("{}:{}", src.repo, src.tag),
            detail: e.to_string(),
        })?;
        progress.advance(tar.len() as u64);
        Ok(PullReport {
            repo: src.repo.clone(),
            tag: src.tag.clone(),
            local_name: local_name.into(),
            manifest_digest: src.manifest_digest.clone(),
            snapshot_id: src.snapshot_id.clone(),
            tar_bytes: tar.len() as u64,
            layer_count: 1,
            shared: false,
        })
    }

    async fn open_cloud_image(&self, _reference: &str) -> Result<Option<CloudImageSource>, RegistryError> {
        self.check()?;
        Ok(None)
    }

    async fn write_cloud_image(
        &self,
        src: &CloudImageSource,
        _sink: &mut (dyn AsyncWrite + Send + Unpin),
        _progress: &Progress,
    ) -> Result<u64, RegistryError> {
        Err(RegistryError::InvalidRequest(format!(
            "the fake registry holds no cloud image {}",
            src.local_name
        )))
    }

    async fn delete_manifest(&self, repo: &str, tag: &str) -> Result<(), RegistryError> {
        self.check()?;
        self.store.lock().unwrap().remove(&(repo.into(), tag.into()));
        self.deletes.lock().unwrap().push((repo.into(), tag.into()));
        Ok(())
    }
}

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
    /// "mac: released by <frames>" for every release so far.
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
    async fn release(&self, mac: &str) -> Result<(), String> {
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
        root_dir: opts
            .root_dir
            .clone()
            .unwrap_or_else(|| env.sim_dir.path().join("cocoon-root")),
        macos: opts.macos.clone(),
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
    CocoonProvider::new(cfg, ports, env.policies.clone(), ProviderMetrics::unregistered())
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

// ---- pods ----------------------------------------------------------------------------------

pub fn agent_pod(name: &str, annotations: &[(&str, &str)]) -> Pod {
    let mut p = kubelet_support::pod(name, NODE);
    p.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    p
}

pub fn managed(name: &str, vm: &str, extra: &[(&str, &str)]) -> Pod {
    let mut a: Vec<(&str, &str)> = vec![
        ("vm.cocoonstack.io/name", vm),
        ("cocoonset.cocoonstack.io/managed", "true"),
    ];
    a.extend_from_slice(extra);
    agent_pod(name, &a)
}

pub fn with_resources(mut pod: Pod, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Pod {
    let q = |v: &[(&str, &str)]| {
        Some(
            v.iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    if spec.containers.is_empty() {
        spec.containers.push(Container {
            name: "agent".into(),
            ..Default::default()
        });
    }
    spec.containers[0].resources = Some(ResourceRequirements {
        requests: q(requests),
        limits: q(limits),
        ..Default::default()
    });
    pod
}

pub fn get(env: &Env, name: &str) -> Option<Pod> {
    env.server.store().get_as::<Pod>(Some("default"), name)
}

pub fn annotation(env: &Env, name: &str, key: &str) -> Option<String> {
    get(env, name).and_then(|p| p.annotations().get(key).cloned())
}

pub fn lifecycle(env: &Env, name: &str) -> Option<String> {
    annotation(env, name, "vm.cocoonstack.io/lifecycle-state")
}

pub fn lifecycle_message(env: &Env, name: &str) -> String {
    annotation(env, name, "vm.cocoonstack.io/lifecycle-state-message").unwrap_or_default()
}

/// Waits until pod `name` reports lifecycle `failed` with a message containing `needle`, both
/// read from one version of the pod: a failure that is retried moves the lifecycle on again
/// (`creating`, an empty message) within milliseconds, so the two must be read together.
/// Returns the message.
pub async fn wait_failed_with(env: &Env, name: &str, needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen = get(env, name).map(|p| {
            let a = p.annotations();
            (
                a.get("vm.cocoonstack.io/lifecycle-state").cloned().unwrap_or_default(),
                a.get("vm.cocoonstack.io/lifecycle-state-message")
                    .cloned()
                    .unwrap_or_default(),
            )
        });
        if let Some((state, message)) = &seen
            && state == "failed"
            && message.contains(needle)
        {
            return message.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {name} to fail with {needle:?}; last seen (lifecycle, message): {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn phase(env: &Env, name: &str) -> Option<String> {
    get(env, name).and_then(|p| p.status.and_then(|s| s.phase))
}

pub fn ready(env: &Env, name: &str) -> bool {
    get(env, name)
        .and_then(|p| p.status)
        .and_then(|s| s.conditions)
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// (reason, note) of the Events about pod `name`.
pub fn events(env: &Env, name: &str) -> Vec<(String, String)> {
    env.server
        .store()
        .list_as::<k8s_openapi::api::events::v1::Event>()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

pub fn has_event(env: &Env, name: &str, reason: &str) -> bool {
    events(env, name).iter().any(|(r, _)| r == reason)
}

/// The argv of every sim invocation of `verb` (e.g. "vm clone").
pub fn calls(env: &Env, verb: &str) -> Vec<Vec<String>> {
    calls_of(&env.sim, verb)
}

/// The argv of every invocation of `verb` that simulator `sim` (cocoon's or cocoon-macos's) logged.
pub fn calls_of(sim: &Sim, verb: &str) -> Vec<Vec<String>> {
    sim.calls()
        .unwrap()
        .into_iter()
        .filter(|c| c.verb == verb)
        .map(|c| c.argv)
        .collect()
}

pub async fn vms(env: &Env) -> Vec<vk_cocoon::runtime::VmRecord> {
    env.runtime.list().await.unwrap()
}

pub async fn vm_named(env: &Env, name: &str) -> Option<vk_cocoon::runtime::VmRecord> {
    vms(env).await.into_iter().find(|v| v.name() == name)
}

/// A local snapshot `name` taken from a throwaway VM booted from `image`.
pub async fn seed_snapshot(env: &Env, name: &str, image: &str) {
    seed_snapshot_on(&env.runtime, name, image).await;
}

/// [`seed_snapshot`] through any cocoon runtime (the real-apiserver tests have no [`Env`]).
pub async fn seed_snapshot_on(runtime: &CocoonCli, name: &str, image: &str) {
    runtime.image_pull(image, false).await.unwrap();
    let vm = runtime
        .run(&RunSpec {
            name: Some(format!("seed-{}", name.replace([':', '/'], "-"))),
            image: image.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    runtime.snapshot_save(name, &vm.id).await.unwrap();
    runtime.remove(&vm.id).await.unwrap();
}

/// VM `name` cloned straight from local snapshot `snapshot` (behind the daemon's back), on
/// network `network` (`None`: the default, static addresses).
pub async fn clone_direct_on(
    runtime: &CocoonCli,
    snapshot: &str,
    name: &str,
    network: Option<&str>,
) -> vk_cocoon::runtime::VmRecord {
    runtime
        .clone_vm(&vk_cocoon::runtime::CloneSpec {
            name: Some(name.into()),
            network: network.map(str::to_string),
            no_direct_io: false,
            pull: true,
            restore_mode: None,
            nics: None,
            cpu_policy: Default::default(),
            backend: Default::default(),
            source: vk_cocoon::runtime::CloneSource::Snapshot(snapshot.into()),
        })
        .await
        .unwrap()
}

/// A local Windows snapshot `name` (a cloud image booted with `--windows`, then saved).
pub async fn seed_windows_snapshot(env: &Env, name: &str) {
    env.sim.add_image("win11", "cloudimg").unwrap();
    let seed = env
        .runtime
        .run(&RunSpec {
            name: Some(format!("seed-{name}")),
            image: "win11".into(),
            windows: true,
            ..Default::default()
        })
        .await
        .unwrap();
    env.runtime.snapshot_save(name, &seed.id).await.unwrap();
    env.runtime.remove(&seed.id).await.unwrap();
}

pub async fn create(env: &Env, pod: &Pod) -> Pod {
    env.server.store().seed(pod).unwrap()
}

/// Merge-patches pod annotations as the operator does (`None` removes the key).
pub async fn annotate(env: &Env, name: &str, changes: &[(&str, Option<&str>)]) {
    let pods: kube::Api<Pod> = kube::Api::namespaced(env.server.client(), "default");
    let map: serde_json::Map<String, serde_json::Value> = changes
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
        .collect();
    let patch = serde_json::json!({"metadata": {"annotations": map}});
    pods.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
}

/// Kubelet-style delete (graceful: sets deletionTimestamp; the node finalizes).
pub async fn delete(env: &Env, name: &str) {
    let pods: kube::Api<Pod> = kube::Api::namespaced(env.server.client(), "default");
    pods.delete(name, &Default::default()).await.unwrap();
}

// ---- readiness, leases, history --------------------------------------------------------------

/// (status, message) of the pod's Ready condition.
pub fn ready_condition(env: &Env, name: &str) -> Option<(String, String)> {
    get(env, name)
        .and_then(|p| p.status)
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
        .map(|c| (c.status, c.message.unwrap_or_default()))
}

pub fn pod_ip(env: &Env, name: &str) -> Option<String> {
    get(env, name).and_then(|p| p.status).and_then(|s| s.pod_ip)
}

/// Writes cocoon-net's lease file: `(mac, ip)` pairs valid far into the future.
pub fn write_leases(env: &Env, leases: &[(&str, &str)]) {
    let rows: Vec<String> = leases
        .iter()
        .map(|(mac, ip)| format!(r#"{{"mac":"{mac}","ip":"{ip}","expiry":"2999-01-01T00:00:00Z"}}"#))
        .collect();
    let tmp = env.leases.with_extension("tmp");
    std::fs::write(&tmp, format!("[{}]", rows.join(","))).unwrap();
    std::fs::rename(&tmp, &env.leases).unwrap();
}

/// Every version of pod `name` the apiserver stored from now on (including its last state when
/// it is deleted), so a test can see a status that was published just before the object went.
/// The versions arrive through the store's change feed on a task of their own, so a test reads
/// them through the waiting accessors: a version the store already holds may not have reached
/// the recorder yet.
pub struct PodHistory {
    seen: Arc<Mutex<Vec<Pod>>>,
    /// The deletion of the object was recorded (no version comes after it).
    gone: Arc<AtomicBool>,
    /// Changes the recorder missed because it fell behind the feed (the history is then wrong).
    missed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl PodHistory {
    pub fn record(env: &Env, name: &str) -> Self {
        let mut rx = env.server.store().subscribe();
        let seen: Arc<Mutex<Vec<Pod>>> = Arc::default();
        let gone: Arc<AtomicBool> = Arc::default();
        let missed: Arc<AtomicU64> = Arc::default();
        let (out, done, lost, name) = (seen.clone(), gone.clone(), missed.clone(), name.to_string());
        let task = tokio::spawn(async move {
            loop {
                let msg = match rx.recv().await {
                    Ok(msg) => msg,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        lost.fetch_add(n, Ordering::SeqCst);
                        continue;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                let fake_apiserver::store::Broadcast::Change(change) = msg else {
                    continue;
                };
                if change.resource == fake_apiserver::resource::PODS
                    && change.object["metadata"]["name"] == name.as_str()
                    && let Ok(pod) = serde_json::from_value::<Pod>(change.object.clone())
                {
                    out.lock().unwrap().push(pod);
                    if change.kind == fake_apiserver::store::ChangeKind::Deleted {
                        done.store(true, Ordering::SeqCst);
                    }
                }
            }
        });
        Self {
            seen,
            gone,
            missed,
            task,
        }
    }

    pub fn versions(&self) -> Vec<Pod> {
        let missed = self.missed.load(Ordering::SeqCst);
        assert_eq!(
            missed, 0,
            "the pod history fell {missed} changes behind the store's feed"
        );
        self.seen.lock().unwrap().clone()
    }

    /// The first recorded version that satisfies `pred`, waiting for the recorder to see it.
    pub async fn first(&self, what: &str, pred: impl Fn(&Pod) -> bool) -> Pod {
        let found = || self.versions().into_iter().find(|p| pred(p));
        eventually(20, what, || found().is_some()).await;
        found().expect("just seen")
    }

    /// The last Failed status (reason, message) before the object went: waits until the
    /// recorder has seen the deletion, so no later version is missing.
    pub async fn final_failure(&self) -> Option<(String, String)> {
        eventually(20, "the pod history recorded the deletion", || {
            self.gone.load(Ordering::SeqCst)
        })
        .await;
        self.versions().into_iter().rev().find_map(|p| {
            let s = p.status?;
            (s.phase.as_deref() == Some("Failed"))
                .then(|| (s.reason.unwrap_or_default(), s.message.unwrap_or_default()))
        })
    }
}

impl Drop for PodHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How many times Event `reason` was recorded about pod `name` (Events are deduplicated into a
/// series: one object, a count).
pub fn event_count(env: &Env, name: &str, reason: &str) -> i32 {
    env.server
        .store()
        .list_as::<k8s_openapi::api::events::v1::Event>()
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name) && e.reason.as_deref() == Some(reason)
        })
        .map(|e| e.series.map(|s| s.count).unwrap_or(1))
        .sum()
}
