//! CreatePod (the Go code's order: runtime annotations first, guest work after; `DECISIONS.md` row
//! 5): decode, admit, claim, adopt or gather evidence, ask the bring-up policy, execute its plan,
//! write the runtime annotations, then finish the boot (probe; guest fixup and lease wait in the
//! background; Ready only when the probe and the lifecycle agree). A failure boots no VM, leaves a
//! Warning Event and lifecycle `failed` with the message, and drops the provisional row so the
//! retry is a fresh create. A pod that asks to stay hibernated boots nothing.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use tracing::Instrument as _;

use super::CocoonProvider;
use super::bring_up::{Ctx, adopted_finish, bring_up, hibernate_evidence};
use super::failed_ops::fail_create;
use super::failure::Failure;
use super::guest::Finish;
use super::guest_os;
use super::hibernate::{SavedGuest, saved_guest};
use super::invariants;
use super::lifecycle::LifecycleState;
use super::ownership;
use crate::kubelet::{EventReason, Next, ProviderError};
use crate::model::vm_spec::VmSpecError;
use crate::model::{RuntimeAnnotations, VmSpec, pod_facts, vm_spec};
use crate::policy::contract::cpu_class_admission::AdmissionContext;
use crate::policy::contract::types::BootMode;
use crate::runtime::VmRecord;

pub(super) async fn create(p: &CocoonProvider, pod: &Arc<Pod>) -> Result<Next, ProviderError> {
    let facts = pod_facts(pod);
    let key = facts.key();
    let uid = facts.uid.clone();

    // 1. The VM spec: it names the VM, and every name and id it hands cocoon follows cocoon's
    // rules (nothing runs for a pod that names a path or a command).
    let runtime = RuntimeAnnotations::of_pod(pod);
    let checked = vm_spec::require_vm_name(vm_spec::of_pod(pod))
        .and_then(|spec| vm_spec::check_names(&spec, &runtime.vm_id).map(|()| spec));
    let spec = match checked {
        Ok(spec) => spec,
        Err(e) => {
            let (reason, result, label, message) = match &e {
                VmSpecError::MissingVmName => (
                    EventReason::MissingVmName,
                    "skipped",
                    "missing_vmname",
                    format!("pod {key} missing vm.cocoonstack.io/name annotation ({e})"),
                ),
                _ => (
                    EventReason::InvalidVmSpec,
                    "failed",
                    "invalid_vm_spec",
                    format!("pod {key}: {e}"),
                ),
            };
            p.metrics.lifecycle("create", result, label);
            p.state.track(&key, pod, "");
            super::publish::report_failure(p, pod, &key, reason, "create", &message).await;
            p.state.untrack(&key, &uid);
            return Err(ProviderError::Rejected { reason, message });
        }
    };
    // The guest's OS, chosen once: where its path differs from the cocoon bring-up.
    let guest = guest_os::for_spec(&spec);

    // 2. CPU-class admission.
    // The stages of a create are debug spans named `create.*` (and `bring_up.*`, `boot.*`,
    // `policy.*` below): a profile reads when each starts and ends (the `provider_scale`
    // bench's stage table); with no subscriber at debug level they cost a disabled check.
    let admitted = p
        .admission(&facts, AdmissionContext::Create)
        .instrument(tracing::debug_span!("create.admission"))
        .await?;
    if let Err(f) = admitted {
        p.metrics.lifecycle("create", "failed", admission_label(&f));
        p.state.track(&key, pod, &spec.vm_name);
        super::publish::report_failure(p, pod, &key, f.reason, "create", &f.message).await;
        p.state.untrack(&key, &uid);
        return Err(f.to_provider_error());
    }
    if p.state.resume_claimed(&key) {
        return Err(ProviderError::Transient(format!(
            "resumed operation still in flight for {key}"
        )));
    }

    // A pod the startup reconcile already tracks with its VM: finish what it is owed.
    if let Some(vm) = p.state.tracked_as(&key, &uid).and_then(|t| t.vm) {
        if let Some(own) = guest.adopt_tracked(p, pod, &key, &vm).await {
            return own;
        }
        return adopt_tracked(p, pod, &key, &spec, vm).await;
    }

    // 3. Claim the incarnation. A VM another live pod holds is never this pod's: not by its
    // name, nor (unmanaged) by a pre-assigned id or address.
    p.state.track(&key, pod, &spec.vm_name);
    let held = ownership::refuse_held_name(p, &key, &spec.vm_name)
        .and_then(|()| ownership::refuse_held_preassigned(p, &key, &spec, &runtime.vm_id, &runtime.ip));
    if let Err(f) = held {
        return fail_create(p, &key, pod, false, f).await;
    }
    // Still part of step 1, once claimed: a guest with a path of its own (os=macos: the
    // self-contained cocoon-macos path) takes it.
    if let Some(own) = guest.create(p, pod, &key, &spec, &facts).await {
        return own;
    }
    if spec.managed && spec.hibernate {
        return stay_hibernated(p, pod, &key, &spec).await.map(|()| Next::Done);
    }
    let ctx = Ctx { pod, facts, spec };
    // `creating` is staged before the bring-up starts and written while it runs: the write is
    // an apiserver round trip the clone need not wait for. Both end before anything else is
    // written for the pod (the runtime annotations, or the failure), so the pod's lifecycle
    // writes still land in the order they were made.
    let creating = super::publish::set_lifecycle(p, pod, &key, LifecycleState::Creating, "")
        .instrument(tracing::debug_span!("create.creating_write"));
    let bringing_up = async {
        // The bring-up's cocoon work waits for one of the node's turns; the probe and the guest
        // work after it do not hold one (they wait on the guest, not on cocoon).
        let turn = p.bring_ups.take().instrument(tracing::debug_span!("create.turn")).await;
        let waited_ms = turn.waited.as_millis() as u64;
        let started = Instant::now();
        let brought = bring_up(p, &ctx).await;
        drop(turn);
        (brought, waited_ms, started)
    };
    let (_, (brought, waited_ms, started)) = tokio::join!(creating, bringing_up);
    let up = match brought {
        Ok(v) => v,
        Err(e) => return fail_create(p, &key, pod, e.restoring(), e.into_failure()).await,
    };
    let spec = &ctx.spec;
    let mode = if up.restoring || spec.mode != BootMode::Run {
        "clone"
    } else {
        "run"
    };
    if !up.adopted {
        p.metrics
            .vm_boot_duration
            .with_label_values(&[mode, invariants::backend_label(&spec.backend)])
            .observe(started.elapsed().as_secs_f64());
    }

    // 5.–6. IP and runtime annotations, before any guest work.
    let vm = up.vm;
    let ip = p.resolve_ip(&vm);
    let recorded = tracing::debug_span!("create.set_vm").in_scope(|| p.state.set_vm(&key, &uid, vm.clone()));
    if !recorded {
        tracing::info!(pod = %key, "create finished for a superseded incarnation");
        return Ok(Next::Done);
    }
    tracing::info!(pod = %key, vm = %spec.vm_name, id = %vm.id, %ip, restoring = up.restoring, waited_ms, "vm up");
    let written = async {
        if spec.managed {
            super::publish::write_runtime(p, pod, &key, &vm.id, &ip)
                .instrument(tracing::debug_span!("create.runtime_write"))
                .await;
        }
    };
    // 7. The probe (its first one beside the runtime write), then Ready now or after the guest
    // work, both only once the write ended.
    super::guest::finish_boot_after(p, pod, &key, &vm, up.finish, up.restoring, written)
        .instrument(tracing::debug_span!("create.finish_boot"))
        .await;
    p.metrics
        .lifecycle("create", "ok", if up.adopted { "adopted" } else { "" });
    Ok(Next::Done)
}

