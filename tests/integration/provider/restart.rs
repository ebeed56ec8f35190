//! Startup reconcile and restarts end to end: adoption by id and by name, the orphan policy,
//! a CPU-class mismatch keeps the node unregistered, a daemon killed mid-create converges with
//! no duplicate and no lost VM, and 100 pods created and deleted concurrently.

use crate::provider_support;

use k8s_openapi::api::core::v1::Node;
use provider_support::*;
use vk_cocoon::provider::reconcile::OrphanPolicy;

async fn wait_ready(env: &Env, name: &str) {
    eventually(60, &format!("{name} ready"), || {
        lifecycle(env, name).as_deref() == Some("ready")
    })
    .await;
}

async fn clone_direct(env: &Env, snapshot: &str, name: &str) -> vk_cocoon::runtime::VmRecord {
    clone_direct_on(&env.runtime, snapshot, name, None).await
}

/// Checklist rows: create_test/StartupReconcileAdoptsAnnotatedPods,
/// create_test/StartupReconcileOrphanDestroyRemovesUnmatchedVM,
/// create_test/StartupReconcileAdoptsByVMNameWhenAnnotationMissing
#[tokio::test(flavor = "multi_thread")]
async fn restart_adopts_by_id_and_by_name_and_destroys_orphans() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("a", "vm-a", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "a").await;
    d.kill().await;

    // While the daemon is down: a VM whose create finished but whose pod never got its id, and an orphan.
    let b = clone_direct(&env, "base", "vm-b").await;
    create(
        &env,
        &managed(
            "b",
            "vm-b",
            &[
                ("cocoonset.cocoonstack.io/image", "base"),
                ("vm.cocoonstack.io/lifecycle-state", "creating"),
            ],
        ),
    )
    .await;
    let orphan = clone_direct(&env, "base", "vm-orphan").await;
    let clones_before = calls(&env, "vm clone").len();

    let d = start(&env, Options::default());
    wait_ready(&env, "b").await;
    assert_eq!(
        annotation(&env, "b", "vm.cocoonstack.io/id").as_deref(),
        Some(b.id.as_str()),
        "runtime annotation repaired"
    );
    eventually(10, "orphan destroyed", || {
        env.sim.vm_state(&orphan.id).unwrap().is_none()
    })
    .await;
    assert_eq!(d.provider.metrics().reconcile_adopt_by_name.get(), 1);
    wait_ready(&env, "a").await;
    assert_eq!(calls(&env, "vm clone").len(), clones_before, "nothing re-created");
    let names: Vec<String> = vms(&env).await.iter().map(|v| v.name().to_string()).collect();
    assert_eq!(names.iter().filter(|n| *n == "vm-a").count(), 1);
    assert_eq!(names.iter().filter(|n| *n == "vm-b").count(), 1);
    d.kill().await;
}

/// Checklist rows: create_test/StartupReconcileOrphanAlertIndexesByName,
/// create_test/StartupReconcileOrphanKeepIndexesByName
#[tokio::test(flavor = "multi_thread")]
async fn alert_and_keep_leave_orphans_running() {
    for policy in [OrphanPolicy::Alert, OrphanPolicy::Keep] {
        let env = env(false).await;
        seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
        let orphan = clone_direct(&env, "base", "vm-orphan").await;
        let d = start(
            &env,
            Options {
                orphan: policy,
                ..Default::default()
            },
        );
        eventually(10, "node registered", || {
            env.server.store().get_as::<Node>(None, NODE).is_some()
        })
        .await;
        assert_eq!(
            env.sim.vm_state(&orphan.id).unwrap().as_deref(),
            Some("running"),
            "{policy:?}"
        );
        assert_eq!(
            d.provider.metrics().orphan_vm.get(),
            u64::from(policy == OrphanPolicy::Alert)
        );
        // A pod for that VM name adopts it.
        create(
            &env,
            &managed("late", "vm-orphan", &[("cocoonset.cocoonstack.io/image", "base")]),
        )
        .await;
        wait_ready(&env, "late").await;
        assert_eq!(
            annotation(&env, "late", "vm.cocoonstack.io/id").as_deref(),
            Some(orphan.id.as_str())
        );
        d.kill().await;
    }
}

