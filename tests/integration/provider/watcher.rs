//! The VM event watcher end to end (cocoon-sim's `vm status --event` stream): a VM deleted
//! behind the daemon's back evicts its pod on the stream's next report; a stopped VM is started again in
//! place, and one that stops again within the cooldown is removed and its pod evicted; a VM
//! whose state stays undecidable is removed and its pod evicted when the budget runs out.

use crate::provider_support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cocoon_sim::{Fault, FaultAction, Flip};
use provider_support::*;

const IMAGE: &str = "cocoonset.cocoonstack.io/image";
const NETWORK: &str = "cocoonset.cocoonstack.io/network";

async fn ready_pod(env: &Env, pod: &str, vm: &str, extra: &[(&str, &str)]) {
    let mut a = vec![(IMAGE, "base")];
    a.extend_from_slice(extra);
    create(env, &managed(pod, vm, &a)).await;
    eventually(30, &format!("{pod} ready"), || {
        lifecycle(env, pod).as_deref() == Some("ready") && ready(env, pod)
    })
    .await;
}

/// Waits until the daemon's event stream has reported VM `id` in `state`: a change made after
/// this is seen on the stream's next poll (made before, the stream might never see it).
async fn stream_reports(env: &Env, id: &str, state: &str) {
    eventually(20, &format!("the event stream reports {id} {state}"), || {
        env.sim.stream_reports(id, state).unwrap()
    })
    .await;
}

fn deleting(env: &Env, name: &str) -> bool {
    get(env, name).is_none_or(|p| p.metadata.deletion_timestamp.is_some())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vm_deleted_out_of_band_evicts_its_pod_on_the_next_event_and_releases_its_lease() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let releaser = Arc::new(RecordingReleaser::default());
    let d = start(
        &env,
        Options {
            releaser: Some(releaser.clone()),
            ..Default::default()
        },
    );
    create(
        &env,
        &managed("agent-0", "vm-gone", &[(IMAGE, "base"), (NETWORK, "dhcp-net")]),
    )
    .await;
    eventually(20, "vm up", || {
        annotation(&env, "agent-0", "vm.cocoonstack.io/id").is_some()
    })
    .await;
    let vm = vm_named(&env, "vm-gone").await.unwrap();
    let mac = vm.primary_mac().unwrap().to_string();
    write_leases(&env, &[(&mac, "127.0.0.31")]);
    eventually(20, "ready", || ready(&env, "agent-0")).await;
    stream_reports(&env, &vm.id, "running").await;

    let history = PodHistory::record(&env, "agent-0");
    let killed = Instant::now();
    env.sim.flip_vm("vm-gone", Flip::Deleted).unwrap();
    // The stream's next poll (100 ms here) reports it; the eviction follows at once. How soon is
    // printed, not asserted: a loaded machine stretches it, and wall-clock speed is for benches.
    eventually(10, "pod evicted", || deleting(&env, "agent-0")).await;
    eprintln!("evicted {:?} after the VM vanished", killed.elapsed());
    eventually(20, "pod finalized", || get(&env, "agent-0").is_none()).await;
    assert_eq!(
        history.final_failure().await,
        Some(("VMGone".to_string(), "vm no longer exists".to_string()))
    );
    eventually(10, "VMGone event", || has_event(&env, "agent-0", "VMGone")).await;
    assert_eq!(
        releaser.released.lock().unwrap().clone(),
        vec![mac],
        "the lease goes with the VM"
    );
    assert!(calls(&env, "vm start").is_empty(), "a deleted VM is not restarted");
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_vm_restarts_in_place_and_a_second_stop_within_the_cooldown_evicts() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-stop", &[]).await;
    let id = vm_named(&env, "vm-stop").await.unwrap().id;
    stream_reports(&env, &id, "running").await;

    env.sim.flip_vm("vm-stop", Flip::Stopped).unwrap();
    eventually(10, "vm started again", || {
        calls(&env, "vm start").iter().any(|a| a.last() == Some(&id))
    })
    .await;
    eventually(10, "running again", || {
        env.sim.vm_state(&id).unwrap().as_deref() == Some("running")
    })
    .await;
    eventually(10, "VMRestarted event", || has_event(&env, "agent-0", "VMRestarted")).await;
    assert!(!deleting(&env, "agent-0"), "a restarted VM keeps its pod");
    eventually(20, "ready again", || ready(&env, "agent-0")).await;
    assert_eq!(
        vm_named(&env, "vm-stop").await.unwrap().id,
        id,
        "restarted in place, not recreated"
    );

    // Stopping again within 30 s of the restart: removed, pod evicted. (The stream must have
    // reported the restart first, or it would see stopped → stopped: no change.)
    stream_reports(&env, &id, "running").await;
    let history = PodHistory::record(&env, "agent-0");
    env.sim.flip_vm("vm-stop", Flip::Stopped).unwrap();
    eventually(10, "pod evicted", || deleting(&env, "agent-0")).await;
    eventually(20, "pod finalized", || get(&env, "agent-0").is_none()).await;
    assert_eq!(
        history.final_failure().await.map(|f| f.0).as_deref(),
        Some("RestartCooldown")
    );
    assert!(vm_named(&env, "vm-stop").await.is_none(), "the VM was removed");
    assert_eq!(
        calls(&env, "vm start").iter().filter(|a| a.last() == Some(&id)).count(),
        1,
        "no second restart"
    );
    d.kill().await;
}

