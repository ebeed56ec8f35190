//! The contract between the virtual node and whatever runs the pods (the cocoon provider, or a
//! test double): lifecycle hooks, the status it reports, and typed errors.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::future::Future;
use std::sync::Arc;

use super::reasons::EventReason;

/// How a provider operation failed; decides what the pod controller does next.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The provider knows nothing of this pod. A delete treats it as done.
    #[error("not found: {0}")]
    NotFound(String),
    /// The pod can never run here as it is (bad annotations, CPU-class mismatch, ...). Not retried;
    /// the pod is published as Failed with this reason and message.
    #[error("rejected ({reason}): {message}")]
    Rejected { reason: EventReason, message: String },
    /// Anything that may work later (runtime or registry unavailable, ...). Retried with backoff.
    #[error("transient: {0}")]
    Transient(String),
    /// The pod waits for an operator to act outside it (delete a tag, classify the node): left
    /// as it is with a Warning Event of this reason, and tried again at the slowest retry pace,
    /// or at once when the pod changes.
    #[error("needs an operator ({reason}): {message}")]
    NeedsOperator { reason: EventReason, message: String },
}

impl ProviderError {
    /// Convenience constructor for [`ProviderError::Transient`].
    pub fn transient(e: impl std::fmt::Display) -> Self {
        Self::Transient(e.to_string())
    }
}

/// What a provider operation that did its part asks of the pod controller next (kube-runtime's
/// `Action`): nothing until the pod changes, or to be asked again — [`Provider::requeue_pod`] —
/// after the next wait of a schedule. The pod controller owns the waiting: the provider never
/// sleeps to retry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Next {
    Done,
    Requeue(crate::retry::Schedule),
}

/// Pod phase as the provider sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPhase {
    Pending,
    Running,
    Succeeded,
    Failed,
}

impl PodPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// State of the single container status `agent` that stands for the VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentState {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Option<Time>,
    },
    Terminated {
        exit_code: i32,
        reason: String,
        message: Option<String>,
    },
}

/// What the provider reports for one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderPodStatus {
    pub phase: PodPhase,
    /// Pod-level reason/message (e.g. `VMGone` on eviction).
    pub reason: Option<String>,
    pub message: Option<String>,
    pub pod_ip: Option<String>,
    /// Ready condition (probe ∧ lifecycle).
    pub ready: bool,
    /// Message of the Ready condition (the probe's).
    pub ready_message: Option<String>,
    pub start_time: Option<Time>,
    /// `containerID` of the agent status, e.g. `cocoon://<vm id>`.
    pub container_id: Option<String>,
    pub agent: AgentState,
}

impl ProviderPodStatus {
    /// Nothing runs yet.
    pub fn pending(reason: &str, message: Option<String>) -> Self {
        Self {
            phase: PodPhase::Pending,
            reason: None,
            message: None,
            pod_ip: None,
            ready: false,
            ready_message: message.clone(),
            start_time: None,
            container_id: None,
            agent: AgentState::Waiting {
                reason: reason.into(),
                message,
            },
        }
    }

    /// The pod can never run: Failed with this reason (also the agent's termination reason).
    pub fn failed(reason: &str, message: &str) -> Self {
        Self {
            phase: PodPhase::Failed,
            reason: Some(reason.into()),
            message: Some(message.into()),
            pod_ip: None,
            ready: false,
            ready_message: Some(message.into()),
            start_time: None,
            container_id: None,
            agent: AgentState::Terminated {
                exit_code: 1,
                reason: reason.into(),
                message: Some(message.into()),
            },
        }
    }

    /// The default terminal status published after a completed provider delete.
    pub fn deleted() -> Self {
        Self {
            phase: PodPhase::Succeeded,
            reason: None,
            message: None,
            pod_ip: None,
            ready: false,
            ready_message: Some("pod deleted".into()),
            start_time: None,
            container_id: None,
            agent: AgentState::Terminated {
                exit_code: 0,
                reason: "Completed".into(),
                message: None,
            },
        }
    }
}

/// The provider of a virtual node. Every hook may be called more than once for the same pod
/// (restarts, retries) and must be idempotent. The virtual node never runs two hooks for the same
/// pod at once; hooks for different pods run concurrently (bounded by `Timings::workers`).
///
/// Pods come shared, as the core holds them: a provider that keeps one clones the `Arc`, not
/// the object, so each tracked pod is in memory once.
pub trait Provider: Send + Sync + 'static {
    /// Startup: every pod currently bound to this node, before the node is registered or its
    /// lease renewed. An error is fatal — the node never registers.
    fn reconcile(&self, pods: &[Arc<Pod>]) -> impl Future<Output = Result<(), ProviderError>> + Send;

    /// A pod bound to this node that the provider has not run yet.
    fn create_pod(&self, pod: &Arc<Pod>) -> impl Future<Output = Result<Next, ProviderError>> + Send;

    /// The pod object changed (spec, labels or annotations) after a successful create.
    fn update_pod(&self, pod: &Arc<Pod>) -> impl Future<Output = Result<Next, ProviderError>> + Send;

    /// The provider asked to be asked again ([`Next::Requeue`] or the notifier's requeue): bring
    /// the pod closer to what it wants (retry a failed transition, an eviction, a recheck).
    fn requeue_pod(&self, pod: &Arc<Pod>) -> impl Future<Output = Result<Next, ProviderError>> + Send {
        let _ = pod;
        async { Ok(Next::Done) }
    }

    /// The pod is being deleted (deletionTimestamp set, or the object is gone). Only when this
    /// returns Ok (or NotFound) is the terminal status published and the object removed.
    fn delete_pod(&self, pod: &Arc<Pod>) -> impl Future<Output = Result<(), ProviderError>> + Send;

    /// A version of a pod came in on the watch, before the core decides what it needs. A provider
    /// that keeps pods can share this object in place of an older version it holds (its own
    /// writes echoed), so that each pod is in memory once. Called inline on the watch: no I/O.
    fn observed(&self, pod: &Arc<Pod>) {
        let _ = pod;
    }

    /// The provider's current view of the pod; `None` when it does not know the pod.
    fn pod_status(
        &self,
        pod: &Arc<Pod>,
    ) -> impl Future<Output = Result<Option<ProviderPodStatus>, ProviderError>> + Send;
}