/// Lifecycle: L3.
/// Checklist rows: reconcile_test/StartupReconcileRejectsIncompatibleBoundPod
#[tokio::test(flavor = "multi_thread")]
async fn a_cpu_class_mismatch_at_startup_keeps_the_node_unregistered() {
    let env = env(false).await;
    let mut pod = managed("classy", "vm-c", &[("cocoonset.cocoonstack.io/image", "base")]);
    pod.spec.as_mut().unwrap().node_selector =
        Some([("cocoonstack.io/snapshot-cpu-class".to_string(), "spr".to_string())].into());
    create(&env, &pod).await;
    let mut d = start(
        &env,
        Options {
            node_class: "icx".into(),
            ..Default::default()
        },
    );
    let result = tokio::time::timeout(std::time::Duration::from_secs(20), &mut d.task)
        .await
        .expect("the node stops")
        .unwrap();
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("startup compatibility check") && err.contains("spr"),
        "{err}"
    );
    assert!(
        env.server.store().get_as::<Node>(None, NODE).is_none(),
        "the node never registers"
    );
}

/// Checklist rows: reconcile_test/SkeletonCollectedNotAdopted
#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_killed_mid_create_converges_without_duplicates() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    // cocoon dies inside the clone (a `creating` record is left) and the daemon is killed with it.
    // The create finds the record at once (the refused clone asks); settling it stays
    // undecidable here, so the daemon is killed while the record is left.
    env.sim.die_next("vm clone", 0).unwrap();
    env.sim
        .inject_failure(
            "vm reconcile-stale-create",
            1000,
            "Error: cannot reach the meta store",
            1,
        )
        .unwrap();
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("k", "vm-k", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    eventually(20, "the clone died, leaving its creating record", || {
        env.sim.vm_state("vm-k").unwrap().as_deref() == Some("creating")
    })
    .await;
    d.kill().await;
    assert!(
        vms(&env).await.iter().any(|v| v.name() == "vm-k"),
        "a stale record is left behind"
    );
    env.sim.clear_faults().unwrap();

    let d = start(&env, Options::default());
    wait_ready(&env, "k").await;
    let list = vms(&env).await;
    let mine: Vec<_> = list.iter().filter(|v| v.name() == "vm-k").cloned().collect();
    assert_eq!(mine.len(), 1, "exactly one VM: {list:?}");
    assert_eq!(
        annotation(&env, "k", "vm.cocoonstack.io/id").as_deref(),
        Some(mine[0].id.as_str())
    );
    d.kill().await;

    // Killed after the VM came up but before its id, IP and ready were written (the pod looks
    // exactly as it did then): adopted by name, annotations repaired, not duplicated.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(env.server.client(), "default");
    let wipe = serde_json::json!({"metadata": {"annotations": {
        "vm.cocoonstack.io/id": null, "vm.cocoonstack.io/ip": null, "vm.cocoonstack.io/lifecycle-state": "creating"}}});
    pods.patch("k", &Default::default(), &kube::api::Patch::Merge(wipe))
        .await
        .unwrap();
    let clones = calls(&env, "vm clone").len();
    let d = start(&env, Options::default());
    wait_ready(&env, "k").await;
    assert_eq!(vms(&env).await.iter().filter(|v| v.name() == "vm-k").count(), 1);
    assert_eq!(calls(&env, "vm clone").len(), clones, "adopted, not re-cloned");
    assert_eq!(
        annotation(&env, "k", "vm.cocoonstack.io/id").as_deref(),
        Some(mine[0].id.as_str())
    );
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_pods_are_created_and_deleted_concurrently() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    let names: Vec<String> = (0..100).map(|i| format!("p-{i}")).collect();
    for n in &names {
        create(
            &env,
            &managed(n, &format!("vm-{n}"), &[("cocoonset.cocoonstack.io/image", "base")]),
        )
        .await;
    }
    eventually(240, "all ready", || {
        names.iter().all(|n| lifecycle(&env, n).as_deref() == Some("ready"))
    })
    .await;
    assert_eq!(vms(&env).await.len(), 100);
    for n in &names {
        delete(&env, n).await;
    }
    eventually(240, "all finalized", || names.iter().all(|n| get(&env, n).is_none())).await;
    assert!(vms(&env).await.is_empty(), "no VM leaked");
    d.kill().await;
}

