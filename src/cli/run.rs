//! `vk-cocoon run`: the node daemon. Takes its settings ([`RunArgs`]), builds the
//! policies (defaults, then the operator's components, watched for hot reload), the cocoon
//! runtime, the optional registry, the provider, the peer snapshot tier and the `/metrics`
//! server, then runs the virtual node until SIGINT or SIGTERM.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use clap::Args;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use vk_cocoon::kubelet::config::KubeletArgs;
use vk_cocoon::kubelet::events::EventSink;
use vk_cocoon::kubelet::{KubeletConfig, VirtualNode};
use vk_cocoon::kubelet_api::auth::Auth;
use vk_cocoon::kubelet_api::config::ApiArgs;
use vk_cocoon::kubelet_api::streaming::{Streaming, StreamingArgs, StreamingConfig};
use vk_cocoon::kubelet_api::tls::ca_file;
use vk_cocoon::kubelet_api::tls::manager::{CertManager, CertTimings};
use vk_cocoon::kubelet_api::tls::{CertSlot, TlsSource};
use vk_cocoon::kubelet_api::{ApiConfig, ApiMetrics, ApiState, KubeletApi};
use vk_cocoon::listener::{ListenerArgs, Which};
use vk_cocoon::peer::{
    KubeNodes, PeerArgs, PeerClient, PeerConfig, PeerIdentity, PeerMetrics, PeerServer, PeerTier, PeerTls, Staging,
    Timeouts,
};
use vk_cocoon::policy::config::{PolicyArgs, PolicyConfig};
use vk_cocoon::policy::decision_log::{DecisionLog, DecisionLogArgs, LogTarget};
use vk_cocoon::policy::reload::PolicyReloader;
use vk_cocoon::policy::{CompileCache, Policies, PolicyEngine, PolicyMetrics};
use vk_cocoon::provider::cocoon_net::{CocoonNetArgs, LeaseFile};
use vk_cocoon::provider::config::ProviderArgs;
use vk_cocoon::provider::metrics::{self, MetricsArgs, ProviderMetrics};
use vk_cocoon::provider::ports::{KubePodPatcher, LeaseReleaser, SnapshotRegistry};
use vk_cocoon::provider::probe::{NetProber, Prober};
use vk_cocoon::provider::probe_scope::{GuestNetworks, ProbeArgs, ScopedProber};
use vk_cocoon::provider::{CocoonProvider, Ports, ProviderConfig};
use vk_cocoon::registry::config::RegistryArgs;
use vk_cocoon::registry::{Registry, RegistryConfig};
use vk_cocoon::runtime::config::CocoonArgs;
use vk_cocoon::runtime::version::{self, Reported};
use vk_cocoon::runtime::{CocoonCli, CocoonCliConfig, CocoonRuntime};
use vk_cocoon::stats::collector::VmCollector;
use vk_cocoon::stats::paths::PathsArgs;
use vk_cocoon::stats::sample::{SAMPLE_INTERVAL, SAMPLE_TTL};
use vk_cocoon::stats::{HostPaths, Sampler};

use super::shutdown::{self, Phases, ShutdownArgs};

/// `vk-cocoon run`: the settings of every concern, each declared by its owner (every variable with
/// its default: `deploy/vk-cocoon.env.example`).
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    node: KubeletArgs,
    #[command(flatten)]
    cocoon: CocoonArgs,
    #[command(flatten)]
    cocoon_net: CocoonNetArgs,
    #[command(flatten)]
    provider: ProviderArgs,
    #[command(flatten)]
    probes: ProbeArgs,
    #[command(flatten)]
    registry: RegistryArgs,
    #[command(flatten)]
    peer: PeerArgs,
    #[command(flatten)]
    api: ApiArgs,
    #[command(flatten)]
    streaming: StreamingArgs,
    #[command(flatten)]
    paths: PathsArgs,
    #[command(flatten)]
    metrics: MetricsArgs,
    #[command(flatten)]
    listeners: ListenerArgs,
    #[command(flatten)]
    policies: PolicyArgs,
    #[command(flatten)]
    decision_log: DecisionLogArgs,
    #[command(flatten)]
    shutdown: ShutdownArgs,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let result = runtime.block_on(daemon(args));
    // Tasks the shutdown gave up on are dropped here; a blocking call still running (a policy
    // decision, a file read) is not waited for beyond this.
    runtime.shutdown_timeout(shutdown::RUNTIME_EXIT);
    result
}