/// Checklist rows: create_test/HandleVMGoneDeferredRecheckHitsBudgetAndEvicts,
/// eviction_test/VMGoneEvictionContinuesPastInspectBudget
#[tokio::test(flavor = "multi_thread")]
async fn an_inspect_that_stays_inconclusive_ends_in_removal_and_eviction_after_the_budget() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-dark", &[]).await;
    let id = vm_named(&env, "vm-dark").await.unwrap().id;
    stream_reports(&env, &id, "running").await;

    // cocoon cannot tell: every inspect of this VM fails inconclusively.
    let fault = FaultAction::Fail {
        stdout: String::new(),
        stderr: "Error: dial meta store: connection refused".into(),
        exit_code: 1,
    };
    env.sim
        .add_fault(Fault {
            verb: "vm inspect".into(),
            match_arg: Some(id.clone()),
            times: None,
            action: fault,
        })
        .unwrap();
    let history = PodHistory::record(&env, "agent-0");
    let started = Instant::now();
    env.sim.flip_vm("vm-dark", Flip::Error).unwrap();
    // The daemon has handled the event: both inline inspects failed and a recheck is scheduled.
    let rechecks = &d.provider.metrics().vm_inspect_transient_fail;
    eventually(20, "the inconclusive inspect sent to the deferred recheck", || {
        rechecks.get() >= 1
    })
    .await;
    assert!(
        calls(&env, "vm inspect").iter().filter(|a| a.contains(&id)).count() >= 2,
        "two inline inspects first"
    );
    assert!(!deleting(&env, "agent-0"), "an inconclusive inspect is not a verdict");
    eventually(20, "evicted after the recheck budget", || deleting(&env, "agent-0")).await;
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "not before the 4 s test budget: {:?}",
        started.elapsed()
    );
    eventually(20, "pod finalized", || get(&env, "agent-0").is_none()).await;
    assert_eq!(
        history.final_failure().await.map(|f| f.0).as_deref(),
        Some("VMInspectTimeout")
    );
    assert!(
        env.sim.vm_state(&id).unwrap().is_none(),
        "the undecidable VM was removed"
    );
    d.kill().await;
}

/// Checklist rows: create_test/HandleVMGoneDeferredRecheckEvictsOnceDefinitive
#[tokio::test(flavor = "multi_thread")]
async fn a_transient_inspect_failure_is_rechecked_and_a_definitive_answer_evicts() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-flaky", &[]).await;
    let id = vm_named(&env, "vm-flaky").await.unwrap().id;
    stream_reports(&env, &id, "running").await;

    let fault = FaultAction::Fail {
        stdout: String::new(),
        stderr: "Error: database is locked".into(),
        exit_code: 1,
    };
    env.sim
        .add_fault(Fault {
            verb: "vm inspect".into(),
            match_arg: Some(id.clone()),
            times: Some(3),
            action: fault,
        })
        .unwrap();
    let history = PodHistory::record(&env, "agent-0");
    env.sim.flip_vm("vm-flaky", Flip::Deleted).unwrap();
    eventually(20, "evicted once cocoon answers", || deleting(&env, "agent-0")).await;
    eventually(20, "pod finalized", || get(&env, "agent-0").is_none()).await;
    assert_eq!(history.final_failure().await.map(|f| f.0).as_deref(), Some("VMGone"));
    d.kill().await;
}

/// Every `vm inspect` of `id` fails inconclusively: `times` times, or for good (`None`).
fn inspect_fails(env: &Env, id: &str, times: Option<u32>) {
    env.sim
        .add_fault(Fault {
            verb: "vm inspect".into(),
            match_arg: Some(id.into()),
            times,
            action: FaultAction::Fail {
                stdout: String::new(),
                stderr: "Error: database is locked".into(),
                exit_code: 1,
            },
        })
        .unwrap();
}

/// One inconclusive inspect is retried at once, before any deferred recheck: the second
/// answer (stopped) is acted on right away and the VM is started again in place, its pod kept.
/// Checklist rows: create_test/HandleVMGoneInlineRetryRecoversFromTransient
#[tokio::test(flavor = "multi_thread")]
async fn one_failed_inspect_is_retried_inline_and_the_stopped_vm_restarts_in_place() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-blip", &[]).await;
    let id = vm_named(&env, "vm-blip").await.unwrap().id;
    stream_reports(&env, &id, "running").await;
    let before = calls(&env, "vm inspect").iter().filter(|a| a.contains(&id)).count();
    inspect_fails(&env, &id, Some(1));
    env.sim.flip_vm("vm-blip", Flip::Stopped).unwrap();
    eventually(10, "vm started again", || {
        calls(&env, "vm start").iter().any(|a| a.last() == Some(&id))
    })
    .await;
    assert_eq!(
        d.provider.metrics().vm_inspect_transient_fail.get(),
        0,
        "no deferred recheck: the inline retry answered"
    );
    let inspects = calls(&env, "vm inspect").iter().filter(|a| a.contains(&id)).count() - before;
    assert!(inspects >= 2, "the failed inspect and its inline retry: {inspects}");
    assert!(!deleting(&env, "agent-0"), "the pod stays tracked");
    eventually(20, "ready again", || ready(&env, "agent-0")).await;
    d.kill().await;
}