/// Checklist rows: resume_test/StartupDispatchOwedWork
#[tokio::test(flavor = "multi_thread")]
async fn a_guest_fixup_cut_by_a_restart_resumes_and_a_failed_one_stays_parked() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    // The first fixup hangs long enough for the daemon to die in the middle of it.
    env.sim.delay("vm exec", Some(1), 3_000).unwrap();
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("fix-0", "vm-fix", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    eventually(20, "fixup running", || {
        annotation(&env, "fix-0", "vm.cocoonstack.io/post-clone-state").as_deref() == Some("running")
    })
    .await;
    // Its exec took the delay (not only logged its call: one killed before taking it would
    // leave the delay to the restarted daemon's exec).
    eventually(20, "its vm exec hanging", || {
        env.sim.armed_faults("vm exec").unwrap() == 0
    })
    .await;
    d.kill().await;
    assert_eq!(lifecycle(&env, "fix-0").as_deref(), Some("creating"));

    let d = start(&env, Options::default());
    eventually(30, "the resumed fixup finished the boot", || {
        lifecycle(&env, "fix-0").as_deref() == Some("ready") && ready(&env, "fix-0")
    })
    .await;
    assert_eq!(
        annotation(&env, "fix-0", "vm.cocoonstack.io/post-clone-state").as_deref(),
        Some("done")
    );
    eventually(10, "ResumedAfterRestart op=post_clone", || {
        events(&env, "fix-0")
            .iter()
            .any(|(r, n)| r == "ResumedAfterRestart" && n == "op=post_clone")
    })
    .await;
    assert_eq!(calls(&env, "vm clone").len(), 1, "the VM was adopted, not cloned again");
    d.kill().await;

    // A fixup that was exhausted stays parked across a restart: nothing runs in the guest again.
    let env2 = env_parked().await;
    let execs = env2.sim.exec_log().unwrap().len();
    let d = start(&env2, Options::default());
    eventually(20, "adopted", || {
        d.provider
            .state()
            .tracked("default/park-0")
            .is_some_and(|t| t.vm.is_some())
    })
    .await;
    // An observation window, not synchronisation: a retried fixup would run within one interval.
    tokio::time::sleep(fast_timings().fixup_interval * 5).await;
    assert_eq!(
        env2.sim.exec_log().unwrap().len(),
        execs,
        "a parked fixup is not retried"
    );
    assert_eq!(lifecycle(&env2, "park-0").as_deref(), Some("failed"));
    d.kill().await;
}