async fn daemon(args: RunArgs) -> anyhow::Result<ExitCode> {
    // Both rustls providers are compiled in; kube needs one chosen before the first client.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let root_dir = args.cocoon.root.root_dir.clone();
    let kubelet = KubeletConfig::from_args(&args.node, root_dir.clone());
    let api_cfg = ApiConfig::from_args(&args.api, kubelet.kubelet_port).map_err(|e| anyhow!("{e}"))?;
    let paths = HostPaths::from_args(&args.paths, &root_dir);
    let guest_networks = GuestNetworks::from_settings(args.probes.probe_networks.clone(), &args.cocoon_net.leases_path);
    let mut provider_cfg = ProviderConfig::from_args(
        &args.provider,
        &kubelet.node_name,
        kubelet.snapshot_cpu_class.as_deref(),
        &root_dir,
        guest_networks,
        vk_cocoon::provider::probe_scope::network_mode(args.cocoon_net.network_mode, &args.cocoon_net.leases_path),
    );
    provider_cfg.run_dir = paths.run_dir.clone();
    let peer_cfg = PeerConfig::from_args(&args.peer, &root_dir).map_err(|e| anyhow!("{e}"))?;
    let registry_cfg = RegistryConfig::from_args(&args.registry).map_err(|e| anyhow!("{e}"))?;
    // Before anything is loaded or registered: a cocoon that predates the daemon's verbs fails
    // every clone, so it stops the start.
    let cocoon = CocoonCli::new(CocoonCliConfig::from_args(&args.cocoon));
    match version::check(&cocoon).await.map_err(|e| anyhow!("{e}"))? {
        Reported::Release(found) => tracing::info!(%found, minimum = %version::MINIMUM, "cocoon version"),
        Reported::Unnumbered(reported) => tracing::warn!(
            %reported,
            minimum = %version::MINIMUM,
            "cocoon reports no release number (a build without release metadata): the version floor cannot be checked"
        ),
    }
    let prometheus = prometheus::Registry::new();

    // Policies: built-in defaults, then the operator's components (a bad one is fatal at start).
    let policy_cfg = PolicyConfig::from_args(&args.policies).map_err(|e| anyhow!("policy configuration: {e}"))?;
    let engine = PolicyEngine::new(policy_cfg.limits).map_err(|e| anyhow!("cannot start the wasm engine: {e:#}"))?;
    // The compile worker is this binary. `/proc/self/exe` names the running file even after an
    // upgrade has replaced it on disk, so the worker is always this very build.
    let engine = engine.compile_in_worker(std::path::PathBuf::from("/proc/self/exe"), policy_cfg.compile);
    let policy_metrics = PolicyMetrics::register(&prometheus).context("registering the policy metrics")?;
    let decision_log = match LogTarget::from_args(&args.decision_log) {
        None => None,
        Some(target) => {
            tracing::info!(?target, "logging every policy decision (VK_DECISION_LOG)");
            Some(DecisionLog::open(target.clone()).with_context(|| format!("opening the decision log {target:?}"))?)
        }
    };
    let policies = Arc::new(
        Policies::with_defaults(
            engine,
            policy_cfg.cache_dir.clone().map(CompileCache::new),
            policy_metrics,
        )
        .map_err(|e| anyhow!("loading the built-in policies: {e}"))?
        .with_decision_log(decision_log),
    );
    let policy_board = policies.status().clone();
    let reloader = Arc::new(PolicyReloader::from_config(policies.clone(), &policy_cfg));
    // Registry sources are fetched with blocking I/O of their own: off the async workers.
    let loading = reloader.clone();
    tokio::task::spawn_blocking(move || loading.load_all())
        .await
        .context("the policy loading task")?
        .map_err(|e| anyhow!("loading the configured policies: {e}"))?;
    let _watcher = if policy_cfg.slots.is_empty() && policy_cfg.file.is_none() {
        None
    } else {
        Some(reloader.clone().watch().context("watching the policy files")?)
    };

    let client = kube::Client::try_default()
        .await
        .context("building the Kubernetes client (KUBECONFIG or in-cluster)")?;
    let runtime: Arc<dyn CocoonRuntime> = Arc::new(cocoon);
    let registry: Option<Arc<dyn SnapshotRegistry>> = match registry_cfg {
        Some(cfg) => Some(Arc::new(
            Registry::new(cfg, kubelet.node_name.clone()).map_err(|e| anyhow!("registry: {e}"))?,
        )),
        None => {
            tracing::warn!("OCI_REGISTRY is not set: registry-less mode (no snapshot push or pull)");
            None
        }
    };
    let releaser: Option<Arc<dyn LeaseReleaser>> = args
        .cocoon_net
        .control_socket()
        .map(|socket| Arc::new(socket) as Arc<dyn LeaseReleaser>);
    let streaming_cfg = StreamingConfig::from_args(&args.streaming);
    // The provider hands probes and port-forward only addresses in the guest networks
    // (ProviderConfig::guest_networks); with VK_PROBE_NETWORKS set, the prober itself refuses
    // anything outside the list as well.
    let prober: Arc<dyn Prober> = match args.probes.probe_networks.clone() {
        Some(networks) => {
            tracing::info!(%networks, "readiness probes are limited to these networks");
            Arc::new(ScopedProber::new(Arc::new(NetProber::default()), networks))
        }
        None => Arc::new(NetProber::default()),
    };
    let peer_registry = registry.clone();
    let macos_cfg = vk_cocoon::runtime::macos::MacosCliConfig::from_args(&args.cocoon);
    tracing::info!(bin = %macos_cfg.bin.display(), "cocoon-macos CLI for os=macos pods");
    let events = EventSink::new(client.clone(), &kubelet.node_name);
    let ports = Ports {
        runtime: runtime.clone(),
        macos: Arc::new(vk_cocoon::runtime::macos::MacosCli::new(macos_cfg)),
        registry,
        leases: Arc::new(LeaseFile::new(args.cocoon_net.leases_path.clone())),
        releaser,
        patcher: Arc::new(KubePodPatcher::new(client.clone())),
        events: Arc::new(events.clone()),
        prober,
    };
    let provider_metrics = ProviderMetrics::register(&prometheus).context("registering the provider metrics")?;
    let provider =
        CocoonProvider::new(provider_cfg, ports, policies.clone(), provider_metrics).map_err(|e| anyhow!("{e}"))?;
    let node_name = kubelet.node_name.clone();
    let api_tls = api_cfg.tls.clone();
    let node = VirtualNode::measured(client.clone(), kubelet, provider.clone())
        .map_err(|e| anyhow!("{e}"))?
        .with_policy_status(policy_board);
    // The kubelet API's serving certificate, shown on the Node while a CSR waits for approval.
    let (cert_status, cert_watch) = tokio::sync::watch::channel(None);
    let node = node.with_serving_cert_status(cert_watch);
    provider.set_notifier(Arc::new(node.notifier()));

    // One stats sample (cached 2 s) serves /metrics (cocoon_vk_vm_*), /stats/summary and
    // /metrics/resource.
    let sampler = Sampler::new(paths.clone(), provider.clone(), SAMPLE_TTL);
    prometheus
        .register(Box::new(
            VmCollector::new(sampler.clone()).context("the VM stats collector")?,
        ))
        .context("registering the VM stats collector")?;
    // Who owns the daemon's tasks, by the shutdown phase that stops them (`shutdown.rs`).
    let phases = Phases::new(args.shutdown.shutdown_deadline);
    let (background, listeners, node_tasks) = (TaskTracker::new(), TaskTracker::new(), TaskTracker::new());
    let shutdown = phases.listeners.clone();
    // Sampled on a schedule as well: every Summary has a recent sample to rate its CPU against.
    let sampling = sampler.keep_fresh(SAMPLE_INTERVAL, phases.background.clone());
    background.spawn(sampling);
    // The peer tier starts after the kubelet API: it presents the API's serving certificate.
    let (peer_runtime, peer_client, peer_kube) = (runtime.clone(), client.clone(), client.clone());
    let api = KubeletApi {
        config: api_cfg,
        node_ip: node.node_ip(),
        client: client.clone(),
        state: Arc::new(ApiState {
            node_name: node_name.clone(),
            pods: provider.clone(),
            runtime,
            sampler,
            paths,
            metrics: ApiMetrics::register(&prometheus).context("registering the kubelet API metrics")?,
            streaming: Streaming::new(streaming_cfg),
            shutdown: shutdown.clone(),
        }),
        auth: Arc::new(Auth::kube(&node_name, client)),
        cert_timings: CertTimings::default(),
        cert_status: Some(cert_status),
        limits: args.listeners.limits(Which::KubeletApi),
    };
    let kubelet_api = api.start(shutdown.clone()).await.map_err(|e| anyhow!("{e}"))?;
    tracing::info!(addr = %kubelet_api.addr, "kubelet API listening (serving once its certificate is ready)");
    let peer_identity = peer_identity(
        &peer_cfg,
        &api_tls,
        kubelet_api.cert.clone(),
        &node_name,
        peer_client,
        &shutdown,
        &listeners,
    )
    .await?;
    let peer_server = peer_tier(
        &peer_cfg,
        &provider,
        &prometheus,
        &node_name,
        peer_runtime,
        peer_registry,
        peer_kube,
        peer_identity,
        &background,
    )?;
    let addr = args.metrics.metrics_addr;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics listener on {addr}"))?;
    tracing::info!(%addr, "serving /metrics");
    let metrics_listener = metrics::listener(args.listeners.limits(Which::Metrics));
    listeners.spawn(kubelet_api.task);
    listeners.spawn(metrics::serve(listener, metrics_listener, prometheus, shutdown.clone()));
    if let Some((server, tls)) = peer_server {
        let listener = tokio::net::TcpListener::bind(peer_cfg.listen)
            .await
            .with_context(|| format!("binding the peer snapshot listener VK_PEER_ADDR={}", peer_cfg.listen))?;
        tracing::info!(addr = %peer_cfg.listen, "serving hibernated snapshots to peers over mutual TLS");
        let peer_listener = PeerServer::listener(&tls, args.listeners.limits(Which::Peer));
        listeners.spawn(server.serve(listener, peer_listener, shutdown.clone()));
        // A rotated peer CA is trusted from the next connection on, both ways.
        if let Some((file, _)) = &peer_cfg.ca {
            listeners.spawn(tls.follow_ca_file(file.clone(), ca_file::CHECK_EVERY, shutdown.clone()));
        }
    }
    background.spawn(provider.clone().run_background(phases.background.clone()));

    provider.prefetch_vms();
    let node_run = node_tasks.spawn(node.run_until(phases.node.clone()));
    let result = until_stopped(&phases, node_run, [background, listeners, node_tasks], &events).await;
    // The decisions of the last moments are in the decision log before the process ends.
    policies.flush_decision_log();
    match result {
        Some(Ok(Ok(()))) | None => Ok(ExitCode::SUCCESS),
        Some(Ok(Err(e))) => Err(anyhow!("{e}")),
        Some(Err(e)) => Err(anyhow!("the virtual node's task: {e}")),
    }
}

