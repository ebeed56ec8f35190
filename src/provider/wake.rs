//! Waking a hibernated guest (the hibernate annotation cleared, no VM):
//! UpdatePod clears the runtime annotations, asks the bring-up policy (a wake is an explicit
//! restore: evidence fails closed, the image ref must match) and runs the one restore of
//! [`super::bring_up::restore`]; never an unverified copy and never a fresh boot. The daemon
//! never deletes the `:hibernate` tag: the operator does once the woken VM runs.

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::bring_up::{self, Ctx, bring_up_facts, hibernate_evidence, restore, restore_finish};
use super::failure::Failure;
use super::invariants;
use super::lifecycle::LifecycleState;
use crate::kubelet::{EventReason, EventType};
use crate::model::{pod_facts, vm_spec};
use crate::policy::contract::bring_up::{Outcome, Plan};
use crate::policy::contract::types::RefusalKind;

/// UpdatePod "true → false" for a pod whose guest is hibernated. `Err(kind)` when it
/// failed (reported on the pod): what a retry owed by the caller can do.
pub(super) async fn wake(p: &CocoonProvider, pod: &Pod, pkey: &str) -> Result<(), RefusalKind> {
    let facts = pod_facts(pod);
    let spec = vm_spec::of_pod(pod);
    if spec.vm_name.is_empty() {
        return Ok(());
    }
    super::publish::set_lifecycle(p, pod, pkey, LifecycleState::Creating, "").await;
    super::publish::clear_runtime(p, pod, pkey).await;

    // A wake is an explicit restore: the bring-up policy guards it (evidence fails closed,
    // the image ref must match) and picks its clone options.
    let evidence = hibernate_evidence(p, &spec.vm_name).await;
    let mut wake_spec = spec.clone();
    wake_spec.restore_from_hibernate = true;
    let facts_for_policy = bring_up_facts(p, pod, &facts, &wake_spec, false, evidence, Vec::new());
    let decision = match bring_up::decide(p, facts_for_policy, pkey, "wake decision").await {
        Ok(d) => d,
        Err(f) => return wake_failed(p, pod, pkey, f).await,
    };
    let options = match decision.outcome {
        Outcome::Proceed(Plan::RestoreFromHibernate(restore_plan)) => restore_plan.options,
        // Host invariant: only a restore can wake a hibernated guest, never a fresh boot.
        Outcome::Proceed(plan) => {
            let message = format!(
                "the bring-up policy answered {plan:?} for waking vm {}; only a restore from its hibernate snapshot can wake a hibernated guest",
                spec.vm_name
            );
            return wake_failed(p, pod, pkey, Failure::transient(EventReason::WakeRefused, message)).await;
        }
        Outcome::Refuse(refusal) => {
            return wake_failed(p, pod, pkey, Failure::refused(refusal, decision.message)).await;
        }
    };

    let ctx = Ctx {
        pod,
        facts,
        spec: spec.clone(),
    };
    let started = Instant::now();
    let (vm, label) = match restore(p, &ctx, &options, None).await {
        Ok(v) => v,
        Err(f) => return wake_failed(p, pod, pkey, f).await,
    };
    p.metrics
        .vm_boot_duration
        .with_label_values(&["clone", invariants::backend_label(&spec.backend)])
        .observe(started.elapsed().as_secs_f64());
    let uid = super::table::uid_of(pod);
    if !p.state.set_vm(pkey, &uid, vm.clone()) {
        tracing::info!(pod = %pkey, "wake finished for a superseded incarnation");
        return Ok(());
    }
    let ip = p.resolve_ip(&vm);
    super::publish::write_runtime(p, pod, pkey, &vm.id, &ip).await;
    tracing::info!(pod = %pkey, vm = %spec.vm_name, id = %vm.id, %ip, source = %label, "guest woken");
    p.ports.events.record(
        pod,
        EventType::Normal,
        EventReason::Woken,
        format!("cloned from {label}"),
    );
    super::guest::finish_boot(p, pod, pkey, &vm, restore_finish(&spec), true).await;
    Ok(())
}

async fn wake_failed(p: &CocoonProvider, pod: &Pod, pkey: &str, f: Failure) -> Result<(), RefusalKind> {
    p.metrics.wake_ended(true, false);
    super::publish::fail_op(p, pod, pkey, f.reason, "wake", &f.message).await;
    Err(f.kind)
}