/// An environment with pod `park-0` whose fixup was exhausted before the daemon restarted.
async fn env_parked() -> Env {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    env.sim
        .on_exec(cocoon_sim::ExecRule {
            vm: Some("vm-park".into()),
            exit_code: 9,
            ..Default::default()
        })
        .unwrap();
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("park-0", "vm-park", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    eventually(30, "exhausted", || {
        lifecycle(&env, "park-0").as_deref() == Some("failed")
    })
    .await;
    d.kill().await;
    env
}

/// A create still in progress when the daemon starts is a stale create the daemon watches.
/// Once the pod's CreatePod has adopted the VM it is the pod's: the guest stopping right after
/// is restarted in place by the event watcher — the stale-create watcher must not destroy it as
/// an orphan and release its guest's DHCP lease under the running pod (it did: a lease
/// released while its VM lived).
#[tokio::test(flavor = "multi_thread")]
async fn a_stale_create_its_pod_adopted_is_never_destroyed_as_an_orphan() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    // A clone (an earlier daemon's, say) still running when this daemon starts.
    env.sim.set_settings(|s| s.create_delay_ms = 1_500).unwrap();
    let runtime = env.runtime.clone();
    let clone = tokio::spawn(async move { clone_direct_on(&runtime, "base", "vm-s", Some("dhcp-net")).await });
    eventually(20, "the create in progress", || {
        env.sim.vm_state("vm-s").unwrap().as_deref() == Some("creating")
    })
    .await;
    // The stale-create watcher hears `busy` until the test lets it look: the interleaving of a
    // create that ends and a guest that stops right after its pod adopted it, before the
    // watcher's next tick.
    env.sim
        .add_fault(cocoon_sim::Fault {
            verb: "vm reconcile-stale-create".into(),
            match_arg: None,
            times: None,
            action: cocoon_sim::FaultAction::Fail {
                stdout: r#"{"outcome":"busy"}"#.into(),
                stderr: String::new(),
                exit_code: 0,
            },
        })
        .unwrap();
    create(
        &env,
        &managed(
            "s-0",
            "vm-s",
            &[
                ("cocoonset.cocoonstack.io/image", "base"),
                ("cocoonset.cocoonstack.io/network", "dhcp-net"),
            ],
        ),
    )
    .await;
    let releaser = std::sync::Arc::new(RecordingReleaser::default());
    let d = start(
        &env,
        Options {
            releaser: Some(releaser.clone()),
            ..Default::default()
        },
    );
    let vm = clone.await.unwrap();
    env.sim.set_settings(|s| s.create_delay_ms = 0).unwrap();
    write_leases(&env, &[(vm.primary_mac().unwrap(), "127.0.0.41")]);
    eventually(60, "the pod adopted its VM and is ready", || {
        annotation(&env, "s-0", "vm.cocoonstack.io/id").as_deref() == Some(vm.id.as_str())
            && lifecycle(&env, "s-0").as_deref() == Some("ready")
    })
    .await;
    assert!(
        calls(&env, "vm reconcile-stale-create").len() >= 2,
        "the startup reconcile took the create for a stale one and watches it"
    );

    // The guest stops; its restart in place is slow, so it is still stopped when the
    // stale-create watcher looks again (now for real).
    env.sim.delay("vm start", Some(1), 10_000).unwrap();
    env.sim.flip_vm("vm-s", cocoon_sim::Flip::Stopped).unwrap();
    eventually(20, "the event watcher restarting the VM", || {
        calls(&env, "vm start").iter().any(|a| a.contains(&vm.id))
    })
    .await;
    env.sim.clear_faults().unwrap();
    eventually(60, "the restart in place done (or the VM gone)", || {
        env.sim.vm_state(&vm.id).unwrap().as_deref() != Some("stopped")
    })
    .await;
    assert_eq!(
        env.sim.vm_state(&vm.id).unwrap().as_deref(),
        Some("running"),
        "the pod's VM was restarted in place, not destroyed"
    );
    assert!(
        releaser.released.lock().unwrap().is_empty(),
        "nothing released while the VM lives: {:?}",
        releaser.released.lock().unwrap()
    );
    assert!(get(&env, "s-0").is_some_and(|p| p.metadata.deletion_timestamp.is_none()));
    eventually(10, "VMRestarted event", || has_event(&env, "s-0", "VMRestarted")).await;
    d.kill().await;
}

/// A cloud-hypervisor Windows VM adopted by name without a fixup marker may be a fresh clone
/// (owed the network-device reset) or a restored guest (which the reset would disrupt). While
/// the registry cannot say which, the adoption runs no fresh clone's fixup: it only waits for
/// the guest's lease.
#[tokio::test(flavor = "multi_thread")]
async fn an_adopted_windows_vm_whose_evidence_cannot_be_read_gets_no_fresh_clone_reset() {
    let env = env(true).await;
    seed_windows_snapshot(&env, "winbase").await;
    let orphan = clone_direct(&env, "winbase", "vm-win").await;
    let d = start(
        &env,
        Options {
            orphan: OrphanPolicy::Keep,
            ..Default::default()
        },
    );
    eventually(10, "node registered", || {
        env.server.store().get_as::<Node>(None, NODE).is_some()
    })
    .await;
    env.registry
        .as_ref()
        .unwrap()
        .down
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let windows = [
        ("cocoonset.cocoonstack.io/image", "winbase"),
        ("cocoonset.cocoonstack.io/os", "windows"),
        ("vm.cocoonstack.io/backend", "cloud-hypervisor"),
    ];
    create(&env, &managed("win-0", "vm-win", &windows)).await;
    eventually(30, "adopted and ready", || {
        annotation(&env, "win-0", "vm.cocoonstack.io/id").as_deref() == Some(orphan.id.as_str())
            && lifecycle(&env, "win-0").as_deref() == Some("ready")
            && ready(&env, "win-0")
    })
    .await;
    let resets: Vec<_> = env
        .sim
        .exec_log()
        .unwrap()
        .into_iter()
        .filter(|e| e.argv.first().map(String::as_str) == Some("powershell"))
        .collect();
    assert!(
        resets.is_empty(),
        "a fresh clone's reset ran in a guest that may be restored: {resets:?}"
    );
    assert_eq!(calls(&env, "vm clone").len(), 1, "adopted, not cloned again");
    d.kill().await;
}

