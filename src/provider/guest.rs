//! Finishing a boot, after a create or a wake:
//! start the readiness probe, then — in the background, so CreatePod returns — run the guest
//! fixup the `guest-fixup` policy asks for over `cocoon vm exec` (every 3 s within 180 s),
//! wait for the guest's DHCP lease (45 s), and only then publish Ready. An exhausted fixup
//! leaves the pod Running / Not Ready with the commands as a base64 hint (`DECISIONS.md` row 1).

use std::collections::BTreeMap;
use std::time::Instant;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use tracing::Instrument as _;

use super::CocoonProvider;
use super::lifecycle::{self, LifecycleState};
use super::metrics::ProviderMetrics;
use crate::kubelet::{EventReason, EventType};
use crate::model::annotations as key;
use crate::model::{pod_facts, vm_spec};
use crate::policy::contract::guest_fixup::{BootOrigin, Facts, Fixup, Nic, Outcome};
use crate::policy::contract::types::RefusalKind;
use crate::policy::slots::GuestFixup;
use crate::policy::slots::guest_fixup::kind_label;
use crate::retry::Schedule;
use crate::runtime::{ExecSpec, VmRecord};

/// What a booted VM still needs before Ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Finish {
    /// Nothing in the guest (run path, unmanaged, an adopted VM that is done): Ready now.
    ReadyNow,
    /// Ask the guest-fixup policy, run what it says, wait for the lease, then Ready.
    Fixup { origin: BootOrigin, source_image: String },
    /// Wait for a fresh lease, then Ready (a cloud-hypervisor Windows wake: its NIC is new).
    LeaseWait,
    /// A resumed lease wait of a Windows guest: first its static addresses at the console, as
    /// after a run (the Go daemon wrote the fixup's `done` before its console pass, so a `done`
    /// it left does not prove the pass ran; setting the same addresses again is idempotent),
    /// then the lease wait.
    ConsoleThenLeaseWait,
}

impl Finish {
    /// The fixup of a VM whose boot is being finished after the fact (a restart, an adoption):
    /// the clone source's image is no longer known, the guest-fixup policy reads the overlay.
    pub(super) fn resumed_fixup() -> Self {
        Finish::Fixup {
            origin: BootOrigin::Clone,
            source_image: String::new(),
        }
    }

    /// The lease wait a restart or an adoption resumes (the fixup marker says `done`): a Windows
    /// guest's console pass is set again first.
    pub(super) fn resumed_lease_wait(spec: &crate::model::VmSpec) -> Self {
        if spec.os == crate::policy::contract::types::GuestOs::Windows {
            Finish::ConsoleThenLeaseWait
        } else {
            Finish::LeaseWait
        }
    }
}

/// How the fixup ended.
enum Fixed {
    /// Done, or nothing to do: go on to the lease wait.
    Proceed,
    /// Refused or exhausted; the pod is already reported failed.
    Failed,
}

/// `post-clone-state` values (persisted so a restart resumes or parks the fixup).
const STATE_RUNNING: &str = "running";
const STATE_DONE: &str = "done";
const STATE_FAILED: &str = "failed";

/// Starts the probe of the pod's VM and whatever finishing the boot needs. `wake` marks a
/// restore from hibernate (it counts in `cocoon_vk_wake_total` when it ends).
pub(super) async fn finish_boot(p: &CocoonProvider, pod: &Pod, pkey: &str, vm: &VmRecord, finish: Finish, wake: bool) {
    finish_boot_after(p, pod, pkey, vm, finish, wake, async {}).await;
}

