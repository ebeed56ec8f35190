//! The cocoon provider (issue 6): CreatePod, DeletePod and the startup reconcile, every
//! decision taken by a policy.
//!
//! Layout — a pure core and thin executors over ports:
//! * pure: [`plan`] (evidence, CLI specs, image routing, backend assertion), [`lifecycle`]
//!   (intent rules), [`reconcile`] (orphans, stale creates, pod↔VM matching, owed work);
//! * tables: [`state`]; ports: [`ports`] (`SnapshotRegistry`, `LeaseSource`, `LeaseReleaser`,
//!   `PodPatcher`, `EventRecorder`); adapters: [`cocoon_net`], `registry_adapter` (`impl SnapshotRegistry for crate::registry::Registry`);
//! * executors: `create`, `delete`, `startup`, and `publish` (lifecycle flush, Ready, failures);
//! * [`metrics`]: `cocoon_vk_*` and `/metrics`.

pub mod cocoon_net;
mod create;
mod delete;
pub mod lifecycle;
pub mod metrics;
pub mod plan;
pub mod ports;
mod registry_adapter;
mod publish;
pub mod reconcile;
pub mod state;
mod startup;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use crate::kubelet::{AgentState, PodPhase, Provider, ProviderError, ProviderPodStatus};
use crate::model::PodFacts;
use crate::policy::Policies;
use crate::runtime::{CocoonRuntime, VmRecord};
use lifecycle::LifecycleState;
use metrics::ProviderMetrics;
use ports::{EventRecorder, LeaseError, LeaseReleaser, LeaseSource, PodPatcher, SnapshotRegistry, StatusNotifier};
use reconcile::OrphanPolicy;
use state::State;

/// Provider settings (environment, behaviour spec §2).
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub node_name: String,
    /// `VK_SNAPSHOT_CPU_CLASS`; "" = unclassified.
    pub node_class: String,
    /// `VK_RESTORE_MODE` (`copy` | `ondemand` | `mmap`, default mmap).
    pub restore_mode: String,
    /// `VK_ORPHAN_POLICY`.
    pub orphan_policy: OrphanPolicy,
    /// Pause between attempts of an apiserver write (3 attempts).
    pub patch_retry: Duration,
    /// Budget of the background watcher of a stale create.
    pub stale_watch_budget: Duration,
    /// Period of the lifecycle reconciler (re-flush of intents that did not reach the apiserver).
    pub reflush_interval: Duration,
}

impl ProviderConfig {
    pub fn from_lookup(env: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let restore_mode = env("VK_RESTORE_MODE").map(|v| v.trim().to_ascii_lowercase()).filter(|v| !v.is_empty()).unwrap_or_else(|| "mmap".into());
        if crate::runtime::RestoreMode::parse(&restore_mode).is_none() {
            return Err(format!("VK_RESTORE_MODE={restore_mode:?} is not one of copy, ondemand, mmap"));
        }
        Ok(Self {
            node_name: env("VK_NODE_NAME").filter(|v| !v.is_empty()).unwrap_or_else(|| crate::kubelet::config::DEFAULT_NODE_NAME.into()),
            node_class: env("VK_SNAPSHOT_CPU_CLASS").unwrap_or_default(),
            restore_mode,
            orphan_policy: OrphanPolicy::parse(env("VK_ORPHAN_POLICY").as_deref())?,
            patch_retry: Duration::from_millis(500),
            stale_watch_budget: Duration::from_secs(30 * 60),
            reflush_interval: Duration::from_secs(15),
        })
    }

    pub fn from_env() -> Result<Self, String> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }
}

/// Everything the provider talks to.
pub struct Ports {
    pub runtime: Arc<dyn CocoonRuntime>,
    /// `None` = registry-less node.
    pub registry: Option<Arc<dyn SnapshotRegistry>>,
    pub leases: Arc<dyn LeaseSource>,
    /// `None` = lease release disabled.
    pub releaser: Option<Arc<dyn LeaseReleaser>>,
    pub patcher: Arc<dyn PodPatcher>,
    pub events: Arc<dyn EventRecorder>,
}

