//! The cocoon provider: CreatePod, UpdatePod (hibernate / wake), DeletePod and the startup
//! reconcile, every decision taken by a policy; readiness probes, guest fixups, the VM event
//! watcher and the periodic reconcilers keep each pod's status true to its VM.
//!
//! Layout — a pure core and thin executors over ports:
//! * pure: [`plan`] (evidence, CLI specs, image routing, backend assertion), [`lifecycle`]
//!   (intent rules), [`reconcile`] (orphans, stale creates, pod↔VM matching, owed work),
//!   [`gone`] (what a VM event means), `retry` (owed-retry delays), the probe [`probe::Schedule`],
//!   [`status`] (the pod status from what the provider knows);
//! * tables: `state`; ports: [`ports`] (`SnapshotRegistry`, `LeaseSource`, `LeaseReleaser`,
//!   `PodPatcher`, `EventRecorder`), [`probe::Prober`] (scoped by [`probe_scope`]); adapters: [`cocoon_net`],
//!   `registry_adapter` (`impl SnapshotRegistry for crate::registry::Registry`); [`transfer`] runs
//!   cocoon's export / import around the registry;
//! * executors: `create` (a pipeline of typed steps in `bring_up`: gather, decide, execute;
//!   its restore shared with the wake), `update` (with `hibernate` and `wake`; `owed`: the retry
//!   a failed transition owes), `delete`, `startup` (with `resume`), `guest` (fixups, lease
//!   wait, Ready), `probe_start` and `endpoint` (a pod's probe agent, its IP annotation),
//!   `watcher` and `evict`, `publish` (lifecycle flush, Ready, failures), `background`
//!   (reconciler loops);
//! * the guest's OS: `guest_os` (one trait, chosen once from the VM spec: the macOS path of
//!   [`macos`] or the operation's own cocoon path; `mac_guest`: a macOS VM's record, below
//!   both); `failed_ops` (a failed create, a kept VM);
//! * the operations are free functions of `&CocoonProvider` (their context: ports, table,
//!   policies, metrics, settings) in their modules; every wait between tries is a
//!   [`crate::retry`] schedule;
//! * [`config`]: settings and timings; [`metrics`]: `cocoon_vk_*` and `/metrics`.

mod background;
mod bring_up;
pub mod clone_roots;
pub mod cocoon_net;
pub mod config;
mod create;
mod delete;
mod endpoint;
mod ensure;
mod evict;
mod failed_ops;
mod failure;
pub mod gone;
mod guest;
mod guest_os;
mod hibernate;
mod inline_decision;
mod invariants;
mod known;
pub mod lifecycle;
mod mac_guest;
pub mod macos;
pub mod metrics;
mod owed;
mod ownership;
pub mod plan;
pub mod ports;
pub mod probe;
pub mod probe_scope;
mod probe_start;
mod publish;
mod reclaim;
pub mod reconcile;
mod recording;
mod registry_adapter;
mod resume;
pub mod sac;
mod serving;
mod startup;
pub mod status;
pub mod table;
pub mod transfer;
mod turns;
mod update;
mod wake;
mod wake_peer;
mod watcher;

use std::sync::{Arc, OnceLock, Weak};

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

pub use config::{ProbeTimings, ProviderConfig, Timings};

use crate::kubelet::{Next, Provider, ProviderError, ProviderPodStatus};
use crate::model::PodFacts;
use crate::policy::Policies;
use crate::runtime::{CocoonRuntime, VmRecord};
use metrics::ProviderMetrics;
use ports::{EventRecorder, LeaseError, LeaseReleaser, LeaseSource, PodPatcher, SnapshotRegistry, StatusNotifier};
use probe::{Prober, Probes};
use table::Table;

/// Everything the provider talks to.
pub struct Ports {
    pub runtime: Arc<dyn CocoonRuntime>,
    /// The cocoon-macos CLI (managed `os=macos` pods).
    pub macos: Arc<dyn crate::runtime::macos::MacosRuntime>,
    /// `None` = registry-less node.
    pub registry: Option<Arc<dyn SnapshotRegistry>>,
    pub leases: Arc<dyn LeaseSource>,
    /// `None` = lease release disabled.
    pub releaser: Option<Arc<dyn LeaseReleaser>>,
    pub patcher: Arc<dyn PodPatcher>,
    pub events: Arc<dyn EventRecorder>,
    /// Readiness probes (production: [`probe::NetProber`]).
    pub prober: Arc<dyn Prober>,
}

