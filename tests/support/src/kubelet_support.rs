//! Shared helpers of the kubelet integration tests: a recording provider, short timings, polling.

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::ResourceExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use vk_cocoon::kubelet::{
    AgentState, EventReason, HostResources, KubeletConfig, Next, PodPhase, Provider, ProviderError, ProviderPodStatus,
    Timings, VirtualNode,
};

pub const NODE: &str = "vk-test";

/// One provider call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub op: &'static str,
    pub key: String,
    pub uid: String,
}

/// A provider that records every call, with knobs to fail, reject or block.
#[derive(Default)]
pub struct RecordingProvider {
    pub calls: Mutex<Vec<Call>>,
    pub reconciled: Mutex<Option<Vec<String>>>,
    pub reconcile_error: Mutex<Option<ProviderError>>,
    /// Fail this many creates transiently before succeeding.
    pub transient_create_failures: AtomicU32,
    /// Reject creates of pods with this name.
    pub reject_name: Mutex<Option<String>>,
    /// When set, delete_pod waits for a permit.
    pub delete_gate: Mutex<Option<Arc<Semaphore>>>,
    /// When set, pod_status records `status_gated` and waits for a permit.
    pub status_gate: Mutex<Option<Arc<Semaphore>>>,
    /// uid → running
    running: Mutex<HashMap<String, u32>>,
    next_ip: AtomicU32,
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

impl RecordingProvider {
    fn record(&self, op: &'static str, pod: &Pod) {
        self.calls.lock().unwrap().push(Call {
            op,
            key: key(pod),
            uid: pod.uid().unwrap_or_default(),
        });
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn count(&self, op: &str, uid: &str) -> usize {
        self.calls().iter().filter(|c| c.op == op && c.uid == uid).count()
    }

    pub fn count_key(&self, op: &str, key: &str) -> usize {
        self.calls().iter().filter(|c| c.op == op && c.key == key).count()
    }

    /// The IP the provider reports for a running pod.
    pub fn ip_of(&self, uid: &str) -> Option<String> {
        self.running.lock().unwrap().get(uid).map(|n| format!("127.88.0.{n}"))
    }
}

impl Provider for RecordingProvider {
    async fn reconcile(&self, pods: &[Arc<Pod>]) -> Result<(), ProviderError> {
        *self.reconciled.lock().unwrap() = Some(pods.iter().map(|p| key(p)).collect());
        match self.reconcile_error.lock().unwrap().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn create_pod(&self, pod: &Arc<Pod>) -> Result<Next, ProviderError> {
        self.record("create", pod);
        if self.reject_name.lock().unwrap().as_deref() == Some(pod.name_any().as_str()) {
            return Err(ProviderError::Rejected {
                reason: EventReason::SnapshotCpuClassMismatch,
                message: "pod wants class spr, node is icx".into(),
            });
        }
        if self
            .transient_create_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(ProviderError::transient("cocoon runtime unavailable"));
        }
        let n = self.next_ip.fetch_add(1, Ordering::SeqCst) + 2;
        self.running.lock().unwrap().insert(pod.uid().unwrap_or_default(), n);
        Ok(Next::Done)
    }

    async fn update_pod(&self, pod: &Arc<Pod>) -> Result<Next, ProviderError> {
        self.record("update", pod);
        Ok(Next::Done)
    }

    async fn delete_pod(&self, pod: &Arc<Pod>) -> Result<(), ProviderError> {
        self.record("delete_started", pod);
        let gate = self.delete_gate.lock().unwrap().clone();
        if let Some(gate) = gate {
            gate.acquire().await.expect("gate open").forget();
        }
        self.running.lock().unwrap().remove(&pod.uid().unwrap_or_default());
        self.record("delete_returned", pod);
        Ok(())
    }

    async fn pod_status(&self, pod: &Arc<Pod>) -> Result<Option<ProviderPodStatus>, ProviderError> {
        let gate = self.status_gate.lock().unwrap().clone();
        if let Some(gate) = gate {
            self.record("status_gated", pod);
            gate.acquire().await.expect("gate open").forget();
        }
        let uid = pod.uid().unwrap_or_default();
        Ok(self.ip_of(&uid).map(|ip| ProviderPodStatus {
            phase: PodPhase::Running,
            reason: None,
            message: None,
            pod_ip: Some(ip),
            ready: true,
            ready_message: Some("ping ok".into()),
            start_time: None,
            container_id: Some(format!("cocoon://{uid}")),
            agent: AgentState::Running { started_at: None },
        }))
    }
}

/// Short timings so tests run in seconds.
pub fn fast_timings() -> Timings {
    Timings {
        lease_duration: Duration::from_secs(2),
        lease_renew: Duration::from_millis(100),
        node_status: Duration::from_millis(300),
        retry_base: Duration::from_millis(20),
        retry_max: Duration::from_millis(200),
        watch_backoff_min: Duration::from_millis(20),
        watch_backoff_max: Duration::from_millis(200),
        workers: 4,
    }
}

pub fn config(vars: &[(&str, &str)]) -> KubeletConfig {
    let mut all: Vec<(String, String)> = vec![
        ("VK_NODE_NAME".into(), NODE.into()),
        ("COCOON_ROOT_DIR".into(), std::env::temp_dir().display().to_string()),
    ];
    all.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let mut cfg = KubeletConfig::from_lookup(|k| all.iter().rev().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
        .expect("valid test config");
    cfg.timings = fast_timings();
    cfg
}

pub fn fixed_host() -> HostResources {
    HostResources {
        cpus: 4,
        memory_bytes: 16 << 30,
        storage_total_bytes: 100 << 30,
        storage_available_bytes: 50 << 30,
        hugepages: None,
    }
}

/// A running virtual node: its task and shutdown switch.
pub struct Running {
    pub shutdown: CancellationToken,
    pub task: tokio::task::JoinHandle<Result<(), vk_cocoon::kubelet::KubeletError>>,
}

impl Running {
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }
}

pub fn start_node(server: &FakeApiServer, cfg: KubeletConfig, provider: Arc<RecordingProvider>) -> Running {
    let node = VirtualNode::new(
        server.client(),
        cfg,
        fixed_host(),
        "127.0.0.1".parse().unwrap(),
        provider,
    );
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(node.run(shutdown.clone()));
    Running { shutdown, task }
}

pub fn pod(name: &str, node: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.spec = Some(PodSpec {
        node_name: Some(node.into()),
        containers: vec![Container {
            name: "agent".into(),
            image: Some("ghcr.io/cocoonstack/ubuntu:24.04".into()),
            ..Default::default()
        }],
        ..Default::default()
    });
    p
}

/// Waits until the node's pod controller has handled every pod watch event the apiserver sent
/// before this call: a fresh pod bound to the node is seeded and its CreatePod awaited (the watch
/// delivers in resourceVersion order and the controller handles its inputs in order, so an
/// operation those earlier events asked for has been handed out by then). Lets a test assert
/// that something did *not* happen without sleeping.
pub async fn barrier(server: &FakeApiServer, provider: &RecordingProvider) {
    static BARRIERS: AtomicU32 = AtomicU32::new(0);
    let name = format!("barrier-{}", BARRIERS.fetch_add(1, Ordering::SeqCst));
    let uid = server.store().seed(&pod(&name, NODE)).unwrap().uid().unwrap();
    eventually(20, &format!("{name} reached the provider"), || {
        provider.count("create", &uid) == 1
    })
    .await;
}

/// Polls `cond` every 20 ms until it holds or `secs` pass.
pub async fn eventually(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
