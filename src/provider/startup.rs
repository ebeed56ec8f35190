//! Startup reconcile: list the VMs, check every live pod's CPU class
//! (a mismatch is fatal), reconcile stale creates, adopt by id then by name, apply the orphan
//! policy to the rest, and resume owed work; then, off the startup's path, list the local
//! snapshots.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, StreamExt};
use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::guest_os;
use super::lifecycle::Intent;
use super::reconcile::{self, InspectVerdict, OrphanPolicy, PodMatch, PodView, StaleStep};
use super::table::NameClaim;
use crate::kubelet::ProviderError;
use crate::model::{RuntimeAnnotations, VmSpec, pod_facts, vm_spec};
use crate::policy::contract::cpu_class_admission::AdmissionContext;
use crate::policy::contract::types::PodPhase;
use crate::retry::Schedule;
use crate::runtime::{CocoonRuntime, StaleCreateOutcome, VmRecord, VmState};

const FAN_OUT: usize = 8;

/// A listed pod with its decoded annotations.
type Decoded<'a> = (&'a Arc<Pod>, VmSpec);

pub(super) async fn reconcile(p: &CocoonProvider, pods: &[Arc<Pod>]) -> Result<(), ProviderError> {
    // 1. The VMs (prefetched while the virtual node listed the pods), and 2. the CPU class of
    // every non-terminal pod, which needs no VM: its decisions run while the VMs are read. A
    // failed VM list or a refused pod is fatal. The local snapshots are not read here (see
    // `learn_snapshots`, started at the end).
    let prefetched = p.vm_prefetch.lock().expect("prefetch lock").take();
    let vm_list = async {
        match prefetched {
            Some(task) => task
                .await
                .map_err(|e| ProviderError::Transient(format!("startup reconcile: the vm list task failed: {e}")))?,
            None => p.ports.runtime.list().await,
        }
        .map_err(|e| {
            ProviderError::Transient(format!(
                "startup reconcile: cocoon vm list: {e}; check VK_COCOON_BIN and the cocoon state"
            ))
        })
    };
    let (vms, admitted) = tokio::join!(vm_list, admit_live_pods(p, pods));
    let vms = vms?;
    admitted?;

    // 3. Stale creates.
    let (creating, mut settled): (Vec<VmRecord>, Vec<VmRecord>) =
        vms.into_iter().partition(|v| v.state == VmState::Creating);
    let outcomes: Vec<(VmRecord, StaleResult)> = stream::iter(creating)
        .map(|vm| async move {
            let r = stale_create(p, &vm).await;
            (vm, r)
        })
        .buffer_unordered(FAN_OUT)
        .collect()
        .await;
    for (vm, result) in outcomes {
        match result {
            StaleResult::Keep(current) => settled.push(current),
            StaleResult::Drop => {}
            StaleResult::Orphan(current) => apply_orphan_policy(p, &current).await,
            StaleResult::Watch => watch_stale_create(p, vm),
        }
    }

    // 4. Match pods to VMs. macOS pods' VMs are never in `cocoon vm list`: cocoon-macos is
    // asked about each of them instead. Each pod's annotations are decoded once, here, for every
    // step below (the startup walks every pod of the node).
    let (macos_pods, cocoon_pods): (Vec<Decoded>, Vec<Decoded>) = pods
        .iter()
        .map(|pod| (pod, vm_spec::of_pod(pod)))
        .partition(|(_, spec)| !guest_os::for_spec(spec).listed_by_cocoon());
    let macos_pods: Vec<&Arc<Pod>> = macos_pods.into_iter().map(|(pod, _)| pod).collect();
    super::macos::adopt_at_startup(p, &macos_pods).await;
    let views: Vec<PodView> = cocoon_pods
        .iter()
        .map(|(pod, spec)| PodView {
            key: crate::kubelet::pods::pod_key(pod).to_string(),
            vm_id: RuntimeAnnotations::of_pod(pod).vm_id,
            hibernate: spec.hibernate,
            vm_name: spec.vm_name.clone(),
            managed: spec.managed,
        })
        .collect();
    let matched = reconcile::match_pods(&views, settled, |name, key| p.state.name_held_by(name, key));
    // The VMs no pod adopts below: the matched VMs of pods that do not adopt them, then the
    // unclaimed ones.
    let mut left: Vec<VmRecord> = Vec::new();
    let mut owed: Vec<(&Arc<Pod>, &VmSpec, &str)> = Vec::new();
    for (m, ((pod, spec), view)) in matched.per_pod.into_iter().zip(cocoon_pods.iter().zip(views.iter())) {
        let pkey = view.key.as_str();
        let uid = super::table::uid_of(pod);
        let seed = |p: &CocoonProvider| {
            if let Some(intent) =
                Intent::from_annotations(&uid, pod.metadata.annotations.as_ref().unwrap_or(&Default::default()))
            {
                p.state.seed_intent(pkey, intent);
            }
        };
        if !view.managed {
            // Unmanaged pods: the operator's pre-written runtime is the VM.
            left.extend(m.into_vm());
            continue;
        }
        // A pod adopts only a VM name it holds, or that nobody holds (it takes it then). Which
        // pods exist is not settled while this loop runs, so a name another pod holds is left
        // to that pod, or to the bring-up policy at CreatePod if that pod is gone.
        if matches!(m, PodMatch::ById(_) | PodMatch::ByName(_) | PodMatch::Hibernated { .. }) {
            if let NameClaim::Other { holder, .. } = p.state.name_claim(&view.vm_name, pkey) {
                tracing::warn!(pod = %pkey, vm = %view.vm_name, holder = %holder.key(), "not adopting a vm name another pod holds");
                left.extend(m.into_vm());
                continue;
            }
            if p.state.take_name(&view.vm_name, pkey, &uid).is_err() {
                left.extend(m.into_vm());
                continue;
            }
        }
        match m {
            PodMatch::ById(vm) => {
                p.state.track(pkey, pod, &view.vm_name);
                seed(p);
                p.state.set_vm(pkey, &uid, vm);
                owed.push((pod, spec, pkey));
            }
            PodMatch::ByName(vm) => {
                p.state.track(pkey, pod, &view.vm_name);
                seed(p);
                let (id, ip) = (vm.id.clone(), p.resolve_ip(&vm));
                p.state.set_vm(pkey, &uid, vm);
                p.metrics.reconcile_adopt_by_name.inc();
                super::publish::write_runtime(p, pod, pkey, &id, &ip).await;
                tracing::info!(pod = %pkey, vm = %id, "adopted by vm name; runtime annotation repaired");
                owed.push((pod, spec, pkey));
            }
            PodMatch::Hibernated { clear_stale_id } => {
                p.state.track(pkey, pod, &view.vm_name);
                p.state.mark_hibernated(pkey, &uid);
                seed(p);
                if clear_stale_id {
                    super::publish::clear_runtime(p, pod, pkey).await;
                }
                owed.push((pod, spec, pkey));
            }
            PodMatch::Skip { stale_id } => {
                if stale_id {
                    tracing::warn!(pod = %pkey, vm_id = %view.vm_id, "pod names a vm that no longer exists; CreatePod will recreate it");
                }
            }
        }
    }

    // 5. VMs no pod claimed: the orphan policy. A VM named after a pod is indexed for adoption.
    let pod_names: HashSet<&str> = views.iter().map(|v| v.vm_name.as_str()).collect();
    for vm in left
        .into_iter()
        .chain(matched.unclaimed)
        .filter(|v| pod_names.contains(v.name()))
    {
        let name = vm.name().to_owned();
        p.state.index_vm(&name, vm);
    }
    for vm in matched.orphans {
        apply_orphan_policy(p, &vm).await;
    }

    // 6. Probes for the adopted pods — in the background: a node with many unreachable guests
    // must not wait out their probe timeouts before it registers — then the owed work.
    let probed: Vec<(String, String)> = owed
        .iter()
        .map(|(pod, _, k)| (k.to_string(), super::table::uid_of(pod)))
        .filter(|(k, uid)| p.state.has_vm_as(k, uid) == Some(true))
        .collect();
    let me = p.arc();
    p.spawn(async move {
        stream::iter(probed)
            .for_each_concurrent(FAN_OUT, |(k, uid)| {
                let me = me.clone();
                async move { super::probe_start::start_probe(&me, &k, &uid).await }
            })
            .await;
    });
    for (pod, spec, pkey) in owed {
        super::resume::dispatch_owed(p, pod, pkey, spec).await;
    }
    learn_snapshots(p);
    p.notify("");
    p.reconciled.send_replace(true);
    tracing::info!(pods = views.len(), vms = p.state.vm_count(), "startup reconcile done");
    Ok(())
}