/// The virtual-kubelet provider running pods as cocoon microVMs.
pub struct CocoonProvider {
    cfg: ProviderConfig,
    ports: Ports,
    policies: Arc<Policies>,
    state: Table,
    metrics: ProviderMetrics,
    probes: Probes,
    /// The node's VNC ports of macOS guests.
    vnc: macos::vnc::VncPorts,
    notifier: OnceLock<Arc<dyn StatusNotifier>>,
    /// Set once the startup reconcile has tracked the node's pods (the reclaimer waits for it).
    reconciled: tokio::sync::watch::Sender<bool>,
    /// The peer restore tier of wakes (unset: wakes skip it).
    peer: OnceLock<Arc<crate::peer::PeerTier>>,
    /// Snapshot pushes and pulls (the pulls in flight are shared).
    transfers: transfer::Transfers,
    /// Work shared between pods, one flight per key.
    flights: ensure::Flights,
    /// The node's bring-up turns (`VK_MAX_CONCURRENT_BRING_UPS`).
    bring_ups: turns::Turns,
    /// The node's snapshots and images as this daemon's own calls left them.
    known: Arc<known::Known>,
    vm_prefetch: std::sync::Mutex<Option<tokio::task::JoinHandle<crate::runtime::Result<Vec<VmRecord>>>>>,
    /// Probe targets the guest networks refused, logged once each.
    refused_targets: probe_scope::RefusedTargets,
    /// Cancelled by [`CocoonProvider::close`]: stops background work.
    closing: CancellationToken,
    /// Every task the provider starts ([`CocoonProvider::spawn`]); [`CocoonProvider::closed`]
    /// waits for them.
    tasks: TaskTracker,
    /// Background tasks hold the provider through this (it lives in an `Arc`).
    me: Weak<CocoonProvider>,
}

impl CocoonProvider {
    /// The provider, with the VM name holders kept in `cfg.state_dir` (an error when that
    /// directory cannot be made or read: the daemon must not run without knowing who holds what).
    pub fn new(
        cfg: ProviderConfig,
        mut ports: Ports,
        policies: Arc<Policies>,
        metrics: ProviderMetrics,
    ) -> Result<Arc<Self>, config::StateDirError> {
        let (holders, woken) = match &cfg.state_dir {
            Some(dir) => {
                let records = |sub: &str| dir.join(sub);
                let err = |what, dir, source| config::StateDirError { what, dir, source };
                let holders = table::Holders::open_holders(&records("vm-holders"))
                    .map_err(|e| err("VM holder", records("vm-holders"), e))?;
                let woken = table::WokenFrom::open_woken(&records("woken-from"))
                    .map_err(|e| err("woken-from", records("woken-from"), e))?;
                (holders, woken)
            }
            None => Default::default(),
        };
        let probes = Probes::new(ports.prober.clone(), cfg.timings.probe, metrics.probe_duration.clone());
        let vnc = macos::vnc::VncPorts::new(cfg.macos.vnc_ports.clone());
        let bring_ups = turns::Turns::new(
            cfg.max_bring_ups,
            metrics.bring_ups_waiting.clone(),
            metrics.bring_ups_running.clone(),
            metrics.bring_up_wait_duration.clone(),
        );
        let known = Arc::new(known::Known::default());
        ports.runtime = Arc::new(recording::Recording::new(ports.runtime, known.clone()));
        Ok(Arc::new_cyclic(|me| Self {
            bring_ups,
            vnc,
            cfg,
            ports,
            policies,
            state: Table::with_records(holders, woken),
            metrics,
            probes,
            notifier: OnceLock::new(),
            peer: OnceLock::new(),
            reconciled: tokio::sync::watch::Sender::new(false),
            transfers: transfer::Transfers::new(),
            flights: ensure::Flights::default(),
            known,
            vm_prefetch: Default::default(),
            refused_targets: Default::default(),
            closing: CancellationToken::new(),
            tasks: TaskTracker::new(),
            me: me.clone(),
        }))
    }

    /// The provider as an `Arc`, for work that outlives the current call.
    fn arc(&self) -> Arc<Self> {
        self.me
            .upgrade()
            .expect("the provider lives in an Arc while its methods run")
    }

    /// Starts `cocoon vm list` now, so the startup reconcile's VM list runs in parallel with the
    /// virtual node's pod list (call it just before `VirtualNode::run`).
    pub fn prefetch_vms(&self) {
        let runtime = self.ports.runtime.clone();
        *self.vm_prefetch.lock().expect("prefetch lock") = Some(self.spawn(async move { runtime.list().await }));
    }

    /// Connects status notifications (the virtual node's notifier exists only after the node
    /// was built around this provider).
    pub fn set_notifier(&self, notifier: Arc<dyn StatusNotifier>) {
        let _ = self.notifier.set(notifier);
    }

    /// Turns on the peer restore tier of wakes (set once, before pods arrive).
    pub fn set_peer_tier(&self, tier: Arc<crate::peer::PeerTier>) {
        let _ = self.peer.set(tier);
    }