/// A clone of `vm` from `base` made behind the daemon's back, left `creating` for `delay_ms`,
/// running when this returns; the clone itself runs on until done (its task is returned).
async fn create_in_progress(
    env: &Env,
    vm: &str,
    delay_ms: u64,
) -> tokio::task::JoinHandle<vk_cocoon::runtime::VmRecord> {
    env.sim.set_settings(|s| s.create_delay_ms = delay_ms).unwrap();
    let runtime = env.runtime.clone();
    let name = vm.to_string();
    let clone = tokio::spawn(async move { clone_direct_on(&runtime, "base", &name, None).await });
    eventually(20, "the create in progress", || {
        env.sim.vm_state(vm).unwrap().as_deref() == Some("creating")
    })
    .await;
    clone
}

/// cocoon's stale-create verb answers `outcome` (or fails like an older cocoon without the
/// verb, `None`) until the faults are cleared.
fn stale_verb_answers(env: &Env, outcome: Option<&str>) {
    let action = match outcome {
        Some(o) => cocoon_sim::FaultAction::Fail {
            stdout: format!(r#"{{"outcome":"{o}"}}"#),
            stderr: String::new(),
            exit_code: 0,
        },
        None => cocoon_sim::FaultAction::Fail {
            stdout: String::new(),
            stderr: "Error: unknown command \"reconcile-stale-create\" for \"cocoon vm\"".into(),
            exit_code: 1,
        },
    };
    env.sim
        .add_fault(cocoon_sim::Fault {
            verb: "vm reconcile-stale-create".into(),
            match_arg: None,
            times: None,
            action,
        })
        .unwrap();
}

/// A create still busy at startup that then commits (creating → running) is indexed by name
/// for its pod's CreatePod — kept although no pod claims it yet and the orphan policy is
/// destroy.
/// Checklist rows: reconcile_test/BusyCreateIndexedAfterCommit
#[tokio::test(flavor = "multi_thread")]
async fn a_busy_stale_create_that_commits_is_indexed_not_destroyed() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let clone = create_in_progress(&env, "vm-c", 1_500).await;
    let d = start(&env, Options::default());
    let vm = clone.await.unwrap();
    eventually(30, "the committed create indexed by name", || {
        d.provider.state().vm_by_name("vm-c").is_some_and(|v| v.id == vm.id)
    })
    .await;
    assert!(
        calls(&env, "vm reconcile-stale-create")
            .iter()
            .any(|a| a.contains(&vm.id)),
        "the startup reconcile took it for a stale create"
    );
    assert!(
        calls(&env, "vm rm").iter().all(|a| !a.contains(&vm.id)),
        "not destroyed"
    );
    assert!(vm_named(&env, "vm-c").await.is_some_and(|v| v.state.is_running()));
    d.kill().await;
}

/// A busy create that ends in an error state is an orphan once no pod owns it: the orphan
/// policy (destroy) removes it.
/// Checklist rows: reconcile_test/BusyCreateDeadOnArrivalGetsOrphanPolicy
#[tokio::test(flavor = "multi_thread")]
async fn a_busy_stale_create_that_dies_on_arrival_gets_the_orphan_policy() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let clone = create_in_progress(&env, "vm-doa", 1_500).await;
    // The watcher hears `busy` until the record has ended in its error state.
    stale_verb_answers(&env, Some("busy"));
    let d = start(&env, Options::default());
    let vm = clone.await.unwrap();
    env.sim.flip_vm("vm-doa", cocoon_sim::Flip::Error).unwrap();
    env.sim.clear_faults().unwrap();
    // A slow removal (as on a loaded machine): the VM is gone only once the call returned, not
    // when it was recorded (the simulator records a call as it starts).
    env.sim.delay("vm rm", Some(1), 1_500).unwrap();
    eventually(60, "the dead-on-arrival VM's removal returned", || {
        let removals: Vec<u32> = env
            .sim
            .calls()
            .unwrap()
            .into_iter()
            .filter(|c| c.verb == "vm rm" && c.argv.iter().any(|a| a.contains(&vm.id)))
            .map(|c| c.pid)
            .collect();
        env.sim
            .call_ends()
            .unwrap()
            .iter()
            .any(|e| e.verb == "vm rm" && removals.contains(&e.pid))
    })
    .await;
    assert!(vm_named(&env, "vm-doa").await.is_none());
    assert!(d.provider.state().vm_by_name("vm-doa").is_none(), "not indexed");
    d.kill().await;
}