/// Closing the provider stops a deferred recheck: the VM whose state cannot be learned is not
/// removed and its pod not evicted when the recheck budget (4 s here) runs out after the close.
/// Checklist rows: create_test/ProviderCloseStopsDeferredRecheck
#[tokio::test(flavor = "multi_thread")]
async fn closing_the_provider_stops_a_deferred_recheck() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-closing", &[]).await;
    let id = vm_named(&env, "vm-closing").await.unwrap().id;
    stream_reports(&env, &id, "running").await;
    inspect_fails(&env, &id, None);
    env.sim.flip_vm("vm-closing", Flip::Error).unwrap();
    let rechecks = &d.provider.metrics().vm_inspect_transient_fail;
    eventually(20, "a deferred recheck scheduled", || rechecks.get() >= 1).await;
    d.provider.close();
    let closed = Instant::now();
    let inspects = || calls(&env, "vm inspect").iter().filter(|a| a.contains(&id)).count();
    // A recheck in flight at the close may finish its one inspect; none starts after it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let settled = inspects();
    // Absence can only be shown by waiting: past the whole budget, nothing more happened.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(closed.elapsed())).await;
    assert_eq!(inspects(), settled, "no inspect after the close");
    assert!(
        calls(&env, "vm rm").iter().all(|a| !a.contains(&id)),
        "the VM is not removed"
    );
    assert!(!deleting(&env, "agent-0"), "the pod is not evicted");
    d.kill().await;
}

/// An eviction the apiserver refuses keeps the pod's state (tracked, not Failed on its own) and
/// is retried in the background until the apiserver takes it.
/// Checklist rows: create_test/EvictPodKeepsStateOnAPIFailure,
/// eviction_test/VMRemovalEvictionRetriesAfterAPIRecovery
#[tokio::test(flavor = "multi_thread")]
async fn an_eviction_the_apiserver_refuses_keeps_the_pod_and_is_retried() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-ev", &[]).await;
    let id = vm_named(&env, "vm-ev").await.unwrap().id;
    stream_reports(&env, &id, "running").await;
    // Both inline delete attempts fail, and the first background one.
    env.server
        .inject_fault(Some(axum::http::Method::DELETE), "/pods/agent-0", 500, 3);
    let history = PodHistory::record(&env, "agent-0");
    env.sim.flip_vm("vm-ev", Flip::Deleted).unwrap();
    let failures = &d.provider.metrics().pod_evict_failure;
    eventually(20, "the eviction failed and went to the background", || {
        failures.get() >= 1
    })
    .await;
    assert!(!deleting(&env, "agent-0"), "the apiserver has not taken the delete yet");
    assert!(
        !events(&env, "agent-0").iter().any(|(r, _)| r == "VMGone"),
        "not reported evicted before the apiserver took the delete"
    );
    eventually(30, "evicted once the apiserver answers", || deleting(&env, "agent-0")).await;
    eventually(20, "pod finalized", || get(&env, "agent-0").is_none()).await;
    assert_eq!(history.final_failure().await.map(|f| f.0).as_deref(), Some("VMGone"));
    d.kill().await;
}

/// An eviction whose delete finds the pod already gone (404) is done: the pod is reported
/// Failed for the VM's loss, and the delete is neither retried nor counted a failure.
/// Checklist rows: create_test/EvictPodIdempotentOnNotFound
#[tokio::test(flavor = "multi_thread")]
async fn an_eviction_that_finds_the_pod_gone_is_done_not_retried() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-nf", &[]).await;
    let id = vm_named(&env, "vm-nf").await.unwrap().id;
    stream_reports(&env, &id, "running").await;
    env.server
        .inject_fault(Some(axum::http::Method::DELETE), "/pods/agent-0", 404, 1);
    env.sim.flip_vm("vm-nf", Flip::Deleted).unwrap();
    eventually(20, "reported evicted", || has_event(&env, "agent-0", "VMGone")).await;
    eventually(20, "published Failed", || {
        phase(&env, "agent-0").as_deref() == Some("Failed")
    })
    .await;
    assert_eq!(d.provider.metrics().pod_evict_failure.get(), 0, "not a failure");
    let deletes = env
        .server
        .requests()
        .into_iter()
        .filter(|r| r.method == "DELETE" && r.path.ends_with("/pods/agent-0"))
        .count();
    assert_eq!(deletes, 1, "one delete, not retried");
    d.kill().await;
}