    pub fn metrics(&self) -> &ProviderMetrics {
        &self.metrics
    }

    pub fn state(&self) -> &Table {
        &self.state
    }

    /// Stops background work: probe agents, guest work, retries, rechecks.
    pub fn close(&self) {
        self.closing.cancel();
        self.probes.stop_all();
    }

    /// Closes the provider and waits until every task it started has ended: the background work
    /// [`Self::close`] stops, and work that runs to its end (a hibernate resumed after a restart,
    /// a NIC given back). The caller bounds the wait (the daemon's shutdown deadline).
    async fn closed(&self) {
        self.close();
        self.tasks.close();
        self.probes.closed().await;
        self.tasks.wait().await;
    }

    /// Starts `work` as a task of the provider's (detached from the call that starts it, waited
    /// for by [`Self::closed`]).
    fn spawn<F>(&self, work: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(work)
    }

    /// Asks the pod controller for the requeue hook of the pod after the next wait of `after`
    /// (work owed outside a pod operation).
    fn requeue(&self, key: &str, after: crate::retry::Schedule) {
        if let Some(n) = self.notifier.get() {
            n.requeue(key, after);
        }
    }

    fn notify(&self, key: &str) {
        self.metrics
            .vm_table_size
            .set(i64::try_from(self.state.vm_count()).unwrap_or(i64::MAX));
        if let Some(n) = self.notifier.get() {
            n.notify(key);
        }
    }