/// A create whose owner dies while the daemon watches it is collected by cocoon (the skeleton
/// goes): the daemon neither indexes nor removes anything itself.
/// Checklist rows: reconcile_test/WatchBusyCreateReclaimsAfterOwnerDies
#[tokio::test(flavor = "multi_thread")]
async fn a_stale_create_whose_owner_dies_is_collected_and_not_indexed() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let _clone = create_in_progress(&env, "vm-own", 120_000).await;
    let d = start(&env, Options::default());
    let verb = || calls(&env, "vm reconcile-stale-create").len();
    eventually(30, "busy at startup and at the watcher's first look", || verb() >= 2).await;
    assert_eq!(env.sim.kill_all("vm clone").unwrap(), 1, "the owner dies");
    eventually(60, "the skeleton collected", || {
        env.sim.vm_state("vm-own").unwrap().is_none()
    })
    .await;
    assert!(d.provider.state().vm_by_name("vm-own").is_none(), "not indexed");
    assert!(
        calls(&env, "vm rm")
            .iter()
            .all(|a| !a.iter().any(|x| x.contains("vm-own")))
    );
    d.kill().await;
}

/// With an older cocoon whose stale-create verb fails, the watcher still looks at the record:
/// once it has committed (running), it is indexed for its pod.
/// Checklist rows: reconcile_test/VerbErrorCommittedRecordIndexed
#[tokio::test(flavor = "multi_thread")]
async fn a_stale_create_is_indexed_once_committed_even_when_the_verb_fails() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let clone = create_in_progress(&env, "vm-old", 1_500).await;
    stale_verb_answers(&env, None);
    let d = start(&env, Options::default());
    let vm = clone.await.unwrap();
    eventually(30, "the committed create indexed by name", || {
        d.provider.state().vm_by_name("vm-old").is_some_and(|v| v.id == vm.id)
    })
    .await;
    assert!(vm_named(&env, "vm-old").await.is_some_and(|v| v.state.is_running()));
    d.kill().await;
}

/// A skeleton (a `creating` record whose `vm clone` died) named by its pod's
/// `vm.cocoonstack.io/id` annotation is still not adopted: the annotation is the pod's own to
/// write and no proof that the VM finished. The startup reconcile adopts only settled records —
/// the skeleton goes to the stale-create table, whose verb collects it — and the pod's
/// CreatePod brings up a VM of its own; the daemon removes nothing itself.
/// Checklist rows: reconcile_test/SkeletonWithVMIDAnnotationNotAdopted
#[tokio::test(flavor = "multi_thread")]
async fn a_skeleton_its_pod_names_by_id_is_settled_by_the_stale_create_table_not_adopted() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let _clone = create_in_progress(&env, "vm-sk", 120_000).await;
    let skeleton = vms(&env)
        .await
        .into_iter()
        .find(|v| v.name() == "vm-sk")
        .expect("the record of the create in progress");
    assert_eq!(env.sim.kill_all("vm clone").unwrap(), 1, "the create dies");
    env.sim.set_settings(|s| s.create_delay_ms = 0).unwrap();
    assert_eq!(
        env.sim.vm_state("vm-sk").unwrap().as_deref(),
        Some("creating"),
        "a skeleton is left"
    );
    create(
        &env,
        &managed(
            "sk-0",
            "vm-sk",
            &[
                ("cocoonset.cocoonstack.io/image", "base"),
                ("vm.cocoonstack.io/id", skeleton.id.as_str()),
                ("vm.cocoonstack.io/lifecycle-state", "creating"),
            ],
        ),
    )
    .await;
    let d = start(&env, Options::default());
    wait_ready(&env, "sk-0").await;
    let mine: Vec<_> = vms(&env).await.into_iter().filter(|v| v.name() == "vm-sk").collect();
    assert_eq!(mine.len(), 1, "one VM of the name: {mine:?}");
    assert_ne!(mine[0].id, skeleton.id, "a VM of the pod's own, not the skeleton");
    assert_eq!(
        annotation(&env, "sk-0", "vm.cocoonstack.io/id").as_deref(),
        Some(mine[0].id.as_str()),
        "the pod's id annotation names its new VM"
    );
    assert_eq!(
        calls(&env, "vm reconcile-stale-create")
            .iter()
            .filter(|a| a.contains(&skeleton.id))
            .count(),
        1,
        "the skeleton was settled by the stale-create verb, once"
    );
    assert!(
        calls(&env, "vm rm")
            .iter()
            .all(|a| !a.iter().any(|x| x.contains(&skeleton.id))),
        "the daemon removed nothing itself"
    );
    assert!(
        d.provider
            .state()
            .tracked("default/sk-0")
            .and_then(|t| t.vm)
            .is_some_and(|v| v.id == mine[0].id),
        "the pod tracks its new VM"
    );
    d.kill().await;
}