/// [`finish_boot`] of a boot whose runtime annotations are still being written (`written`):
/// the write runs beside the first probe, and the guest work and Ready start only once it
/// ended. The rule this keeps: the annotations naming the pod's VM land before anything acts
/// in the guest (the fixup) or says Ready; the first probe only reads the guest's address, so
/// it need not wait for them (an apiserver round trip off a create's critical path).
pub(super) async fn finish_boot_after(
    p: &CocoonProvider,
    pod: &Pod,
    pkey: &str,
    vm: &VmRecord,
    finish: Finish,
    wake: bool,
    written: impl std::future::Future<Output = ()>,
) {
    let uid = super::table::uid_of(pod);
    // The guest work is registered before the first await: a CreatePod of the same adopted pod
    // arriving while the probe starts (the restart's resume and the pod controller both finish
    // it) then sees the work running and does not run the fixup or console pass twice.
    let work = (finish != Finish::ReadyNow).then(|| p.state.begin_guest_work(pkey, &uid));
    // `written` is polled first: the tracked copy of the pod has the annotations before the
    // probe reads it.
    let first_probe =
        super::probe_start::start_probe(p, pkey, &uid).instrument(tracing::debug_span!("boot.first_probe"));
    tokio::join!(written, first_probe);
    let Some(work) = work else {
        p.metrics.wake_ended(wake, true);
        super::publish::publish_ready(p, pod, pkey).await;
        return;
    };
    let (owner, pod, key, vm) = (p.arc(), pod.clone(), pkey.to_string(), vm.clone());
    p.spawn(async move {
        let p = &*owner;
        let stop = work.stop.clone();
        tokio::select! {
            _ = stop.cancelled() => tracing::info!(pod = %key, vm = %vm.id, "guest work stopped"),
            _ = p.closing.cancelled() => {}
            _ = guest_work(p, &pod, &key, &vm, finish, wake) => {}
        }
        p.state.end_guest_work(&key, &work);
    });
    p.notify(pkey);
}

async fn guest_work(p: &CocoonProvider, pod: &Pod, pkey: &str, vm: &VmRecord, finish: Finish, wake: bool) {
    if let Finish::Fixup { origin, source_image } = &finish
        && let Fixed::Failed = fixup(p, pod, pkey, vm, *origin, source_image, wake).await
    {
        return;
    }
    // The guest-fixup policy's answer after a run is a Windows guest's console addresses only.
    if finish == Finish::ConsoleThenLeaseWait
        && let Fixed::Failed = fixup(p, pod, pkey, vm, BootOrigin::Run, "", wake).await
    {
        return;
    }
    // A run boots with its own network configuration: Ready needs no lease wait (the probe
    // still gates it), as before the fixup policy was asked after a run.
    if matches!(
        finish,
        Finish::Fixup {
            origin: BootOrigin::Run,
            ..
        }
    ) {
        super::publish::publish_ready(p, pod, pkey).await;
        return;
    }
    ready_after_lease(p, pod, pkey, vm, wake).await;
}

fn fixup_facts(p: &CocoonProvider, pod: &Pod, vm: &VmRecord, origin: BootOrigin, source_image: &str) -> Facts {
    let hypervisor = vm_spec::backend_of(&vm.hypervisor);
    // cocoon's run directory per hypervisor (cloud-hypervisor is its default).
    let backend_dir = match hypervisor {
        crate::policy::contract::types::Backend::Firecracker => "firecracker",
        _ => "cloudhypervisor",
    };
    let overlay = p.cfg.run_dir.join(backend_dir).join(&vm.id).join("overlay.qcow2");
    Facts {
        pod: pod_facts(pod),
        spec: vm_spec::of_pod(pod),
        vm_id: vm.id.clone(),
        hypervisor,
        nics: vm
            .network_configs
            .iter()
            .map(|n| Nic {
                mac: n.mac.trim().to_ascii_lowercase(),
                ip: n.network.as_ref().map(|x| x.ip.clone()).unwrap_or_default(),
                gateway: n.network.as_ref().map(|x| x.gateway.clone()).unwrap_or_default(),
                prefix: n.network.as_ref().map(|x| x.prefix).unwrap_or_default(),
            })
            .collect(),
        origin,
        source_image: source_image.to_string(),
        cloudimg_overlay: overlay.exists(),
    }
}