    /// Runs a synchronous policy decision without holding up the async workers' other tasks:
    /// on this task's thread on the daemon's multi-thread runtime (no thread wake-up, see
    /// [`inline_decision`]), on the blocking pool on a current-thread runtime (some tests),
    /// which cannot hand its other tasks over.
    async fn decide<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Policies) -> T + Send + 'static,
    ) -> Result<T, ProviderError> {
        use tokio::runtime::{Handle, RuntimeFlavor};
        if Handle::current().runtime_flavor() != RuntimeFlavor::MultiThread {
            return self.decide_apart(f).await;
        }
        inline_decision::on_this_thread(|| tracing::debug_span!("policy.decision").in_scope(|| f(&self.policies)))
            .instrument(tracing::debug_span!("policy.decide"))
            .await
            .map_err(|_| ProviderError::Transient("policy decision task failed: it panicked".into()))
    }

    /// Runs a synchronous policy decision on the blocking pool: for batches of decisions that
    /// should run beside each other (one per CPU), which [`Self::decide`] would run one after
    /// another on the calling thread.
    async fn decide_apart<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Policies) -> T + Send + 'static,
    ) -> Result<T, ProviderError> {
        let policies = self.policies.clone();
        tokio::task::spawn_blocking(move || f(&policies))
            .await
            .map_err(|e| ProviderError::Transient(format!("policy decision task failed: {e}")))
    }

    /// The VM's IP: NIC 0's static address, else cocoon-net's lease for its MAC ("" while none).
    /// The lease is read on every call: cocoon-net may rebind a MAC.
    pub fn resolve_ip(&self, vm: &VmRecord) -> String {
        if let Some(ip) = vm.primary_ip() {
            return ip.to_string();
        }
        let Some(mac) = vm.primary_mac() else {
            return String::new();
        };
        match self.ports.leases.lookup(mac) {
            Ok(ip) => ip,
            Err(LeaseError::NoLease) => String::new(),
            Err(e @ LeaseError::Unreadable { .. }) => {
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

    /// The provider's view of pod `key` (see [`status::build`]); `bypass_lifecycle` gives
    /// Ready from the probe alone (the status that must land before `lifecycle-state=ready`).
    fn status_of(&self, key: &str, bypass_lifecycle: bool) -> Option<ProviderPodStatus> {
        let tracked = self.state.tracked(key)?;
        let intent = self.state.intent(key).filter(|i| i.uid == tracked.uid);
        let probe = self.probes.result(key, &tracked.uid);
        let ip = tracked.vm.as_ref().map(|vm| self.resolve_ip(vm)).unwrap_or_default();
        Some(status::build(&status::View {
            vm: tracked.vm.as_ref(),
            hibernated: tracked.hibernated,
            ip: &ip,
            intent: intent.as_ref(),
            probe: probe.as_ref(),
            bypass_lifecycle,
        }))
    }

    /// Background upkeep until `shutdown` (or [`CocoonProvider::close`]): the lifecycle
    /// reconciler, the VM event watcher and the status reconciler.
    pub async fn run_background(self: Arc<Self>, shutdown: CancellationToken) {
        background::run(self, shutdown).await;
    }

    /// One pass of the snapshot reclaimer (`reclaim.rs`): how many
    /// snapshots it removed.
    pub async fn reclaim_snapshots(&self) -> usize {
        reclaim::reclaim_snapshots(self).await
    }

    /// Whether a full `snapshot list` has landed in what the daemon knows of the node's
    /// snapshots (the startup's, or the reclaimer's first pass, runs in the background after the
    /// reconcile; until one lands, every snapshot name no call touched is asked of cocoon).
    pub fn snapshot_list_landed(&self) -> bool {
        self.known.list_landed()
    }

    /// Returns once [`Self::snapshot_list_landed`] (callers bound the wait: a list that fails
    /// lands only with the reclaimer's next one).
    pub async fn until_snapshot_list_landed(&self) {
        self.known.until_listed().await;
    }
}

impl Provider for CocoonProvider {
    async fn reconcile(&self, pods: &[Arc<Pod>]) -> Result<(), ProviderError> {
        startup::reconcile(self, pods).await
    }

    async fn create_pod(&self, pod: &Arc<Pod>) -> Result<Next, ProviderError> {
        create::create(self, pod).await
    }

    async fn update_pod(&self, pod: &Arc<Pod>) -> Result<Next, ProviderError> {
        update::update(self, pod).await
    }

    async fn requeue_pod(&self, pod: &Arc<Pod>) -> Result<Next, ProviderError> {
        update::requeue(self, pod).await
    }

    async fn delete_pod(&self, pod: &Arc<Pod>) -> Result<(), ProviderError> {
        delete::delete(self, pod).await
    }

    fn observed(&self, pod: &Arc<Pod>) {
        self.state.share_echo(crate::kubelet::pods::pod_key(pod).as_str(), pod);
    }

    async fn pod_status(&self, pod: &Arc<Pod>) -> Result<Option<ProviderPodStatus>, ProviderError> {
        let key = crate::kubelet::pods::pod_key(pod);
        let uid = table::uid_of(pod);
        if let Some(terminal) = self.state.terminal_status(key.as_str(), &uid) {
            return Ok(Some(terminal));
        }
        match self.state.tracked(key.as_str()) {
            Some(t) if t.uid == uid => Ok(self.status_of(key.as_str(), false)),
            _ => Ok(None),
        }
    }
}

impl CocoonProvider {
    /// The CPU-class admission policy: `Ok(Err(failure))` on a rejection, which carries the
    /// policy's refusal (its kind decides what a retry does).
    async fn admission(
        &self,
        facts: &PodFacts,
        context: crate::policy::contract::cpu_class_admission::AdmissionContext,
    ) -> Result<Result<(), failure::Failure>, ProviderError> {
        use crate::policy::contract::cpu_class_admission::{Facts, Verdict};
        let f = Facts {
            pod: facts.clone(),
            context,
            node_name: self.cfg.node_name.clone(),
            node_class: self.cfg.node_class.clone(),
        };
        let d = self
            .decide(move |p| p.decide::<crate::policy::slots::CpuClassAdmission>(&f))
            .await?;
        Ok(match d.verdict {
            Verdict::Admit => Ok(()),
            Verdict::Reject(refusal) => Err(failure::Failure::refused(refusal, d.message)),
        })
    }

    /// The CPU-class admission of many pods at once (the startup's check of every live pod):
    /// the same decision as [`Self::admission`], one fresh instance each, run in one batch per
    /// usable CPU on the blocking pool instead of one blocking task per pod. Answers in the
    /// order of `pods`.
    async fn admissions(
        &self,
        pods: Vec<PodFacts>,
        context: crate::policy::contract::cpu_class_admission::AdmissionContext,
    ) -> Result<Vec<Result<(), failure::Failure>>, ProviderError> {
        use crate::policy::contract::cpu_class_admission::{Facts, Verdict};
        use crate::policy::slots::CpuClassAdmission;
        let batches = usize::try_from(crate::host::cpu::usable_cpus()).unwrap_or(1).max(1);
        let per_batch = pods.len().div_ceil(batches).max(1);
        let mut pods = pods.into_iter();
        let mut running = Vec::new();
        loop {
            let facts: Vec<Facts> = pods
                .by_ref()
                .take(per_batch)
                .map(|pod| Facts {
                    pod,
                    context,
                    node_name: self.cfg.node_name.clone(),
                    node_class: self.cfg.node_class.clone(),
                })
                .collect();
            if facts.is_empty() {
                break;
            }
            running.push(self.decide_apart(move |p| {
                facts
                    .iter()
                    .map(|f| p.decide::<CpuClassAdmission>(f))
                    .collect::<Vec<_>>()
            }));
        }
        let mut out = Vec::new();
        for decisions in futures::future::join_all(running).await {
            out.extend(decisions?.into_iter().map(|d| match d.verdict {
                Verdict::Admit => Ok(()),
                Verdict::Reject(refusal) => Err(failure::Failure::refused(refusal, d.message)),
            }));
        }
        Ok(out)
    }
}