/// A cloud-hypervisor Windows pod cut by a daemon kill before its first guest fixup was
/// recorded: its VM is a fresh clone with no fixup marker, so the restarted daemon must first learn from the
/// registry whether it is a restored guest. Returns the env, the registry lookups of the tag
/// so far, and the exec count, before the restart.
async fn windows_clone_cut_before_its_fixup() -> (Env, usize, usize) {
    let env = env(true).await;
    seed_windows_snapshot(&env, "winbase").await;
    let d = start(&env, Options::default());
    // The fixup's first exec hangs until the daemon is gone.
    env.sim
        .add_fault(cocoon_sim::Fault {
            verb: "vm exec".into(),
            match_arg: None,
            times: Some(1),
            action: cocoon_sim::FaultAction::Delay { ms: 120_000 },
        })
        .unwrap();
    let windows = [
        ("cocoonset.cocoonstack.io/image", "winbase"),
        ("cocoonset.cocoonstack.io/os", "windows"),
        ("vm.cocoonstack.io/backend", "cloud-hypervisor"),
    ];
    create(&env, &managed("win-0", "vm-win", &windows)).await;
    // Its exec took the delay (not only logged its call: one killed before taking it would
    // leave the delay to the restarted daemon's exec).
    eventually(30, "the fixup's exec hanging", || {
        env.sim.armed_faults("vm exec").unwrap() == 0
    })
    .await;
    d.kill().await;
    env.sim.kill_all("vm exec").unwrap();
    // The state a kill between the runtime annotations and the fixup marker's write leaves.
    annotate(&env, "win-0", &[("vm.cocoonstack.io/post-clone-state", None)]).await;
    let registry = env.registry.clone().unwrap();
    let lookups = registry
        .manifest_lookups
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.as_str() == "vm-win:hibernate")
        .count();
    let execs = env.sim.exec_log().unwrap().len();
    (env, lookups, execs)
}

fn tag_lookups(env: &Env) -> usize {
    env.registry
        .as_ref()
        .unwrap()
        .manifest_lookups
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.as_str() == "vm-win:hibernate")
        .count()
}

/// Registry errors while the restarted daemon classifies the guest are retried: after two
/// failed lookups the third says there is no hibernate tag, so the VM is a fresh clone and its
/// network-device reset runs.
/// Checklist rows: resume_test/StartupDispatchClassifyRetriesRegistryErrors
#[tokio::test(flavor = "multi_thread")]
async fn classifying_a_resumed_windows_clone_retries_registry_errors() {
    let (env, before, execs) = windows_clone_cut_before_its_fixup().await;
    env.registry
        .as_ref()
        .unwrap()
        .failing_manifests
        .lock()
        .unwrap()
        .insert("vm-win:hibernate".into(), 2);
    let d = start(&env, Options::default());
    eventually(60, "the fresh clone's reset ran", || {
        env.sim.exec_log().unwrap()[execs..]
            .iter()
            .any(|e| e.argv.first().map(String::as_str) == Some("powershell"))
    })
    .await;
    assert!(tag_lookups(&env) - before >= 3, "two failed lookups, then the answer");
    eventually(30, "ready", || lifecycle(&env, "win-0").as_deref() == Some("ready")).await;
    d.kill().await;
}

