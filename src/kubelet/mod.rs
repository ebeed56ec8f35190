//! The virtual node towards the Kubernetes API (issue 5): node registration and status, the
//! heartbeat Lease, the pod watch feeding a [`Provider`], and pod status publication.
//!
//! Layout — decisions are pure, I/O sits at the edges:
//! * [`config`]: environment parsing and validation; [`quantity`]: resource quantities;
//! * [`capacity`]: host measurement; [`node`]: the Node object (pure); [`registration`]: its I/O;
//! * [`policy_status`]: the node's policies on the Node (annotations, `PolicyReady`, Events);
//! * [`serving_cert`]: the kubelet API's serving certificate on the Node (`KubeletServingCertificate`,
//!   Events): a CSR waiting for approval is named with the command to run;
//! * [`lease`]: the Lease; [`status`]: pod status construction and uid-conditioned writes;
//! * [`pods`]: the pod controller's sans-I/O core; `controller`: its driver;
//! * [`preflight`]: the RBAC check at startup; [`provider`]: the trait the cocoon provider implements.
//!
//! Startup order ([`VirtualNode::run`]): RBAC preflight (a missing permission is fatal) → list this
//! node's pods → [`Provider::reconcile`] (an error is fatal: the node never registers) → register
//! the node → lease + status loops → pod watch.

pub mod capacity;
pub mod config;
mod controller;
pub mod events;
pub mod keys;
pub mod lease;
pub mod node;
pub mod pod_copy;
pub mod pods;
pub mod policy_status;
pub mod preflight;
pub mod provider;
pub mod quantity;
pub mod reasons;
pub mod registration;
pub mod serving_cert;
pub mod status;

pub use capacity::{HostResources, MeasureError, measure_host};
pub use config::{ConfigError, KubeletConfig, Timings};
pub use controller::{Notifier, Stopping};
pub use keys::{PodKey, Uid};
pub use provider::{AgentState, Next, PodPhase, Provider, ProviderError, ProviderPodStatus};
pub use reasons::{EventReason, EventType};

use controller::PodController;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::Client;
use kube::api::{Api, ListParams};
use registration::NodeIdentity;
use std::net::IpAddr;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why the virtual node stopped.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error(transparent)]
    Preflight(#[from] preflight::PreflightError),
    #[error(
        "startup: listing the pods bound to node {node}: {source}; check the apiserver connection and RBAC (pods list)"
    )]
    ListPods { node: String, source: kube::Error },
    #[error("startup reconcile failed, the node {node} is not registered: {source}")]
    StartupReconcile { node: String, source: ProviderError },
    #[error("measuring the host: {0}")]
    Measure(#[from] MeasureError),
}

/// One virtual node.
pub struct VirtualNode<P: Provider> {
    client: Client,
    config: KubeletConfig,
    node_ip: IpAddr,
    host: HostResources,
    provider: Arc<P>,
    tx: mpsc::UnboundedSender<pods::Input>,
    rx: mpsc::UnboundedReceiver<pods::Input>,
    notifier: Notifier,
    policies: Option<Arc<crate::policy::status::StatusBoard>>,
    serving_cert: Option<ServingCertWatch>,
}

/// The kubelet API's serving-certificate status, as the Node publishes it.
pub type ServingCertWatch = tokio::sync::watch::Receiver<Option<serving_cert::ServingCertStatus>>;

impl<P: Provider> VirtualNode<P> {
    /// A node with already measured host resources and IP (tests inject both).
    pub fn new(client: Client, config: KubeletConfig, host: HostResources, node_ip: IpAddr, provider: Arc<P>) -> Self {
        let (tx, rx, notifier) = controller::channel();
        Self {
            client,
            config,
            node_ip,
            host,
            provider,
            tx,
            rx,
            notifier,
            policies: None,
            serving_cert: None,
        }
    }

    /// Publishes the kubelet API's serving-certificate status on the Node: the
    /// `KubeletServingCertificate` condition and Events.
    pub fn with_serving_cert_status(mut self, status: ServingCertWatch) -> Self {
        self.serving_cert = Some(status);
        self
    }

    /// Publishes `board` (the node's policies) on the Node: annotations, `PolicyReady`, Events.
    pub fn with_policy_status(mut self, board: Arc<crate::policy::status::StatusBoard>) -> Self {
        self.policies = Some(board);
        self
    }

    /// Measures the host (`/proc/meminfo`, `statvfs(COCOON_ROOT_DIR)`) and resolves the node IP
    /// (`VK_NODE_IP` or the first non-loopback IPv4).
    pub fn measured(client: Client, config: KubeletConfig, provider: Arc<P>) -> Result<Self, KubeletError> {
        let host = measure_host(&config.root_dir)?;
        let node_ip = match config.node_ip {
            Some(ip) => ip,
            None => capacity::detect_node_ip()?,
        };
        Ok(Self::new(client, config, host, node_ip, provider))
    }

    /// The node's address (`InternalIP`; the kubelet API binds to it by default).
    pub fn node_ip(&self) -> IpAddr {
        self.node_ip
    }

    /// The handle the provider uses to push status changes.
    pub fn notifier(&self) -> Notifier {
        self.notifier.clone()
    }