/// The startup's CPU-class check of every pod that has not finished. Host invariant: at startup
/// any rejection is fatal, whatever its kind (the node must not register while it holds a pod
/// it may not run).
async fn admit_live_pods(p: &CocoonProvider, pods: &[Arc<Pod>]) -> Result<(), ProviderError> {
    let live: Vec<_> = pods
        .iter()
        .map(|pod| pod_facts(pod))
        .filter(|facts| !matches!(facts.phase, PodPhase::Succeeded | PodPhase::Failed))
        .collect();
    let verdicts = p.admissions(live, AdmissionContext::StartupReconcile).await?;
    match verdicts.into_iter().find_map(Result::err) {
        Some(f) => Err(ProviderError::Rejected {
            reason: f.reason,
            message: format!("startup compatibility check: {}", f.message),
        }),
        None => Ok(()),
    }
}

/// The node's local snapshots, listed once in the background after the reconcile: from then on
/// this daemon's own calls keep the list (`known`), so a warm create does not ask for its image's
/// snapshot or a fork snapshot to drop.
///
/// Off the startup's path because nothing there needs it (adoption, the orphan policy and the
/// owed work go by the VM list and the pods), while answering it costs cocoon about what the VM
/// list costs: read beside the VM list and the pod list, it slowed the two lists the node waits
/// for on a machine of few cores. Until it lands every snapshot name no call touched is unknown,
/// so a create asks cocoon as it would without the list; a save or removal the daemon makes
/// while it runs is newer than the list and outlives it (`Known::listed`); the hibernate
/// evidence never comes from the list. Failing is not fatal: the names stay unknown until the
/// reclaimer's next full list. A close drops the call.
///
/// With the reclaimer on, its first pass is this list: it starts when the reconcile is done, as
/// this one would, and its `snapshot list` lands in the kept facts the same way (every call
/// does, `recording`), so a second list at the same moment would only double what cocoon reads
/// while the node starts serving.
fn learn_snapshots(p: &CocoonProvider) {
    if p.cfg.timings.reclaim_interval.is_some() {
        tracing::debug!("the local snapshots are listed by the reclaimer's first pass");
        return;
    }
    let me = p.arc();
    p.spawn(async move {
        tokio::select! {
            () = me.closing.cancelled() => {}
            listed = me.ports.runtime.snapshot_list(None) => match listed {
                Ok(listed) => tracing::debug!(snapshots = listed.len(), "local snapshots listed"),
                Err(error) => {
                    tracing::warn!(%error, "cocoon snapshot list after the startup reconcile failed; creates ask for each snapshot until the reclaimer's next list")
                }
            },
        }
    });
}

