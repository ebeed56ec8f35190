//! CreatePod end to end (fake apiserver + cocoon-sim + default policies): every bring-up path,
//! and every conflict or fail-closed case boots no VM and leaves an Event and a lifecycle message.

mod provider_support;

use std::sync::atomic::Ordering;

use provider_support::*;

const IP_KEY: &str = "vm.cocoonstack.io/ip";
const ID_KEY: &str = "vm.cocoonstack.io/id";

async fn wait_ready(env: &Env, name: &str) {
    eventually(60, &format!("{name} ready"), || {
        lifecycle(env, name).as_deref() == Some("ready") && ready(env, name)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn clone_mode_clones_the_tagged_local_snapshot_with_the_cgroup_flags_and_publishes_the_runtime() {
    let env = env(false).await;
    seed_snapshot(&env, "snapshot-repo:v2", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    let pod = with_resources(
        managed(
            "agent-0",
            "vm-clone",
            &[("cocoonset.cocoonstack.io/image", "snapshot-repo:v2")],
        ),
        &[("cpu", "1")],
        &[("cpu", "1500m")],
    );
    create(&env, &pod).await;
    wait_ready(&env, "agent-0").await;

    let vm = vm_named(&env, "vm-clone").await.expect("the VM exists");
    assert_eq!(annotation(&env, "agent-0", ID_KEY).as_deref(), Some(vm.id.as_str()));
    assert_eq!(annotation(&env, "agent-0", IP_KEY).as_deref(), vm.primary_ip());
    assert_eq!(phase(&env, "agent-0").as_deref(), Some("Running"));
    let clones = calls(&env, "vm clone");
    assert_eq!(clones.len(), 1);
    let argv = clones[0].join(" ");
    assert!(argv.contains("--pull"), "the snapshot has a base image: {argv}");
    assert!(
        argv.contains("--cpu-weight 39 --cpu-quota-us 150000 --cpu-period-us 100000"),
        "{argv}"
    );
    assert!(argv.ends_with(" snapshot-repo:v2"), "{argv}");
    // Fresh bring-up drops its own lineage's fork snapshot first.
    assert!(
        calls(&env, "snapshot rm")
            .iter()
            .any(|a| a.contains(&"fork-vm-clone".to_string()))
    );
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn clone_mode_pulls_a_missing_snapshot_from_the_registry_then_clones_it() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "golden", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(env.runtime.as_ref(), "golden", "golden", "v3", "ghcr.io/x/base:1")
        .await
        .unwrap();
    env.runtime.snapshot_remove_if_exists("golden").await.unwrap();
    let d = start(&env, Options::default());
    create(
        &env,
        &managed(
            "agent-0",
            "vm-pulled",
            &[("cocoonset.cocoonstack.io/image", "golden:v3")],
        ),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    assert_eq!(registry.pulls.load(Ordering::SeqCst), 1);
    assert!(
        env.runtime.snapshot_inspect("golden:v3").await.is_ok(),
        "imported under the tag-aware name"
    );
    assert!(calls(&env, "vm clone")[0].last().unwrap() == "golden:v3");
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn run_mode_ensures_the_image_and_translates_the_resources() {
    let env = env(true).await;
    let d = start(&env, Options::default());
    let pod = with_resources(
        managed(
            "tool-0",
            "vm-run",
            &[
                ("cocoonset.cocoonstack.io/image", "ghcr.io/x/ubuntu:24.04"),
                ("cocoonset.cocoonstack.io/mode", "run"),
            ],
        ),
        &[("cpu", "500m"), ("memory", "2Gi")],
        &[("cpu", "2"), ("memory", "4Gi")],
    );
    create(&env, &pod).await;
    wait_ready(&env, "tool-0").await;
    assert_eq!(calls(&env, "image pull").len(), 1);
    let argv = calls(&env, "vm run")[0].join(" ");
    assert!(
        argv.contains("--cpu 2 --cpu-weight 20 --cpu-quota-us 200000 --cpu-period-us 100000"),
        "{argv}"
    );
    assert!(
        argv.contains("--memory 2147483648"),
        "memory comes from the requests: {argv}"
    );
    assert!(vm_named(&env, "vm-run").await.is_some());
    assert!(
        calls(&env, "snapshot rm")
            .iter()
            .any(|a| a.last().map(String::as_str) == Some("fork-vm-run")),
        "run is a fresh bring-up too"
    );

    // A snapshot artifact is not a run image.
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "golden", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(env.runtime.as_ref(), "golden", "golden", "v1", "ghcr.io/x/base:1")
        .await
        .unwrap();
    create(
        &env,
        &managed(
            "tool-1",
            "vm-run-snap",
            &[
                ("cocoonset.cocoonstack.io/image", "golden:v1"),
                ("cocoonset.cocoonstack.io/mode", "run"),
            ],
        ),
    )
    .await;
    wait_failed_with(
        &env,
        "tool-1",
        "is a snapshot artifact; use mode=clone instead of mode=run",
    )
    .await;
    assert!(vm_named(&env, "vm-run-snap").await.is_none());
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn forks_share_one_fork_snapshot_of_the_source() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("main-0", "vm-main", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "main-0").await;
    for i in 1..=4 {
        create(
            &env,
            &managed(
                &format!("sub-{i}"),
                &format!("vm-sub-{i}"),
                &[("vm.cocoonstack.io/fork-from", "vm-main")],
            ),
        )
        .await;
    }
    for i in 1..=4 {
        wait_ready(&env, &format!("sub-{i}")).await;
    }
    let saves = calls(&env, "snapshot save");
    let fork_saves: Vec<_> = saves
        .iter()
        .filter(|a| a.contains(&"fork-vm-main".to_string()))
        .collect();
    assert_eq!(fork_saves.len(), 1, "one fork snapshot per lineage: {saves:?}");
    let fork_clones = calls(&env, "vm clone")
        .into_iter()
        .filter(|a| a.last().map(String::as_str) == Some("fork-vm-main"))
        .count();
    assert_eq!(fork_clones, 4);
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn clone_from_dir_clones_the_exported_directory() {
    let env = env(false).await;
    seed_snapshot(&env, "staged", "ghcr.io/x/base:1").await;
    let dir = env.sim_dir.path().join("export");
    env.runtime.snapshot_export_to_dir("staged", &dir).await.unwrap();
    let d = start(&env, Options::default());
    let dir_s = dir.display().to_string();
    create(
        &env,
        &managed("agent-0", "vm-dir", &[("vm.cocoonstack.io/clone-from-dir", &dir_s)]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    let argv = calls(&env, "vm clone")[0].join(" ");
    assert!(
        argv.contains(&format!("--from-dir {dir_s}")) && argv.contains("--pull"),
        "{argv}"
    );
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unmanaged_pods_adopt_the_preassigned_vm_without_touching_cocoon() {
    let env = env(false).await;
    let d = start(&env, Options::default());
    create(
        &env,
        &agent_pod(
            "win-0",
            &[
                ("vm.cocoonstack.io/name", "win"),
                ("vm.cocoonstack.io/id", "ext-1"),
                ("vm.cocoonstack.io/ip", "127.1.2.3"),
            ],
        ),
    )
    .await;
    wait_ready(&env, "win-0").await;
    assert!(calls(&env, "vm run").is_empty() && calls(&env, "vm clone").is_empty());
    assert_eq!(
        get(&env, "win-0").unwrap().status.unwrap().pod_ip.as_deref(),
        Some("127.1.2.3")
    );
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hibernated_guest_is_restored_instead_of_booted_fresh() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    // The guest hibernated elsewhere: its state sits under vm-h:hibernate only.
    seed_snapshot(&env, "vm-h", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(env.runtime.as_ref(), "vm-h", "vm-h", "hibernate", "snap:v1")
        .await
        .unwrap();
    env.runtime.snapshot_remove_if_exists("vm-h").await.unwrap();
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-h", &[("cocoonset.cocoonstack.io/image", "snap:v1")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    let argv = calls(&env, "vm clone")[0].join(" ");
    assert!(
        argv.ends_with(" vm-h-hibernate-import"),
        "restored from the pulled hibernate snapshot: {argv}"
    );
    eventually(10, "HibernateSnapshotExists event", || {
        has_event(&env, "agent-0", "HibernateSnapshotExists")
    })
    .await;
    assert!(
        !calls(&env, "snapshot rm")
            .iter()
            .any(|a| a.contains(&"fork-vm-h".to_string())),
        "a restore keeps the lineage's fork snapshot"
    );
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unavailable_registry_fails_closed_then_the_retry_restores() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "snap", "ghcr.io/x/base:1").await;
    registry.down.store(true, Ordering::SeqCst);
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-e", &[("cocoonset.cocoonstack.io/image", "snap")]),
    )
    .await;
    wait_failed_with(&env, "agent-0", "refusing fresh boot").await;
    eventually(10, "warning event", || {
        has_event(&env, "agent-0", "HibernateEvidenceUnavailable")
    })
    .await;
    assert!(
        vms(&env).await.iter().all(|v| v.name() != "vm-e"),
        "no VM boots while the evidence is unknown"
    );
    assert!(calls(&env, "vm clone").is_empty());
    // The registry comes back (no hibernate tag): the retried create boots it.
    registry.down.store(false, Ordering::SeqCst);
    wait_ready(&env, "agent-0").await;
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn conflicts_with_a_hibernate_snapshot_boot_nothing_and_say_why() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "vm-c", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(env.runtime.as_ref(), "vm-c", "vm-c", "hibernate", "snap:v1")
        .await
        .unwrap();
    seed_snapshot(&env, "vm-f", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(env.runtime.as_ref(), "vm-f", "vm-f", "hibernate", "snap:v1")
        .await
        .unwrap();
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("img-0", "vm-c", &[("cocoonset.cocoonstack.io/image", "snap:v2")]),
    )
    .await;
    create(
        &env,
        &managed(
            "src-0",
            "vm-f",
            &[
                ("cocoonset.cocoonstack.io/image", "snap:v1"),
                ("vm.cocoonstack.io/fork-from", "vm-other"),
            ],
        ),
    )
    .await;
    wait_failed_with(
        &env,
        "img-0",
        "was hibernated from image snap:v1 but the pod requests snap:v2",
    )
    .await;
    wait_failed_with(&env, "src-0", "explicit clone source").await;
    eventually(10, "events", || {
        has_event(&env, "img-0", "HibernateImageConflict") && has_event(&env, "src-0", "HibernateSourceConflict")
    })
    .await;
    // The bring-up policy says an operator must settle these: the pods wait, they do not fail.
    for name in ["img-0", "src-0"] {
        eventually(10, "the wait is explained", || {
            events(&env, name)
                .iter()
                .any(|(_, note)| note.contains("waiting for an operator"))
        })
        .await;
        assert_ne!(phase(&env, name).as_deref(), Some("Failed"), "{name}");
    }
    assert!(calls(&env, "vm clone").is_empty(), "nothing cloned");
    assert!(vms(&env).await.is_empty(), "nothing booted");
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_refused_with_an_event_and_a_lifecycle_message() {
    let env = env(false).await;
    seed_snapshot(&env, "fc-snap", "ghcr.io/x/base:1").await;
    let d = start(
        &env,
        Options {
            node_class: "icx".into(),
            ..Default::default()
        },
    );
    // Seeded after the startup reconcile: a mismatched pod listed at startup would (rightly) be fatal.
    eventually(30, "node registered", || {
        env.server
            .store()
            .get_as::<k8s_openapi::api::core::v1::Node>(None, NODE)
            .is_some()
    })
    .await;
    // No VM name.
    create(
        &env,
        &agent_pod("noname", &[("cocoonset.cocoonstack.io/managed", "true")]),
    )
    .await;
    // Wrong CPU class.
    let mut classy = managed("classy", "vm-classy", &[("cocoonset.cocoonstack.io/image", "fc-snap")]);
    classy.spec.as_mut().unwrap().node_selector =
        Some([("cocoonstack.io/snapshot-cpu-class".to_string(), "spr".to_string())].into());
    create(&env, &classy).await;
    // Relative clone-from-dir.
    create(
        &env,
        &managed(
            "reldir",
            "vm-reldir",
            &[("vm.cocoonstack.io/clone-from-dir", "exports/x")],
        ),
    )
    .await;
    // Backend mismatch (the snapshot was taken on cloud-hypervisor).
    create(
        &env,
        &managed(
            "fc",
            "vm-fc",
            &[
                ("cocoonset.cocoonstack.io/image", "fc-snap"),
                ("vm.cocoonstack.io/backend", "firecracker"),
            ],
        ),
    )
    .await;
    for (name, why) in [
        ("noname", "missing vm.cocoonstack.io/name"),
        ("classy", "spr"),
        ("reldir", "absolute"),
        (
            "fc",
            "was taken with cloud-hypervisor but CocoonSet requests firecracker",
        ),
    ] {
        wait_failed_with(&env, name, why).await;
        eventually(10, &format!("{name} phase Failed"), || {
            phase(&env, name).as_deref() == Some("Failed")
        })
        .await;
    }
    eventually(10, "events", || {
        has_event(&env, "noname", "MissingVMName")
            && has_event(&env, "classy", "SnapshotCPUClassMismatch")
            && has_event(&env, "reldir", "InvalidVMSpec")
            && has_event(&env, "fc", "SnapshotBackendMismatch")
    })
    .await;
    assert!(calls(&env, "vm clone").is_empty(), "nothing cloned");
    assert!(vms(&env).await.is_empty(), "nothing booted");
    assert_eq!(
        d.provider
            .metrics()
            .lifecycle_count("create", "failed", "snapshot_cpu_class_mismatch"),
        1
    );
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_existing_vm_is_adopted_not_booted_twice() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-a", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    d.kill().await;
    // Same pod, new incarnation under a fresh name, same VM name: adopted.
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-1", "vm-a", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-1").await;
    assert_eq!(calls(&env, "vm clone").len(), 1, "no second boot");
    // The restarted node re-delivers agent-0's create (idempotent: adopted) and agent-1's; the
    // two arrive through the watch in either order.
    eventually(20, "both creates adopted", || {
        d.provider.metrics().lifecycle_count("create", "ok", "adopted") >= 2
    })
    .await;
    assert_eq!(vms(&env).await.iter().filter(|v| v.name() == "vm-a").count(), 1);
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn wake_sources_a_verified_local_copy_discards_a_stale_one_and_registry_less_nodes_use_local_evidence() {
    // Registry: a local copy whose id matches the :hibernate config is cloned directly.
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "vm-w", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(env.runtime.as_ref(), "vm-w", "vm-w", "hibernate", "snap:v1")
        .await
        .unwrap();
    // A stale local copy: the tag was pushed from another snapshot.
    seed_snapshot(&env, "vm-s-other", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(env.runtime.as_ref(), "vm-s-other", "vm-s", "hibernate", "snap:v1")
        .await
        .unwrap();
    seed_snapshot(&env, "vm-s", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("w", "vm-w", &[("cocoonset.cocoonstack.io/image", "snap:v1")]),
    )
    .await;
    create(
        &env,
        &managed("s", "vm-s", &[("cocoonset.cocoonstack.io/image", "snap:v1")]),
    )
    .await;
    eventually(60, "both woke", || {
        lifecycle(&env, "w").as_deref() == Some("ready") && lifecycle(&env, "s").as_deref() == Some("ready")
    })
    .await;
    let sources: Vec<String> = calls(&env, "vm clone")
        .into_iter()
        .filter_map(|a| a.last().cloned())
        .collect();
    assert!(
        sources.contains(&"vm-w".to_string()),
        "verified local copy: {sources:?}"
    );
    assert!(
        sources.contains(&"vm-s-hibernate-import".to_string()),
        "stale local copy replaced by a pull: {sources:?}"
    );
    assert_eq!(registry.pulls.load(Ordering::SeqCst), 1);
    assert!(
        calls(&env, "snapshot rm")
            .iter()
            .any(|a| a.last().map(String::as_str) == Some("vm-s")),
        "the stale copy is discarded"
    );
    for argv in calls(&env, "vm clone") {
        assert!(
            argv.contains(&"--cpu-weight".to_string()),
            "every clone path passes the cgroup flags: {argv:?}"
        );
    }
    d.kill().await;

    // Registry-less: a local snapshot under the VM name is the evidence.
    let env = provider_support::env(false).await;
    seed_snapshot(&env, "vm-l", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("l", "vm-l", &[("cocoonset.cocoonstack.io/image", "whatever:v9")]),
    )
    .await;
    eventually(60, "restored", || lifecycle(&env, "l").as_deref() == Some("ready")).await;
    assert_eq!(calls(&env, "vm clone")[0].last().map(String::as_str), Some("vm-l"));
    eventually(10, "restore event", || has_event(&env, "l", "HibernateSnapshotExists")).await;
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_status_lands_before_the_ready_annotation() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    let history = PodHistory::record(&env, "order-0");
    create(
        &env,
        &managed("order-0", "vm-order", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "order-0").await;
    // The first stored version that says `lifecycle-state=ready` already carries the status:
    // the pod IP and a Ready condition that is True (the probe answered).
    let first_ready = history
        .first("a recorded version with lifecycle ready", |p| {
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("vm.cocoonstack.io/lifecycle-state"))
                .map(String::as_str)
                == Some("ready")
        })
        .await;
    let status = first_ready.status.expect("status landed first");
    assert!(status.pod_ip.is_some(), "the pod IP landed before the ready annotation");
    let ready = status
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        ready.status, "True",
        "Ready landed before the ready annotation: {ready:?}"
    );
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lifecycle_write_lost_to_an_apiserver_outage_is_reflushed() {
    let env = env(false).await;
    let d = start(&env, Options::default());
    // Every attempt of the provider's own write fails; the lifecycle reconciler lands it later.
    env.server
        .inject_fault(Some(axum::http::Method::PATCH), "/pods/lost-0", 500, 3);
    create(
        &env,
        &agent_pod("lost-0", &[("cocoonset.cocoonstack.io/managed", "true")]),
    )
    .await;
    eventually(60, "failed lifecycle re-flushed", || {
        lifecycle(&env, "lost-0").as_deref() == Some("failed")
    })
    .await;
    assert!(lifecycle_message(&env, "lost-0").contains("missing vm.cocoonstack.io/name"));
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cocoon_clone_failure_is_reported_and_the_retry_boots_one_vm() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    env.sim
        .inject_failure("vm clone", 1, "Error: clone: disk quota exceeded", 1)
        .unwrap();
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("cf-0", "vm-cf", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    eventually(60, "the failure event", || {
        events(&env, "cf-0")
            .iter()
            .any(|(r, n)| r == "CloneFailed" && n.contains("disk quota exceeded") && n.contains("vm-cf"))
    })
    .await;
    wait_ready(&env, "cf-0").await;
    assert_eq!(vms(&env).await.iter().filter(|v| v.name() == "vm-cf").count(), 1);
    assert_eq!(calls(&env, "vm clone").len(), 2);
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cold_burst_of_clones_pulls_the_snapshot_once() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "golden", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(env.runtime.as_ref(), "golden", "golden", "v3", "ghcr.io/x/base:1")
        .await
        .unwrap();
    env.runtime.snapshot_remove_if_exists("golden").await.unwrap();
    let d = start(&env, Options::default());
    for i in 0..8 {
        create(
            &env,
            &managed(
                &format!("burst-{i}"),
                &format!("vm-burst-{i}"),
                &[("cocoonset.cocoonstack.io/image", "golden:v3")],
            ),
        )
        .await;
    }
    eventually(120, "all ready", || {
        (0..8).all(|i| lifecycle(&env, &format!("burst-{i}")).as_deref() == Some("ready"))
    })
    .await;
    assert_eq!(registry.pulls.load(Ordering::SeqCst), 1, "one pull shared by the burst");
    assert_eq!(calls(&env, "vm clone").len(), 8);
    d.kill().await;
}