/// A registry that never answers within the classify budget fails the pod's lifecycle loudly
/// and runs nothing in the guest (the reset would disrupt a restored guest).
/// Checklist rows: resume_test/StartupDispatchClassifyFailsLoudOnHangingRegistry
#[tokio::test(flavor = "multi_thread")]
async fn classifying_a_resumed_windows_clone_fails_loudly_when_the_registry_never_answers() {
    let (env, _, execs) = windows_clone_cut_before_its_fixup().await;
    env.registry
        .as_ref()
        .unwrap()
        .failing_manifests
        .lock()
        .unwrap()
        .insert("vm-win:hibernate".into(), u32::MAX);
    let d = start(&env, Options::default());
    let message = wait_failed_with(&env, "win-0", "hibernate evidence stayed unavailable").await;
    assert!(message.contains("vm-win"), "{message}");
    // The Event is recorded beside the lifecycle patch, not before it: wait for it too.
    eventually(30, "a ResumeClassifyFailed Event", || {
        has_event(&env, "win-0", "ResumeClassifyFailed")
    })
    .await;
    assert_eq!(env.sim.exec_log().unwrap().len(), execs, "nothing ran in the guest");
    d.kill().await;
}

/// Whether cocoon was asked to save or remove VM `id` so far.
fn touched(env: &Env, id: &str) -> bool {
    ["snapshot save", "vm rm"]
        .iter()
        .any(|verb| calls(env, verb).iter().any(|a| a.iter().any(|x| x == id)))
}

/// A Windows clone cut before its fixup, and a daemon restarted on it whose resume is classifying
/// the VM, the registry failing its next six tag lookups (the resume keeps retrying): the env,
/// the tag lookups before the restart, the VM's id, the daemon.
async fn restarted_into_a_slow_classify() -> (Env, usize, String, Daemon) {
    let (env, before, _) = windows_clone_cut_before_its_fixup().await;
    let id = annotation(&env, "win-0", "vm.cocoonstack.io/id").expect("the VM id was published");
    env.registry
        .as_ref()
        .unwrap()
        .failing_manifests
        .lock()
        .unwrap()
        .insert("vm-win:hibernate".into(), 6);
    let d = start(&env, Options::default());
    eventually(30, "the resume classifying", || tag_lookups(&env) > before).await;
    (env, before, id, d)
}

/// A hibernate asked for while the restarted daemon is still classifying the pod's VM (its
/// resumed work holds the pod) waits: nothing is saved until the resume is over, then the
/// hibernate runs.
/// Checklist rows: resume_test/UpdatePodBacksOffWhileResumeInFlight
#[tokio::test(flavor = "multi_thread")]
async fn a_hibernate_asked_for_during_a_resume_waits_for_it() {
    let (env, before, id, d) = restarted_into_a_slow_classify().await;
    annotate(&env, "win-0", &[("vm.cocoonstack.io/hibernate", Some("true"))]).await;
    // Still inside the resume: the registry has failed fewer than four lookups.
    eventually(30, "the resume still retrying", || tag_lookups(&env) - before >= 3).await;
    assert!(!touched(&env, &id), "the hibernate ran during the resume");
    eventually(60, "hibernated once the resume is over", || {
        lifecycle(&env, "win-0").as_deref() == Some("hibernated")
    })
    .await;
    d.kill().await;
}

/// A delete during the resume waits for it the same way, then removes the VM.
/// Checklist rows: delete_test/BacksOffWhileResumeInFlight
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_during_a_resume_waits_for_it() {
    let (env, before, id, d) = restarted_into_a_slow_classify().await;
    delete(&env, "win-0").await;
    eventually(30, "the resume still retrying", || tag_lookups(&env) - before >= 3).await;
    assert!(!touched(&env, &id), "the delete ran during the resume");
    eventually(60, "pod finalized after the resume", || get(&env, "win-0").is_none()).await;
    assert!(vm_named(&env, "vm-win").await.is_none());
    d.kill().await;
}