    /// The Node resources this node will publish.
    pub fn resources(&self) -> node::NodeResources {
        node::node_resources(
            &self.host,
            &self.config.overrides,
            self.config.max_pods,
            self.config.reserve_percent,
        )
    }

    /// RBAC preflight, startup reconcile, node registration, then lease, status refresh and the pod
    /// controller until `shutdown`, which stops everything at once (the operations in flight are
    /// abandoned). Returns an error only for fatal startup failures.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), KubeletError> {
        self.run_until(NodeStop::at_once(shutdown)).await
    }

    /// [`Self::run`], stopped in order: `stop.pods.ops` ends the pod controller's intake, its
    /// operations in flight then run to their end or to `stop.pods.abandon`; the node says so
    /// with `stop.drained` and keeps its lease and status until `stop.heartbeats` (the node
    /// stays Ready while the rest of the daemon stops).
    pub async fn run_until(self, stop: NodeStop) -> Result<(), KubeletError> {
        let shutdown = stop.pods.ops.clone();
        // Whichever way this returns, the caller learns that no pod operation runs any more.
        let _drained = stop.drained.clone().drop_guard();
        let node_name = self.config.node_name.clone();
        let timings = self.config.timings.clone();

        // 0. Every permission granted, before anything is written.
        preflight::check(&self.client, &node_name).await?;

        // 1. Startup reconcile, before the node exists or is renewed.
        let pods: Api<Pod> = Api::all(self.client.clone());
        let listed = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
            .await
            .map_err(|source| KubeletError::ListPods {
                node: node_name.clone(),
                source,
            })?;
        tracing::info!(node = %node_name, pods = listed.items.len(), "startup reconcile");
        let listed: Vec<Arc<Pod>> = listed.items.into_iter().map(pod_copy::keep).collect();
        self.provider
            .reconcile(&listed)
            .await
            .map_err(|source| KubeletError::StartupReconcile {
                node: node_name.clone(),
                source,
            })?;

        // 2. Register the node.
        let identity = NodeIdentity {
            config: self.config.clone(),
            node_ip: self.node_ip,
            resources: self.resources(),
            policies: self.policies.clone(),
            serving_cert: self.serving_cert.clone(),
        };
        let nodes: Api<Node> = Api::all(self.client.clone());
        let Some(node) =
            registration::register_with_retry(&nodes, &identity, timings.retry_base, timings.retry_max, &shutdown)
                .await
        else {
            return Ok(());
        };

        // 3. Heartbeats and the pod controller.
        // The kubelet's node reference: the uid is the node's name, which is what
        // `kubectl describe node` searches Events by.
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node_name.clone()),
            uid: Some(node_name.clone()),
            ..Default::default()
        };
        // The node's heartbeats: its lease, status and condition publishers, stopped last.
        let heartbeats = TaskTracker::new();
        // Each publisher records Events through a sink of its own; the stop flushes them all.
        let sink = || events::EventSink::new(self.client.clone(), &node_name);
        let sinks = [sink(), sink(), sink()];
        if let Some(board) = self.policies.clone() {
            heartbeats.spawn(policy_status::publish(
                nodes.clone(),
                identity.clone(),
                reference.clone(),
                board,
                sinks[0].clone(),
                stop.heartbeats.clone(),
            ));
        }
        if let Some(status) = self.serving_cert.clone() {
            heartbeats.spawn(serving_cert::publish(
                nodes.clone(),
                identity.clone(),
                reference,
                status,
                sinks[1].clone(),
                stop.heartbeats.clone(),
            ));
        }
        heartbeats.spawn(lease::run(
            self.client.clone(),
            node,
            timings.clone(),
            stop.heartbeats.clone(),
        ));
        heartbeats.spawn(registration::run_status_loop(
            nodes,
            identity,
            timings.node_status,
            stop.heartbeats.clone(),
        ));
        let controller = PodController {
            client: self.client.clone(),
            provider: self.provider.clone(),
            node_name: node_name.clone(),
            events: sinks[2].clone(),
            timings,
            tx: self.tx,
            rx: self.rx,
        };
        controller.run(stop.pods.clone()).await;
        stop.drained.cancel();
        heartbeats.close();
        heartbeats.wait().await;
        // The Events of the last moments (a drained operation's, the node's) are published
        // before the node reports stopped (the daemon bounds this wait by its deadline).
        futures::future::join_all(sinks.iter().map(events::EventSink::flushed)).await;
        tracing::info!(node = %node_name, "virtual node stopped");
        Ok(())
    }
}

/// How a [`VirtualNode`] is stopped, in order: the pod controller ([`Stopping`]), then, once the
/// node cancelled `drained`, its heartbeats at `heartbeats`.
#[derive(Clone, Debug, Default)]
pub struct NodeStop {
    pub pods: Stopping,
    /// Cancelled by the node: no pod operation runs any more.
    pub drained: CancellationToken,
    /// Stops the lease, the node status and the condition publishers.
    pub heartbeats: CancellationToken,
}

impl NodeStop {
    /// Everything stops at `token` (operations in flight abandoned).
    pub fn at_once(token: CancellationToken) -> Self {
        Self {
            pods: Stopping::at_once(token.clone()),
            drained: CancellationToken::new(),
            heartbeats: token,
        }
    }
}