type NodeRun = tokio::task::JoinHandle<Result<(), vk_cocoon::kubelet::KubeletError>>;

/// Runs until SIGTERM or SIGINT (or the node stopping by itself), then stops in order
/// (`shutdown.rs`): the node's drain, then the `[background, listeners, node]` owners' tasks,
/// then the provider's last Events. The node's result, `None` when it had not ended by the
/// deadline.
async fn until_stopped(
    phases: &Phases,
    mut node_run: NodeRun,
    [background, listeners, node]: [TaskTracker; 3],
    events: &EventSink,
) -> Option<Result<Result<(), vk_cocoon::kubelet::KubeletError>, tokio::task::JoinError>> {
    let stopped = tokio::select! {
        signal = shutdown::signalled() => match signal {
            Some(signal) => {
                tracing::info!(signal, deadline = ?phases.deadline(), "shutting down");
                None
            }
            // Nothing to listen for: the node runs until it stops by itself.
            None => Some((&mut node_run).await),
        },
        result = &mut node_run => Some(result),
    };
    let end = phases.drain(tokio::time::Instant::now()).await;
    phases
        .finish(
            end,
            [
                ("background", &phases.background, background),
                ("listeners", &phases.listeners, listeners),
                ("heartbeats", &phases.node.heartbeats, node),
            ],
        )
        .await;
    // The provider's Events of the last moments (a drained hibernate's) are published.
    if tokio::time::timeout_at(end, events.flushed()).await.is_err() {
        tracing::warn!("shutdown deadline: not waiting for the Events still being published");
    }
    match stopped {
        Some(result) => Some(result),
        None if node_run.is_finished() => Some(node_run.await),
        None => None,
    }
}