enum StaleResult {
    Keep(VmRecord),
    Drop,
    Orphan(VmRecord),
    Watch,
}

async fn stale_create(p: &CocoonProvider, vm: &VmRecord) -> StaleResult {
    let outcome = p.ports.runtime.reconcile_stale_create(&vm.id).await;
    let label = match &outcome {
        Ok(o) => stale_label(o),
        Err(_) => "error",
    };
    p.metrics.stale_create_reconcile.with_label_values(&[label]).inc();
    match reconcile::stale_step(&outcome) {
        StaleStep::Drop => StaleResult::Drop,
        StaleStep::Watch => {
            tracing::warn!(vm = %vm.id, outcome = ?outcome.as_ref().map_err(ToString::to_string), "stale create not adopted; watching it");
            StaleResult::Watch
        }
        StaleStep::Inspect => inspect_step(p.ports.runtime.as_ref(), &vm.id).await,
    }
}

fn stale_label(o: &crate::runtime::StaleCreateOutcome) -> &'static str {
    use crate::runtime::StaleCreateOutcome as O;
    match o {
        O::Collected => "collected",
        O::Busy => "busy",
        O::NotCreating => "not-creating",
        O::NotFound => "not-found",
        O::Other(_) => "error",
    }
}

async fn inspect_step(runtime: &dyn CocoonRuntime, id: &str) -> StaleResult {
    let inspected = runtime.inspect(id).await;
    let verdict = match &inspected {
        Ok(vm) => reconcile::after_inspect(Ok(Some(&vm.state))),
        Err(e) if e.is_not_found() => reconcile::after_inspect(Ok(None)),
        Err(_) => reconcile::after_inspect(Err(())),
    };
    match (verdict, inspected) {
        (InspectVerdict::Keep, Ok(vm)) => StaleResult::Keep(vm),
        (InspectVerdict::Orphan, Ok(vm)) => StaleResult::Orphan(vm),
        (InspectVerdict::Drop, _) => StaleResult::Drop,
        _ => StaleResult::Watch,
    }
}

