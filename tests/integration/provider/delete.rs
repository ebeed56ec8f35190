//! DeletePod end to end: snapshot-before-destroy and `:latest` push with the base image, a
//! failed push keeps the VM and the delete retries (`DECISIONS.md` row 3), snapshot cleanup and the
//! keep-snapshot-on-delete flag.

use crate::provider_support;

use std::sync::atomic::Ordering;

use provider_support::*;

async fn wait_ready(env: &Env, name: &str) {
    eventually(60, &format!("{name} ready"), || {
        lifecycle(env, name).as_deref() == Some("ready")
    })
    .await;
}

/// Lifecycle: L45, L48, L49.
/// Checklist rows: create_test/DeletePodRemovesAndForgetsVM,
/// delete_test/SnapshotsARunningVMBeforeRemovingIt
#[tokio::test(flavor = "multi_thread")]
async fn delete_saves_and_pushes_latest_with_the_base_image_then_removes_the_vm_and_snapshots() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-d", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    assert!(vm_named(&env, "vm-d").await.is_some());
    delete(&env, "agent-0").await;
    eventually(60, "pod finalized", || get(&env, "agent-0").is_none()).await;
    assert_eq!(
        registry.pushes.lock().unwrap().clone(),
        vec![("vm-d".to_string(), "latest".to_string(), "base".to_string())]
    );
    assert_eq!(
        registry.annotations("vm-d", "latest").unwrap()["cocoonstack.snapshot.baseimage"],
        "base"
    );
    assert!(vm_named(&env, "vm-d").await.is_none(), "vm removed");
    assert!(
        env.runtime.snapshot_inspect("vm-d").await.unwrap_err().is_not_found(),
        "local snapshot dropped"
    );
    let rm: Vec<_> = calls(&env, "snapshot rm")
        .into_iter()
        .filter_map(|a| a.last().cloned())
        .collect();
    assert!(
        rm.contains(&"vm-d".to_string()) && rm.contains(&"fork-vm-d".to_string()),
        "{rm:?}"
    );
    // Save happened before the remove.
    let order: Vec<String> = env
        .sim
        .calls()
        .unwrap()
        .into_iter()
        .map(|c| c.verb)
        .filter(|v| v == "snapshot save" || v == "vm rm")
        .collect();
    assert_eq!(
        order.iter().rev().take(2).rev().cloned().collect::<Vec<_>>(),
        vec!["snapshot save", "vm rm"]
    );
    d.kill().await;
}

/// Lifecycle: L46.
/// Checklist rows: delete_test/KeepsTheVMWhenTheSnapshotFails
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_push_keeps_the_vm_and_the_delete_retries_until_it_succeeds() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-k", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    registry.failing_pushes.store(3, Ordering::SeqCst);
    delete(&env, "agent-0").await;
    eventually(20, "DeleteKeptVM event", || has_event(&env, "agent-0", "DeleteKeptVM")).await;
    assert!(
        vm_named(&env, "vm-k").await.is_some(),
        "the VM is kept while its state is not saved"
    );
    assert!(
        get(&env, "agent-0").is_some(),
        "the pod stays until the delete succeeds"
    );
    eventually(60, "pod finalized after the registry recovers", || {
        get(&env, "agent-0").is_none()
    })
    .await;
    assert_eq!(registry.failing_pushes.load(Ordering::SeqCst), 0);
    assert!(registry.has("vm-k", "latest"));
    assert!(vm_named(&env, "vm-k").await.is_none());
    d.kill().await;
}

/// Lifecycle: L48.
/// Checklist rows: delete_test/SnapshotRetention
#[tokio::test(flavor = "multi_thread")]
async fn snapshot_policy_never_skips_the_save_and_keep_flag_keeps_the_local_snapshot() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed(
            "never-0",
            "vm-n",
            &[
                ("cocoonset.cocoonstack.io/image", "base"),
                ("cocoonset.cocoonstack.io/snapshot-policy", "never"),
            ],
        ),
    )
    .await;
    create(
        &env,
        &managed(
            "keep-0",
            "vm-keep",
            &[
                ("cocoonset.cocoonstack.io/image", "base"),
                ("cocoonset.cocoonstack.io/snapshot-policy", "never"),
                ("vm.cocoonstack.io/keep-snapshot-on-delete", "true"),
            ],
        ),
    )
    .await;
    wait_ready(&env, "never-0").await;
    wait_ready(&env, "keep-0").await;
    // A warm-wake cache of vm-keep on this node.
    let keep_vm = vm_named(&env, "vm-keep").await.unwrap();
    env.runtime.snapshot_save("vm-keep", &keep_vm.id).await.unwrap();
    delete(&env, "never-0").await;
    delete(&env, "keep-0").await;
    eventually(60, "both finalized", || {
        get(&env, "never-0").is_none() && get(&env, "keep-0").is_none()
    })
    .await;
    assert!(registry.pushes.lock().unwrap().is_empty(), "policy never: no push");
    assert!(vm_named(&env, "vm-n").await.is_none() && vm_named(&env, "vm-keep").await.is_none());
    assert!(
        env.runtime.snapshot_inspect("vm-keep").await.is_ok(),
        "keep-snapshot-on-delete keeps the local snapshot"
    );
    d.kill().await;
}