/// This node's certificate on the peer tier: the kubelet API's serving certificate (not a
/// self-signed one: no peer could verify it), or the operator's `VK_PEER_TLS_CERT`/`KEY`, kept
/// current by a manager of their own. `None`: nothing to present.
async fn peer_identity(
    cfg: &PeerConfig,
    api_tls: &TlsSource,
    kubelet_cert: Arc<CertSlot>,
    node_name: &str,
    client: kube::Client,
    shutdown: &CancellationToken,
    tasks: &TaskTracker,
) -> anyhow::Result<Option<Arc<CertSlot>>> {
    match &cfg.identity {
        PeerIdentity::KubeletServing if *api_tls == TlsSource::SelfSigned => Ok(None),
        PeerIdentity::KubeletServing => Ok(Some(kubelet_cert)),
        PeerIdentity::Files { cert, key } => {
            let slot = Arc::new(CertSlot::default());
            let manager = CertManager {
                source: TlsSource::Files {
                    cert: cert.clone(),
                    key: key.clone(),
                },
                node_name: node_name.to_string(),
                ips: Vec::new(),
                client,
                slot: slot.clone(),
                timings: CertTimings::default(),
                status: None,
            };
            let first = manager.obtain(shutdown).await.map_err(|e| {
                anyhow!(
                    "VK_PEER_TLS_CERT={} / VK_PEER_TLS_KEY={}: {e}",
                    cert.display(),
                    key.display()
                )
            })?;
            tasks.spawn(manager.run(first, shutdown.clone()));
            Ok(Some(slot))
        }
    }
}