/// The bounded watcher of a stale create: 1 s doubling to 30 s, within the budget. A create
/// that finished (`running`) is indexed by name, so the CreatePod of its pod adopts it. The
/// orphan policy applies to a record that ended otherwise (stopped, error) only while no pod
/// owns the VM: the pod's CreatePod may have adopted it in the meantime (it settles a `creating`
/// record itself and adopts it once it runs), and from then on the VM is that pod's — a stop is
/// the event watcher's to restart in place, never a reason to destroy the VM and release its
/// guest's DHCP lease under a running pod.
fn watch_stale_create(provider: &CocoonProvider, vm: VmRecord) {
    let p = provider.arc();
    provider.spawn(async move {
        let runtime: Arc<dyn CocoonRuntime> = p.ports.runtime.clone();
        let deadline = tokio::time::Instant::now() + p.cfg.timings.stale_watch_budget;
        let mut delays = Schedule::backoff(Duration::from_secs(1), Duration::from_secs(30))
            .exact()
            .delays();
        while tokio::time::Instant::now() < deadline {
            if !delays.wait_or_cancel(&p.closing).await {
                return;
            }
            if let Some((pod, _)) = p.state.pod_of_vm(&vm.id, vm.name()) {
                tracing::info!(vm = %vm.id, %pod, "stale create adopted by its pod; no longer watched");
                return;
            }
            if let Ok(StaleCreateOutcome::Collected | StaleCreateOutcome::NotFound) =
                runtime.reconcile_stale_create(&vm.id).await
            {
                return;
            }
            match inspect_step(runtime.as_ref(), &vm.id).await {
                StaleResult::Keep(current) => {
                    tracing::info!(vm = %current.id, name = %current.name(), "stale create finished; indexed for its pod's CreatePod");
                    let name = current.name().to_string();
                    p.state.index_vm(&name, current);
                    return;
                }
                StaleResult::Drop => return,
                StaleResult::Orphan(current) => {
                    match p.state.pod_of_vm(&current.id, current.name()) {
                        Some((pod, _)) => {
                            tracing::info!(vm = %current.id, %pod, state = current.state.as_str(), "stale create ended but its pod owns the vm now; left to the pod")
                        }
                        None => apply_orphan_policy(&p, &current).await,
                    }
                    return;
                }
                StaleResult::Watch => {}
            }
        }
        tracing::warn!(vm = %vm.id, "gave up watching a stale create after the budget");
    });
}

/// The orphan policy: destroy (default; the leases go with the VM), alert, keep.
async fn apply_orphan_policy(p: &CocoonProvider, vm: &VmRecord) {
    match p.cfg.orphan_policy {
        OrphanPolicy::Destroy => match p.ports.runtime.remove(&vm.id).await {
            Ok(()) => {
                tracing::info!(vm = %vm.id, name = %vm.name(), "orphan vm destroyed");
                p.release_leases(vm).await;
            }
            Err(error) => tracing::warn!(vm = %vm.id, %error, "destroying an orphan vm failed"),
        },
        OrphanPolicy::Keep => p.state.index_vm(vm.name(), vm.clone()),
        OrphanPolicy::Alert => {
            p.metrics.orphan_vm.inc();
            tracing::warn!(vm = %vm.id, name = %vm.name(), "orphan vm: no pod claims it (VK_ORPHAN_POLICY=alert keeps it)");
            p.state.index_vm(vm.name(), vm.clone());
        }
    }
}