/// The `reason` label of a CPU-class rejection: a mismatch, or the admission policy that
/// failed (its fail-safe rejection is not a mismatch).
pub(super) fn admission_label(f: &Failure) -> &'static str {
    if f.reason == EventReason::SnapshotCpuClassMismatch {
        "snapshot_cpu_class_mismatch"
    } else {
        "admission_policy_failed"
    }
}

/// CreatePod of a pod the startup reconcile adopted: hibernate it if that is asked, leave guest
/// work that is already running alone, else finish the boot the way the restart owes it.
async fn adopt_tracked(
    p: &CocoonProvider,
    pod: &Arc<Pod>,
    key: &str,
    spec: &VmSpec,
    vm: VmRecord,
) -> Result<Next, ProviderError> {
    p.state.refresh(key, pod);
    let mut next = Next::Done;
    if spec.managed && spec.hibernate {
        next = super::owed::hibernate_or_owe(p, pod, key).await;
    } else if p.state.guest_work_running(key) {
        p.notify(key);
    } else {
        // What is owed is read from the tracked copy: guest work the startup resumed may have
        // finished since, its markers written there but not yet on the pod this CreatePod got.
        let current = p
            .state
            .tracked_as(key, &super::table::uid_of(pod))
            .map_or_else(|| Arc::clone(pod), |t| t.pod);
        let finish = if spec.managed {
            adopted_finish(p, &current, spec).await
        } else {
            Finish::ReadyNow
        };
        super::guest::finish_boot(p, pod, key, &vm, finish, false).await;
    }
    p.metrics.lifecycle("create", "ok", "adopted");
    Ok(next)
}

/// CreatePod of a pod asking to be hibernated (`vm.cocoonstack.io/hibernate: "true"`): nothing
/// boots. With a hibernate snapshot it reports `hibernated`; without one there is nothing to
/// resume and it says so; when the evidence cannot be read the create retries.
async fn stay_hibernated(p: &CocoonProvider, pod: &Pod, key: &str, spec: &VmSpec) -> Result<(), ProviderError> {
    let uid = super::table::uid_of(pod);
    let vm = spec.vm_name.as_str();
    if p.state
        .intent(key)
        .is_some_and(|i| i.uid == uid && i.state == LifecycleState::Hibernated)
    {
        p.state.mark_hibernated(key, &uid);
        p.notify(key);
        return Ok(());
    }
    match saved_guest(hibernate_evidence(p, vm).await) {
        SavedGuest::Saved => {
            p.state.mark_hibernated(key, &uid);
            super::publish::set_lifecycle(p, pod, key, LifecycleState::Hibernated, "").await;
            p.notify(key);
            Ok(())
        }
        SavedGuest::Unknown(error) => {
            let f = Failure::transient(
                EventReason::HibernateEvidenceUnavailable,
                format!("hibernate evidence for {vm}: {error}; retrying"),
            );
            fail_create(p, key, pod, false, f).await
        }
        SavedGuest::Absent => {
            let message = format!(
                "vm {vm}: hibernate requested but no VM runs here and no hibernate snapshot exists, so there is nothing to resume; clear vm.cocoonstack.io/hibernate to boot it"
            );
            super::publish::fail_op(p, pod, key, EventReason::HibernateSnapshotMissing, "create", &message).await;
            p.notify(key);
            Ok(())
        }
    }
}