/// A delete that cocoon refuses outright (here its own name rule, as for a VM made under a name
/// cocoon no longer accepts) keeps the VM, but is not retried as if it could succeed: the pod
/// says it waits for an operator and what to do, and it finishes once the cause is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_cocoon_refuses_outright_waits_for_an_operator_and_says_what_to_do() {
    let env = env(true).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-p", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    let id = vm_named(&env, "vm-p").await.unwrap().id;
    env.sim
        .inject_failure("snapshot save", 1, "Error: invalid snapshot name \"vm-p\"", 1)
        .unwrap();
    delete(&env, "agent-0").await;
    eventually(60, "the kept VM's Event says the delete waits for an operator", || {
        events(&env, "agent-0").iter().any(|(reason, note)| {
            reason == "DeleteKeptVM"
                && note.contains("cannot succeed on a retry")
                && note.contains(&format!("cocoon vm rm {id}"))
                && note.ends_with("the VM is kept and the delete waits for an operator")
        })
    })
    .await;
    assert!(vm_named(&env, "vm-p").await.is_some(), "the VM is kept");
    // The operator's re-check finds the cause gone (the failure happened once): the delete ends.
    eventually(60, "pod finalized", || get(&env, "agent-0").is_none()).await;
    assert!(vm_named(&env, "vm-p").await.is_none());
    d.kill().await;
}

/// The next `verb` whose arguments include `arg` fails once with cocoon's `stderr` text (exit 1:
/// a failure a retry may clear).
fn fail_once_on(env: &Env, verb: &str, arg: &str, stderr: &str) {
    env.sim
        .add_fault(cocoon_sim::Fault {
            verb: verb.into(),
            match_arg: Some(arg.into()),
            times: Some(1),
            action: cocoon_sim::FaultAction::Fail {
                stdout: String::new(),
                stderr: stderr.into(),
                exit_code: 1,
            },
        })
        .unwrap();
}

/// A DHCP guest `vm` (cloned behind the daemon's back, its lease in cocoon-net's file) and
/// managed pod `pod` for it with snapshot policy `never` (nothing to save or push); its MAC.
/// Both exist before the daemon starts, so its startup reconcile adopts the VM rather than
/// destroying it as an orphan.
async fn dhcp_pod(env: &Env, pod: &str, vm: &str) -> String {
    seed_snapshot(env, "base", "ghcr.io/x/base:1").await;
    let record = clone_direct_on(&env.runtime, "base", vm, Some("dhcp-net")).await;
    let mac = record.primary_mac().expect("the NIC has a MAC").to_ascii_lowercase();
    write_leases(env, &[(&mac, "127.22.0.17")]);
    create(
        env,
        &managed(
            pod,
            vm,
            &[
                ("cocoonset.cocoonstack.io/image", "base"),
                ("cocoonset.cocoonstack.io/network", "dhcp-net"),
                ("cocoonset.cocoonstack.io/snapshot-policy", "never"),
            ],
        ),
    )
    .await;
    mac
}

/// A `vm rm` that fails keeps the VM and with it its lease: cocoon-net is asked to release the
/// MAC only once the retried delete has removed the VM (the witness checks, at the release,
/// that no VM holds the MAC any more).
/// Checklist rows: delete_test/DoesNotReleaseLeaseWhenVMRemovalFails
/// Lifecycle: L47.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_vm_removal_keeps_the_lease_until_the_retried_removal_succeeds() {
    let env = env(false).await;
    let mac = dhcp_pod(&env, "dhcp-0", "vm-dhcp").await;
    let witness = LeaseWitness::new(&env);
    let d = start(
        &env,
        Options {
            releaser: Some(witness.clone()),
            ..Default::default()
        },
    );
    wait_ready(&env, "dhcp-0").await;
    let id = vm_named(&env, "vm-dhcp").await.unwrap().id;
    fail_once_on(&env, "vm rm", &id, "Error: vm busy: stop timed out");
    delete(&env, "dhcp-0").await;
    eventually(60, "pod finalized after the retried removal", || {
        get(&env, "dhcp-0").is_none()
    })
    .await;
    assert_eq!(
        d.provider.metrics().lifecycle_count("delete", "failed", ""),
        1,
        "the first removal failed and kept the VM"
    );
    let removals = calls(&env, "vm rm").into_iter().filter(|a| a.contains(&id)).count();
    assert_eq!(removals, 2, "removed on the retry");
    witness.assert_no_breach();
    assert_eq!(witness.released(), vec![mac], "released once, after the removal");
    assert!(vm_named(&env, "vm-dhcp").await.is_none());
    d.kill().await;
}