/// The peer snapshot tier: the staging directory is swept in the background; with a peer token,
/// a registry, the peers' CA and a certificate of this node, wakes may restore from the
/// `from-node` peer and the returned server hands this node's hibernated snapshots to peers,
/// both over mutual TLS. Without any of them both are off (said once): never plain HTTP. The
/// sweep is a task of `tasks`.
#[allow(clippy::too_many_arguments)]
fn peer_tier(
    cfg: &PeerConfig,
    provider: &Arc<CocoonProvider>,
    prometheus: &prometheus::Registry,
    node_name: &str,
    runtime: Arc<dyn CocoonRuntime>,
    registry: Option<Arc<dyn SnapshotRegistry>>,
    client: kube::Client,
    identity: Option<Arc<CertSlot>>,
    tasks: &TaskTracker,
) -> anyhow::Result<Option<(Arc<PeerServer>, PeerTls)>> {
    let staging = Staging::new(cfg.staging_dir.clone());
    let sweeping = staging.clone();
    tasks.spawn_blocking(move || match sweeping.sweep() {
        Ok(n) => tracing::info!(dir = %sweeping.root().display(), removed = n, "staging directory swept"),
        Err(error) => tracing::warn!(dir = %sweeping.root().display(), %error, "sweeping the staging directory failed"),
    });
    let (Some(token), Some(registry), Some(ca), Some(identity)) = (
        cfg.token.clone(),
        registry.clone(),
        cfg.ca.as_ref().map(|(_, roots)| roots.clone()),
        identity.clone(),
    ) else {
        let missing = cfg.missing(registry.is_some(), identity.is_some());
        tracing::warn!(
            missing = %missing.join(", "),
            "peer snapshot tier off: it runs only over mutual TLS with a token and checks copies against the registry; wakes restore from a local snapshot or the registry"
        );
        return Ok(None);
    };
    let tls = PeerTls::new(identity, ca).map_err(|e| anyhow!("{e}"))?;
    let metrics = PeerMetrics::register(prometheus).context("registering the peer metrics")?;
    provider.set_peer_tier(Arc::new(PeerTier {
        client: PeerClient::new(token.clone(), &tls, staging, Timeouts::default()),
        nodes: Arc::new(KubeNodes::new(client)),
        port: cfg.listen.port(),
        metrics,
    }));
    let server = PeerServer::new(
        node_name.to_string(),
        runtime,
        registry,
        cfg.snapshot_dir.clone(),
        token,
        vk_cocoon::peer::server::MAX_STREAMS,
    );
    Ok(Some((server, tls)))
}