/// The virtual-kubelet provider running pods as cocoon microVMs.
pub struct CocoonProvider {
    cfg: ProviderConfig,
    ports: Ports,
    policies: Arc<Policies>,
    state: State,
    metrics: ProviderMetrics,
    notifier: OnceLock<Arc<dyn StatusNotifier>>,
    vm_prefetch: std::sync::Mutex<Option<tokio::task::JoinHandle<crate::runtime::Result<Vec<VmRecord>>>>>,
}

impl CocoonProvider {
    pub fn new(cfg: ProviderConfig, ports: Ports, policies: Arc<Policies>, metrics: ProviderMetrics) -> Self {
        Self { cfg, ports, policies, state: State::default(), metrics, notifier: OnceLock::new(), vm_prefetch: Default::default() }
    }

    /// Starts `cocoon vm list` now, so the startup reconcile's VM list runs in parallel with the
    /// virtual node's pod list (call it just before `VirtualNode::run`).
    pub fn prefetch_vms(&self) {
        let runtime = self.ports.runtime.clone();
        *self.vm_prefetch.lock().expect("prefetch lock") = Some(tokio::spawn(async move { runtime.list().await }));
    }

    /// Connects status notifications (the virtual node's notifier exists only after the node
    /// was built around this provider).
    pub fn set_notifier(&self, notifier: Arc<dyn StatusNotifier>) {
        let _ = self.notifier.set(notifier);
    }

    pub fn metrics(&self) -> &ProviderMetrics {
        &self.metrics
    }

    pub fn state(&self) -> &State {
        &self.state
    }

    fn notify(&self, key: &str) {
        self.metrics.vm_table_size.set(i64::try_from(self.state.vm_count()).unwrap_or(i64::MAX));
        if let Some(n) = self.notifier.get() {
            n.notify(key);
        }
    }

    /// Runs a synchronous policy decision off the async workers.
    async fn decide<T: Send + 'static>(&self, f: impl FnOnce(&Policies) -> T + Send + 'static) -> Result<T, ProviderError> {
        let policies = self.policies.clone();
        tokio::task::spawn_blocking(move || f(&policies))
            .await
            .map_err(|e| ProviderError::Transient(format!("policy decision task failed: {e}")))
    }

    /// The VM's IP: NIC 0's static address, else cocoon-net's lease for its MAC ("" while none).
    pub fn resolve_ip(&self, vm: &VmRecord) -> String {
        if let Some(ip) = vm.primary_ip() {
            return ip.to_string();
        }
        let Some(mac) = vm.primary_mac() else { return String::new() };
        match self.ports.leases.lookup(mac) {
            Ok(ip) => ip,
            Err(LeaseError::NoLease) => String::new(),
            Err(e @ LeaseError::Unreadable(_)) => {
                tracing::warn!(vm = %vm.id, error = %e, "cocoon-net lease file unreadable");
                String::new()
            }
        }
    }

    /// Best-effort release of the VM's DHCP leases (after a successful remove only).
    async fn release_leases(&self, vm: &VmRecord) {
        let Some(releaser) = &self.ports.releaser else { return };
        for mac in plan::dhcp_macs(vm) {
            match releaser.release(&mac).await {
                Ok(()) => self.metrics.lease_release.with_label_values(&["ok"]).inc(),
                Err(error) => {
                    self.metrics.lease_release.with_label_values(&["failed"]).inc();
                    tracing::warn!(vm = %vm.id, %mac, %error, "lease release failed; cocoon-net's lease expiry is the fallback");
                }
            }
        }
    }

    fn status_of(&self, key: &str) -> Option<ProviderPodStatus> {
        let tracked = self.state.tracked(key)?;
        let intent = self.state.intent(key);
        let Some(vm) = tracked.vm else {
            let message = intent.filter(|i| i.state == LifecycleState::Failed).map(|i| i.message);
            return Some(ProviderPodStatus::pending("ContainerCreating", message));
        };
        let ready = intent.as_ref().is_some_and(|i| i.state == LifecycleState::Ready && i.uid == tracked.uid);
        let ip = self.resolve_ip(&vm);
        let ready_message = match &intent {
            Some(i) if i.state == LifecycleState::Failed => i.message.clone(),
            Some(i) => format!("lifecycle {}", i.state.as_str()),
            None => "lifecycle unknown".into(),
        };
        Some(ProviderPodStatus {
            phase: PodPhase::Running,
            reason: None,
            message: None,
            pod_ip: (!ip.is_empty()).then_some(ip),
            ready,
            ready_message: Some(ready_message),
            start_time: None,
            container_id: Some(format!("cocoon://{}", vm.id)),
            agent: AgentState::Running { started_at: None },
        })
    }

    /// Background upkeep until `shutdown`: re-flushes lifecycle intents every `reflush_interval`.
    pub async fn run_background(self: Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let mut tick = tokio::time::interval(self.cfg.reflush_interval);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => self.reflush().await,
            }
        }
    }
}