/// cocoon-net refusing the release does not hold the delete back or bring anything back: the
/// pod is finalized, its VM stays gone and nothing boots again (the lease's expiry is
/// cocoon-net's fallback).
/// Checklist rows: delete_test/LeaseReleaseFailureDoesNotResurrectVM
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_lease_release_finishes_the_delete_and_boots_nothing() {
    let env = env(false).await;
    let mac = dhcp_pod(&env, "dhcp-0", "vm-dhcp").await;
    let witness = LeaseWitness::new(&env);
    witness.failing.store(true, Ordering::SeqCst);
    let d = start(
        &env,
        Options {
            releaser: Some(witness.clone()),
            ..Default::default()
        },
    );
    wait_ready(&env, "dhcp-0").await;
    let boots = calls(&env, "vm clone").len() + calls(&env, "vm run").len();
    delete(&env, "dhcp-0").await;
    eventually(60, "pod finalized", || get(&env, "dhcp-0").is_none()).await;
    assert_eq!(witness.released(), vec![mac], "the release was asked for");
    witness.assert_no_breach();
    let m = d.provider.metrics();
    assert_eq!(m.lease_release.with_label_values(&["failed"]).get(), 1);
    assert_eq!(m.lifecycle_count("delete", "ok", ""), 1, "the delete succeeded once");
    assert!(vms(&env).await.is_empty(), "no VM left or brought back");
    assert_eq!(
        calls(&env, "vm clone").len() + calls(&env, "vm run").len(),
        boots,
        "nothing booted after the delete"
    );
    d.kill().await;
}

/// A snapshot-before-destroy that cannot look at the VM (`vm inspect` fails) or cannot save it
/// keeps the VM and says so; the retried delete saves, pushes and only then removes it.
/// Checklist rows: delete_test/KeepsTheVMWhenTheSnapshotFails
/// Lifecycle: L46.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_inspect_or_save_before_the_delete_keeps_the_vm_and_the_retry_saves_it() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-f", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    let id = vm_named(&env, "vm-f").await.unwrap().id;
    fail_once_on(&env, "vm inspect", &id, "Error: cloud-hypervisor API timeout");
    fail_once_on(
        &env,
        "snapshot save",
        &id,
        "Error: pause vm: cloud-hypervisor API timeout",
    );
    delete(&env, "agent-0").await;
    let needle = format!("inspect vm {id} before delete");
    eventually(60, "the failed inspect kept the VM", || {
        events(&env, "agent-0")
            .iter()
            .any(|(reason, note)| reason == "DeleteKeptVM" && note.contains(&needle))
    })
    .await;
    eventually(60, "pod finalized", || get(&env, "agent-0").is_none()).await;
    // One kept VM for the failed inspect, one for the failed save (their Events share a reason,
    // so the second is a repeat of the first).
    assert_eq!(d.provider.metrics().lifecycle_count("delete", "failed", ""), 2);
    // Nothing was removed before the one save that worked was pushed.
    let order: Vec<String> = env
        .sim
        .calls()
        .unwrap()
        .into_iter()
        .filter(|c| c.argv.contains(&id) && matches!(c.verb.as_str(), "snapshot save" | "vm rm"))
        .map(|c| c.verb)
        .collect();
    // The first save is the failed one.
    assert_eq!(order, vec!["snapshot save", "snapshot save", "vm rm"]);
    assert_eq!(
        registry.pushes.lock().unwrap().clone(),
        vec![("vm-f".to_string(), "latest".to_string(), "base".to_string())]
    );
    d.kill().await;
}