/// Asks the guest-fixup policy and runs its answer. A `retry-later` refusal is asked again
/// every `fixup_interval` within the fixup budget; any other refusal fails at once.
async fn fixup(
    p: &CocoonProvider,
    pod: &Pod,
    pkey: &str,
    vm: &VmRecord,
    origin: BootOrigin,
    source_image: &str,
    wake: bool,
) -> Fixed {
    let op = if wake { "wake" } else { "create" };
    let t = &p.cfg.timings;
    // Asked again every `fixup_interval` while a next ask still starts within the budget.
    let mut asks = Schedule::every(t.fixup_interval).within(t.fixup_budget).delays();
    loop {
        let facts = fixup_facts(p, pod, vm, origin, source_image);
        let decision = match p.decide(move |p| p.decide::<GuestFixup>(&facts)).await {
            Ok(d) => d,
            Err(e) => {
                super::publish::fail_op(
                    p,
                    pod,
                    pkey,
                    EventReason::PostClonePolicyUnavailable,
                    op,
                    &e.to_string(),
                )
                .await;
                return Fixed::Failed;
            }
        };
        tracing::info!(pod = %pkey, vm = %vm.id, reason = %decision.reason, message = %decision.message, "guest-fixup decision");
        let refusal = match decision.outcome {
            Outcome::None => return Fixed::Proceed,
            Outcome::Run(fixup) => return run_fixup(p, pod, pkey, vm, &fixup, op, wake).await,
            Outcome::Refuse(refusal) => refusal,
        };
        if refusal.kind == RefusalKind::RetryLater {
            tracing::info!(pod = %pkey, vm = %vm.id, "guest-fixup policy asks to be asked again later");
            if asks.wait().await {
                continue;
            }
        }
        set_post_clone_state(p, pod, pkey, STATE_FAILED).await;
        p.metrics.wake_ended(wake, false);
        let f = super::failure::Failure::refused(refusal, decision.message);
        super::publish::fail_op(p, pod, pkey, f.reason, op, &f.message).await;
        return Fixed::Failed;
    }
}

/// The fixup: its command (one `vm exec` per attempt, `fixup_interval` apart, within
/// `fixup_budget`), then its console addresses; `post-clone-state` is `done` only once both
/// are (a restart in between runs the fixup again: the command and the addresses are
/// idempotent).
async fn run_fixup(
    p: &CocoonProvider,
    pod: &Pod,
    pkey: &str,
    vm: &VmRecord,
    fixup: &Fixup,
    op: &str,
    wake: bool,
) -> Fixed {
    set_post_clone_state(p, pod, pkey, STATE_RUNNING).await;
    let attempts = if fixup.argv.is_empty() {
        0
    } else {
        match exec_fixup(p, pod, pkey, vm, fixup, op, wake).await {
            Ok(attempts) => attempts,
            Err(failed) => return failed,
        }
    };
    if !fixup.console_addresses.is_empty()
        && let Fixed::Failed = set_console_addresses(p, pod, pkey, vm, fixup, op, wake).await
    {
        return Fixed::Failed;
    }
    set_post_clone_state(p, pod, pkey, STATE_DONE).await;
    let failed = p.state.intent(pkey).is_some_and(|i| i.state == LifecycleState::Failed);
    if !failed {
        p.ports.events.record(
            pod,
            EventType::Normal,
            EventReason::PostCloneSucceeded,
            format!("kind={} attempts={attempts}", kind_label(fixup.kind)),
        );
    }
    Fixed::Proceed
}

/// Runs the fixup's command until it succeeds within the budget: `Ok(attempts)`.
async fn exec_fixup(
    p: &CocoonProvider,
    pod: &Pod,
    pkey: &str,
    vm: &VmRecord,
    fixup: &Fixup,
    op: &str,
    wake: bool,
) -> Result<u32, Fixed> {
    let t = &p.cfg.timings;
    let spec = ExecSpec {
        argv: fixup.argv.clone(),
        ..Default::default()
    };
    let started = Instant::now();
    // One `vm exec` every `fixup_interval` while a next one still starts within the budget.
    let mut tries = Schedule::every(t.fixup_interval).within(t.fixup_budget).delays();
    let mut errors: Vec<String> = Vec::new();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let left = t.fixup_budget.saturating_sub(started.elapsed());
        let result = match tokio::time::timeout(left, p.ports.runtime.exec_capture(&vm.id, &spec, None)).await {
            Ok(Ok(out)) if out.code == 0 => Ok(()),
            Ok(Ok(out)) => Err(format!(
                "exit {}: {}",
                out.code,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("vm exec did not finish within the {:?} budget", t.fixup_budget)),
        };
        match result {
            Ok(()) => {
                p.metrics
                    .postclone
                    .with_label_values(&[kind_label(fixup.kind), "ok"])
                    .inc();
                p.metrics
                    .postclone_retry_attempts
                    .with_label_values(&["ok"])
                    .observe(f64::from(attempt));
                return Ok(attempt);
            }
            Err(error) => {
                tracing::warn!(pod = %pkey, vm = %vm.id, attempt, %error, "guest fixup attempt failed");
                p.ports.events.record(
                    pod,
                    EventType::Warning,
                    EventReason::PostCloneExecAttemptFailed,
                    lifecycle::truncate(&format!("attempt {attempt}: {error}"), lifecycle::MAX_EVENT_NOTE),
                );
                errors.push(format!("attempt {attempt}: {error}"));
                if !tries.wait().await {
                    return Err(fixup_exhausted(p, pod, pkey, fixup, op, wake, attempt, &errors).await);
                }
            }
        }
    }
}

