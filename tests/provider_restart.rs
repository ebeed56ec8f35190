//! Startup reconcile and restarts end to end: adoption by id and by name, the orphan policy,
//! a CPU-class mismatch keeps the node unregistered, a daemon killed mid-create converges with
//! no duplicate and no lost VM, and 100 pods created and deleted concurrently.

mod provider_support;

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

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_killed_mid_create_converges_without_duplicates() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    // cocoon dies inside the clone (a `creating` record is left) and the daemon is killed with it.
    env.sim.die_next("vm clone", 0).unwrap();
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
    eventually(20, "its vm exec started", || !calls(&env, "vm exec").is_empty()).await;
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