/// The keep-snapshot-on-delete flag is read from the pod as it is when the delete runs: an
/// operator who sets it on a running pod (a seat release) keeps the local snapshot.
/// Checklist rows: delete_test/ReadsAKeepFlagRefreshedFromTheInformer
#[tokio::test(flavor = "multi_thread")]
async fn a_keep_flag_set_after_the_create_keeps_the_local_snapshot() {
    let env = env(true).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-kf", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    annotate(
        &env,
        "agent-0",
        &[("vm.cocoonstack.io/keep-snapshot-on-delete", Some("true"))],
    )
    .await;
    delete(&env, "agent-0").await;
    eventually(60, "pod finalized", || get(&env, "agent-0").is_none()).await;
    assert!(vm_named(&env, "vm-kf").await.is_none(), "the VM is removed");
    assert!(
        env.runtime.snapshot_inspect("vm-kf").await.is_ok(),
        "the flag set after the create keeps the snapshot saved at the delete"
    );
    let rm: Vec<_> = calls(&env, "snapshot rm")
        .into_iter()
        .filter_map(|a| a.last().cloned())
        .collect();
    assert!(!rm.contains(&"vm-kf".to_string()), "{rm:?}");
    d.kill().await;
}

/// A delete of an older incarnation of the pod (same name, another UID) leaves the live
/// incarnation's VM alone: the stale delete is a no-op.
/// Checklist rows: delete_test/SkipsASupersededIncarnation
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_of_a_superseded_incarnation_leaves_the_live_vm_alone() {
    use vk_cocoon::kubelet::Provider as _;
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-inc", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    let saves = calls(&env, "snapshot save").len();
    let mut stale = get(&env, "agent-0").unwrap();
    stale.metadata.uid = Some("an-older-incarnation".into());
    d.provider
        .delete_pod(&std::sync::Arc::new(stale))
        .await
        .expect("a superseded delete succeeds as a no-op");
    assert!(
        vm_named(&env, "vm-inc").await.is_some_and(|v| v.state.is_running()),
        "the live incarnation's VM stays"
    );
    assert!(
        calls(&env, "snapshot save").len() == saves && registry.pushes.lock().unwrap().is_empty(),
        "no save or push for the stale delete"
    );
    assert_eq!(lifecycle(&env, "agent-0").as_deref(), Some("ready"));
    assert!(ready(&env, "agent-0"), "the live pod stays Ready");
    d.kill().await;
}

/// An unmanaged pod's VM belongs to someone else: a hibernate request on it is a no-op, and its
/// delete only forgets the pod — no save, no push, no removal, no lease release.
/// Lifecycle: L50, L63. Checklist rows: delete_test/LeavesAnUnmanagedVMAlone
#[tokio::test(flavor = "multi_thread")]
async fn an_unmanaged_vm_is_never_hibernated_saved_or_removed() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    let witness = LeaseWitness::new(&env);
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let ext = clone_direct_on(&env.runtime, "base", "ext-vm", None).await;
    let ip = ext.primary_ip().unwrap().to_string();
    create(
        &env,
        &agent_pod(
            "ext-0",
            &[
                ("vm.cocoonstack.io/name", "ext-vm"),
                ("vm.cocoonstack.io/id", &ext.id),
                ("vm.cocoonstack.io/ip", &ip),
            ],
        ),
    )
    .await;
    // Started once the pod exists: its startup reconcile finds the VM claimed, not an orphan.
    let d = start(
        &env,
        Options {
            releaser: Some(witness.clone()),
            ..Default::default()
        },
    );
    wait_ready(&env, "ext-0").await;
    let before = env.sim.calls().unwrap().len();
    annotate(&env, "ext-0", &[("vm.cocoonstack.io/hibernate", Some("true"))]).await;
    // The update is handled before the delete (one pod's events are handled in order): had it
    // hibernated the VM, the calls below would show it.
    delete(&env, "ext-0").await;
    eventually(60, "pod finalized", || get(&env, "ext-0").is_none()).await;
    let after: Vec<String> = env.sim.calls().unwrap()[before..]
        .iter()
        .map(|c| c.verb.clone())
        .filter(|v| v != "vm list" && v != "vm inspect")
        .collect();
    assert!(
        !after
            .iter()
            .any(|v| matches!(v.as_str(), "snapshot save" | "vm rm" | "vm net" | "vm exec" | "vm stop")),
        "cocoon was asked to act on an unmanaged VM: {after:?}"
    );
    assert!(registry.pushes.lock().unwrap().is_empty(), "nothing pushed");
    assert!(witness.released().is_empty(), "no lease released");
    assert!(
        vm_named(&env, "ext-vm").await.is_some_and(|v| v.state.is_running()),
        "the unmanaged VM keeps running"
    );
    assert_eq!(d.provider.metrics().lifecycle_count("delete", "ok", ""), 1);
    d.kill().await;
}