/// Sets the fixup's static addresses through the VM's serial console (Windows' SAC),
/// counted as kind `sac`. A failure fails the lifecycle (`WindowsStaticIPFailed`, after the
/// failed step's own Warning): the guest has no address to be reached at.
async fn set_console_addresses(
    p: &CocoonProvider,
    pod: &Pod,
    pkey: &str,
    vm: &VmRecord,
    fixup: &Fixup,
    op: &str,
    wake: bool,
) -> Fixed {
    let console = p.cfg.run_dir.join("cloudhypervisor").join(&vm.id).join("console.sock");
    let nics = vm.network_configs.len();
    let result = match fixup.console_addresses.iter().find(|a| a.nic as usize >= nics) {
        Some(a) => Err(super::sac::SacError::Set {
            command: format!("NIC {}", a.nic),
            detail: format!("the VM has {nics} NICs: the guest-fixup policy named one it does not have"),
            cause: None,
        }),
        None => super::sac::set_addresses(&console, nics, &fixup.console_addresses, &p.cfg.timings.sac).await,
    };
    match result {
        Ok(()) => {
            p.metrics.postclone.with_label_values(&["sac", "ok"]).inc();
            tracing::info!(pod = %pkey, vm = %vm.id, addresses = fixup.console_addresses.len(), "static addresses set through the serial console");
            Fixed::Proceed
        }
        Err(e) => {
            p.metrics.postclone.with_label_values(&["sac", "failed"]).inc();
            p.metrics.wake_ended(wake, false);
            p.ports.events.record(
                pod,
                EventType::Warning,
                e.reason(),
                lifecycle::truncate(&e.to_string(), lifecycle::MAX_EVENT_NOTE),
            );
            set_post_clone_state(p, pod, pkey, STATE_FAILED).await;
            let message = format!(
                "setting the static addresses of vm {} through its serial console: {e}; set them by hand at the SAC> prompt (kubectl attach) and recreate the pod",
                vm.id
            );
            super::publish::fail_op(p, pod, pkey, EventReason::WindowsStaticIpFailed, op, &message).await;
            p.notify(pkey);
            Fixed::Failed
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn fixup_exhausted(
    p: &CocoonProvider,
    pod: &Pod,
    pkey: &str,
    fixup: &Fixup,
    op: &str,
    wake: bool,
    attempts: u32,
    errors: &[String],
) -> Fixed {
    p.metrics
        .postclone
        .with_label_values(&[kind_label(fixup.kind), "failed"])
        .inc();
    p.metrics
        .postclone_retry_attempts
        .with_label_values(&["failed"])
        .observe(f64::from(attempts));
    p.metrics.wake_ended(wake, false);
    set_post_clone_state(p, pod, pkey, STATE_FAILED).await;
    let joined = errors.join("; ");
    let hint = base64::engine::general_purpose::STANDARD.encode(fixup.hint.as_bytes());
    let changes = BTreeMap::from([
        (key::POST_CLONE_HINT.to_string(), Some(hint)),
        (
            key::POST_CLONE_ERRORS.to_string(),
            Some(lifecycle::truncate(&joined, lifecycle::MAX_MESSAGE)),
        ),
    ]);
    super::publish::write_annotations(p, pod, pkey, &changes).await;
    let message = format!(
        "guest fixup ({}) failed {attempts} times within {:?}: {joined}; the commands are in {} (base64); recreate the pod after repairing the guest",
        kind_label(fixup.kind),
        p.cfg.timings.fixup_budget,
        key::POST_CLONE_HINT
    );
    super::publish::fail_op(p, pod, pkey, EventReason::PostCloneExecExhausted, op, &message).await;
    p.notify(pkey);
    Fixed::Failed
}

/// Persists the fixup progress; `failed` is final.
async fn set_post_clone_state(p: &CocoonProvider, pod: &Pod, pkey: &str, value: &str) {
    let uid = super::table::uid_of(pod);
    let current = p.state.tracked_as(pkey, &uid).and_then(|t| {
        t.pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key::POST_CLONE_STATE).cloned())
    });
    if current.as_deref() == Some(STATE_FAILED) || current.as_deref() == Some(value) {
        return;
    }
    super::publish::write_annotations(
        p,
        pod,
        pkey,
        &BTreeMap::from([(key::POST_CLONE_STATE.to_string(), Some(value.to_string()))]),
    )
    .await;
}

/// `markReadyAfterIP`: wait for the guest's lease (one `ipconfig /renew` nudge for a Windows
/// guest after `renew_nudge_after`), then publish Ready — if the boot is still current.
async fn ready_after_lease(p: &CocoonProvider, pod: &Pod, pkey: &str, vm: &VmRecord, wake: bool) {
    let t = &p.cfg.timings;
    let uid = super::table::uid_of(pod);
    let windows = super::invariants::renew_nudge(&vm_spec::of_pod(pod));
    let started = Instant::now();
    let mut polls = Schedule::every(t.ip_poll).delays();
    let mut nudged = false;
    let ip = loop {
        let Some(current) = p
            .state
            .tracked_as(pkey, &uid)
            .and_then(|t| t.vm)
            .filter(|v| v.id == vm.id)
        else {
            tracing::info!(pod = %pkey, vm = %vm.id, "lease wait abandoned: the pod's vm changed");
            return;
        };
        let ip = p.resolve_ip(&current);
        if !ip.is_empty() {
            break Some(ip);
        }
        if windows && !nudged && started.elapsed() >= t.renew_nudge_after {
            nudged = true;
            let left = t.ip_wait.saturating_sub(started.elapsed());
            let ok = matches!(tokio::time::timeout(left, p.ports.runtime.exec_capture(&vm.id, &super::plan::ipconfig(super::plan::LeaseStep::Renew, p.cfg.network_mode), None)).await, Ok(Ok(ref out)) if out.code == 0);
            ProviderMetrics::count(&p.metrics.wake_renew_nudge, ok);
            continue;
        }
        if started.elapsed() >= t.ip_wait {
            break None;
        }
        polls.wait().await;
    };
    match ip {
        Some(ip) => {
            if let Some(tracked) = p.state.tracked_as(pkey, &uid) {
                super::endpoint::reconcile_endpoint(p, &tracked.pod, pkey, vm).await;
            }
            if super::publish::publish_ready_guarded(p, pkey, &uid, &vm.id).await {
                tracing::info!(pod = %pkey, vm = %vm.id, %ip, "guest has its lease: ready");
                p.metrics.wake_ip_wait.with_label_values(&["ok"]).inc();
                p.metrics.wake_ended(wake, true);
            }
        }
        None => {
            let Some(tracked) = p.state.tracked_as(pkey, &uid) else {
                return;
            };
            if tracked.vm.as_ref().is_none_or(|v| v.id != vm.id) || vm_spec::of_pod(&tracked.pod).hibernate {
                return;
            }
            let what = if wake { "wake" } else { "clone" };
            let message = format!(
                "{what} {}: dhcp lease not observed within {:?}",
                tracked.vm_name, t.ip_wait
            );
            p.metrics.wake_ip_wait.with_label_values(&["timeout"]).inc();
            p.metrics.wake_ended(wake, false);
            let reason = if wake {
                EventReason::WakeIpWaitTimeout
            } else {
                EventReason::PostCloneIpWaitTimeout
            };
            super::publish::fail_op(p, &tracked.pod, pkey, reason, what, &message).await;
            p.notify(pkey);
        }
    }
}