impl Provider for CocoonProvider {
    async fn reconcile(&self, pods: &[Pod]) -> Result<(), ProviderError> {
        startup::reconcile(self, pods).await
    }

    async fn create_pod(&self, pod: &Pod) -> Result<(), ProviderError> {
        create::create(self, pod).await
    }

    async fn update_pod(&self, pod: &Pod) -> Result<(), ProviderError> {
        // Only the CPU-class gate and the tracked copy; hibernate/wake is UpdatePod's own issue.
        let facts = PodFacts::from_pod(pod);
        let key = facts.key();
        let verdict = self.admission(&facts, crate::policy::facts::AdmissionContext::Update).await?;
        if let Err((reason, message)) = verdict {
            self.metrics.lifecycle("update", "failed", "snapshot_cpu_class_mismatch");
            self.ports.events.record(pod, true, "SnapshotCPUClassMismatch", format!("update: {message}"));
            return Err(ProviderError::Rejected { reason, message });
        }
        self.state.refresh(&key, pod);
        self.metrics.lifecycle("update", "skipped", "noop");
        Ok(())
    }

    async fn delete_pod(&self, pod: &Pod) -> Result<(), ProviderError> {
        delete::delete(self, pod).await
    }

    async fn pod_status(&self, pod: &Pod) -> Result<Option<ProviderPodStatus>, ProviderError> {
        let key = PodFacts::from_pod(pod).key();
        let uid = state::uid_of(pod);
        match self.state.tracked(&key) {
            Some(t) if t.uid == uid => Ok(self.status_of(&key)),
            _ => Ok(None),
        }
    }
}

impl CocoonProvider {
    /// The CPU-class admission policy: `Ok(Err((reason, message)))` on a rejection.
    async fn admission(
        &self,
        facts: &PodFacts,
        context: crate::policy::facts::AdmissionContext,
    ) -> Result<Result<(), (String, String)>, ProviderError> {
        let f = crate::policy::facts::AdmissionFacts {
            pod: facts.clone(),
            context,
            node_name: self.cfg.node_name.clone(),
            node_class: self.cfg.node_class.clone(),
        };
        let d = self.decide(move |p| p.cpu_class_admission(f)).await?;
        Ok(match d.outcome {
            crate::policy::decision::Verdict::Admit => Ok(()),
            crate::policy::decision::Verdict::Reject => Err((d.reason, d.message)),
        })
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Result<ProviderConfig, String> {
        let owned: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ProviderConfig::from_lookup(|k| owned.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn configuration_defaults_and_startup_errors() {
        let c = cfg(&[]).unwrap();
        assert_eq!((c.node_name.as_str(), c.restore_mode.as_str(), c.orphan_policy), ("cocoon-pool", "mmap", OrphanPolicy::Destroy));
        let c = cfg(&[("VK_NODE_NAME", "n1"), ("VK_RESTORE_MODE", " OnDemand "), ("VK_ORPHAN_POLICY", "keep"), ("VK_SNAPSHOT_CPU_CLASS", "icx")]).unwrap();
        assert_eq!((c.node_name.as_str(), c.restore_mode.as_str(), c.orphan_policy, c.node_class.as_str()), ("n1", "ondemand", OrphanPolicy::Keep, "icx"));
        assert!(cfg(&[("VK_ORPHAN_POLICY", "nuke")]).unwrap_err().contains("VK_ORPHAN_POLICY"));
        assert!(cfg(&[("VK_RESTORE_MODE", "lazy")]).unwrap_err().contains("VK_RESTORE_MODE"));
    }
}
