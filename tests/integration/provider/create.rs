//! CreatePod end to end (fake apiserver + cocoon-sim + default policies): every bring-up path,
//! and every conflict or fail-closed case boots no VM and leaves an Event and a lifecycle message.

mod burst;
mod known;
mod refusals;
mod restore;
mod status;

use crate::provider_support;

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

/// Lifecycle: L20, L22, L28, L38.
/// Checklist rows: create_test/CloneMode, create_test/InvalidatesForkSnapshot,
/// create_test/CloneModePassesCPUPolicy, create_test/CloneModeWithTag
#[tokio::test(flavor = "multi_thread")]
async fn clone_mode_clones_the_tagged_local_snapshot_with_the_cgroup_flags_and_publishes_the_runtime() {
    let env = env(false).await;
    seed_snapshot(&env, "snapshot-repo:v2", "ghcr.io/x/base:1").await;
    // A fork snapshot of an earlier guest of this VM name, left on the node.
    seed_snapshot(&env, "fork-vm-clone", "ghcr.io/x/base:1").await;
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
    assert!(
        env.runtime
            .snapshot_inspect("fork-vm-clone")
            .await
            .is_err_and(|e| e.is_not_found()),
        "the earlier guest's fork snapshot is gone"
    );
    d.kill().await;
}

/// Lifecycle: L23.
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

/// Lifecycle: L20, L29, L30, L31.
/// Checklist rows: create_test/InvalidatesForkSnapshot, create_test/RunMode,
/// create_test/RunModeBurstableCPUPolicy, create_test/EnsureRunImageDispatch
#[tokio::test(flavor = "multi_thread")]
async fn run_mode_ensures_the_image_and_translates_the_resources() {
    let env = env(true).await;
    // A fork snapshot of an earlier guest of this VM name, left on the node.
    seed_snapshot(&env, "fork-vm-run", "ghcr.io/x/base:1").await;
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
    let pulls = calls(&env, "image pull");
    assert_eq!(
        pulls
            .iter()
            .filter(|a| a.last().map(String::as_str) == Some("ghcr.io/x/ubuntu:24.04"))
            .count(),
        1,
        "{pulls:?}"
    );
    let argv = calls(&env, "vm run")
        .into_iter()
        .find(|a| a.iter().any(|x| x == "vm-run"))
        .expect("the pod's vm run")
        .join(" ");
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
    assert!(
        env.runtime
            .snapshot_inspect("fork-vm-run")
            .await
            .is_err_and(|e| e.is_not_found()),
        "the earlier guest's fork snapshot is gone"
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

/// Lifecycle: L19.
/// Checklist rows: create_test/ForkFromLocalVMSkipsSnapshotBaseImage,
/// create_test/EnsureForkSnapshotDedupsConcurrentSaves, create_test/ForkFromReusesExistingSnapshot
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

/// Lifecycle: L33.
/// Checklist rows: create_test/CloneFromDirAnnotationDispatches
#[tokio::test(flavor = "multi_thread")]
async fn clone_from_dir_clones_the_exported_directory() {
    let env = env(false).await;
    seed_snapshot(&env, "staged", "ghcr.io/x/base:1").await;
    // Below the node's export root (VK_CLONE_FROM_DIR_ROOTS; the harness's is `<sim>/exports`).
    std::fs::create_dir_all(env.sim_dir.path().join("exports")).unwrap();
    let dir = env.sim_dir.path().join("exports/golden");
    env.runtime.snapshot_export_to_dir("staged", &dir).await.unwrap();
    let d = start(&env, Options::default());
    let dir_s = dir.canonicalize().unwrap().display().to_string();
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

/// Lifecycle: L9.
/// Checklist rows: create_test/CreatePodUnmanagedAdoptsExistingVM
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

/// Lifecycle: L8.
#[tokio::test(flavor = "multi_thread")]
async fn an_existing_vm_is_adopted_by_its_pod_after_a_restart_not_booted_twice() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-a", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    let id = vm_named(&env, "vm-a").await.unwrap().id;
    d.kill().await;
    // The restarted node re-delivers agent-0's create: idempotent, adopted.
    let d = start(&env, Options::default());
    eventually(20, "agent-0 adopted after the restart", || {
        d.provider.metrics().lifecycle_count("create", "ok", "adopted") >= 1
    })
    .await;
    wait_ready(&env, "agent-0").await;
    assert_eq!(calls(&env, "vm clone").len(), 1, "no second boot");
    let vms = vms(&env).await;
    assert_eq!(
        vms.iter()
            .filter(|v| v.name() == "vm-a")
            .map(|v| &v.id)
            .collect::<Vec<_>>(),
        [&id]
    );
    d.kill().await;
}

/// Lifecycle: L23.
/// Checklist rows: create_test/EnsureSnapshotColdBurstSingleflight,
/// create_test/EnsureSnapshotLocalHitSkipsRegistry
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

/// Checklist rows EnsureRunImageConcurrentForceShareOneImport and …FallbackDeduped: a burst of
/// run-mode pods of one image shares one `cocoon image pull` (one `--force` pull when they ask
/// for it). (That the shared pull outlives a caller that goes away: `table::shared`'s tests.)
/// Checklist rows: create_test/EnsureRunImageColdBurstSingleImport,
/// create_test/EnsureRunImageConcurrentForceShareOneImport,
/// create_test/EnsureRunImageFallbackDeduped
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_run_pods_shares_one_forced_image_pull() {
    let env = env(false).await;
    // The pull takes a while, so every pod of the burst arrives while it runs.
    env.sim.delay("image pull", Some(1), 1500).unwrap();
    let d = start(&env, Options::default());
    let run = |i: usize| {
        managed(
            &format!("tool-{i}"),
            &format!("vm-tool-{i}"),
            &[
                ("cocoonset.cocoonstack.io/image", "ghcr.io/x/ubuntu:24.04"),
                ("cocoonset.cocoonstack.io/mode", "run"),
                ("cocoonset.cocoonstack.io/force-pull", "true"),
            ],
        )
    };
    for i in 0..4 {
        create(&env, &run(i)).await;
    }
    eventually(120, "all four ready", || {
        (0..4).all(|i| lifecycle(&env, &format!("tool-{i}")).as_deref() == Some("ready"))
    })
    .await;
    let pulls = calls(&env, "image pull");
    assert_eq!(pulls.len(), 1, "one forced pull for the burst: {pulls:?}");
    assert!(pulls[0].contains(&"--force".to_string()), "{pulls:?}");
    d.kill().await;
}

/// The verbs of the simulator's calls whose arguments mention `needle`, in order.
fn verbs_mentioning(env: &Env, needle: &str) -> Vec<String> {
    env.sim
        .calls()
        .unwrap()
        .into_iter()
        .filter(|c| c.argv.iter().any(|a| a.contains(needle)))
        .map(|c| c.verb)
        .collect()
}

/// A node that has a snapshot pulled from the registry but not the image the snapshot was
/// taken from gets that image once before the clone (`image inspect` by the recorded digest
/// misses, `image pull` by reference); a second clone finds the digest and pulls nothing; a
/// snapshot of an http(s) cloud image is not ensured here (cocoon's `--pull` fetches it).
/// Lifecycle: L25, L26. Checklist rows: create_test/CloneModeEnsuresOCIRefBaseImage,
/// create_test/CloneModeSkipsEnsureWhenDigestPresent
#[tokio::test(flavor = "multi_thread")]
async fn a_pulled_snapshots_base_image_is_ensured_once_before_the_clone() {
    // The snapshots were made on another node; this node shares only the registry.
    let origin = env(true).await;
    let registry = origin.registry.clone().unwrap();
    seed_snapshot(&origin, "golden", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(origin.runtime.as_ref(), "golden", "golden", "v1", "ghcr.io/x/base:1")
        .await
        .unwrap();
    let web = "https://images.test/noble.qcow2";
    seed_snapshot(&origin, "webgold", web).await;
    registry
        .push_snapshot(origin.runtime.as_ref(), "webgold", "webgold", "v1", web)
        .await
        .unwrap();
    let mut env = env(false).await;
    env.registry = Some(registry);
    let d = start(&env, Options::default());

    create(
        &env,
        &managed("a-0", "vm-a", &[("cocoonset.cocoonstack.io/image", "golden:v1")]),
    )
    .await;
    wait_ready(&env, "a-0").await;
    let pulls = calls(&env, "image pull");
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    assert_eq!(pulls[0].last().map(String::as_str), Some("ghcr.io/x/base:1"));
    let seq: Vec<String> = env
        .sim
        .calls()
        .unwrap()
        .into_iter()
        .map(|c| c.verb)
        .filter(|v| matches!(v.as_str(), "image inspect" | "image pull" | "vm clone"))
        .collect();
    assert_eq!(
        seq,
        vec!["image inspect", "image pull", "image inspect", "vm clone"],
        "the digest is looked up, missed, the image pulled, the digest looked up again (so the \
         next clone of this snapshot asks nothing), then the clone"
    );
    let clone = calls(&env, "vm clone")[0].join(" ");
    assert!(clone.contains("--pull"), "{clone}");

    create(
        &env,
        &managed("b-0", "vm-b", &[("cocoonset.cocoonstack.io/image", "golden:v1")]),
    )
    .await;
    wait_ready(&env, "b-0").await;
    assert_eq!(
        calls(&env, "image pull").len(),
        1,
        "the digest is present: no second pull"
    );
    assert_eq!(calls(&env, "image inspect").len(), 2, "looked up by digest again");

    create(
        &env,
        &managed("w-0", "vm-w", &[("cocoonset.cocoonstack.io/image", "webgold:v1")]),
    )
    .await;
    wait_ready(&env, "w-0").await;
    assert_eq!(
        verbs_mentioning(&env, web),
        Vec::<String>::new(),
        "an http base is neither inspected nor pulled by the daemon"
    );
    assert_eq!(calls(&env, "image inspect").len(), 2);
    let clone = calls(&env, "vm clone").last().unwrap().join(" ");
    assert!(clone.contains("--pull"), "cocoon fetches the http base itself: {clone}");
    d.kill().await;
}

/// A run image the registry cannot classify is left to `cocoon image pull`: a lookup that fails
/// as a 5xx does, an http(s) reference (not looked up at all), and a node without a registry.
/// Lifecycle: L31. Checklist rows: create_test/EnsureRunImageFallback,
/// create_test/EnsureRunImageDispatch
#[tokio::test(flavor = "multi_thread")]
async fn run_images_the_registry_cannot_classify_are_pulled_by_cocoon() {
    let run = |pod: &str, vm: &str, image: &str| {
        managed(
            pod,
            vm,
            &[
                ("cocoonset.cocoonstack.io/image", image),
                ("cocoonset.cocoonstack.io/mode", "run"),
            ],
        )
    };
    let pulled = |env: &Env, image: &str| {
        calls(env, "image pull")
            .iter()
            .filter(|a| a.last().map(String::as_str) == Some(image))
            .count()
    };
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    registry
        .failing_manifests
        .lock()
        .unwrap()
        .insert("ghcr.io/x/tool:1".into(), 1);
    let lookups = |of: &str| {
        registry
            .manifest_lookups
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.as_str() == of)
            .count()
    };
    let d = start(&env, Options::default());
    create(&env, &run("tool-0", "vm-t0", "ghcr.io/x/tool:1")).await;
    wait_ready(&env, "tool-0").await;
    assert_eq!(lookups("ghcr.io/x/tool:1"), 1, "looked up once, failed");
    assert_eq!(pulled(&env, "ghcr.io/x/tool:1"), 1, "then pulled by cocoon");

    let web = "https://images.test/tool.qcow2";
    create(&env, &run("tool-1", "vm-t1", web)).await;
    wait_ready(&env, "tool-1").await;
    assert!(
        registry
            .manifest_lookups
            .lock()
            .unwrap()
            .iter()
            .all(|r| !r.contains("images.test")),
        "an http image is not looked up"
    );
    assert_eq!(pulled(&env, web), 1);
    d.kill().await;

    let bare = provider_support::env(false).await;
    let d = start(&bare, Options::default());
    create(&bare, &run("tool-2", "vm-t2", "ghcr.io/x/tool:1")).await;
    wait_ready(&bare, "tool-2").await;
    assert_eq!(pulled(&bare, "ghcr.io/x/tool:1"), 1, "no registry: cocoon pulls it");
    d.kill().await;
}

/// The cocoon calls of a create on a warm node (the clone's snapshot local, its base image
/// present): what a user waits for besides the clone itself. A change that adds a call to this
/// path fails here; one that removes a call lowers the figure (and this list).
///
/// Known instead of asked: no VM of the name (the VM table; cocoon refuses a second VM of a
/// name, so the clone itself is the check), the image's local snapshot and the snapshot's base
/// image by digest (the `snapshot list` after the startup reconcile and the first pod's pull),
/// and that no fork snapshot of this VM exists to drop (fork snapshots are only made by the
/// daemon).
#[tokio::test(flavor = "multi_thread")]
async fn a_warm_clone_create_makes_only_its_counted_cocoon_calls() {
    assert_eq!(
        warm_create_calls(false).await,
        [
            // Registry-less node: the hibernate evidence is a local snapshot of the VM's name,
            // always asked (a hibernated guest's snapshot brought here behind the daemon's back
            // must never be booted over).
            "snapshot inspect vm-warm-1",
            "vm clone",
            // The guest fixup.
            "vm exec",
        ],
        "the warm create's cocoon calls"
    );
}

/// With a registry the hibernate evidence is the registry's `<vm>:hibernate` tag: the warm
/// create's only cocoon calls are the clone and the fixup.
#[tokio::test(flavor = "multi_thread")]
async fn a_warm_clone_create_with_a_registry_makes_only_the_clone_and_the_fixup() {
    assert_eq!(
        warm_create_calls(true).await,
        ["vm clone", "vm exec"],
        "the warm create's cocoon calls"
    );
}

/// The cocoon calls of the second create of a snapshot's pods (the first one warmed the node),
/// each as its verb and target (the clone and the fixup as their verb only).
async fn warm_create_calls(with_registry: bool) -> Vec<String> {
    let env = env(with_registry).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    // Warm the node: the first pod pulls the base image its snapshot names.
    create(
        &env,
        &managed("agent-0", "vm-warm-0", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    // The startup's `snapshot list` runs in the background after the reconcile; the figure is
    // the warm node's, once it landed.
    eventually(60, "the startup snapshot list landed", || {
        d.provider.snapshot_list_landed()
    })
    .await;
    let before = env.sim.calls().unwrap().len();
    create(
        &env,
        &managed("agent-1", "vm-warm-1", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-1").await;
    let made: Vec<String> = env.sim.calls().unwrap()[before..]
        .iter()
        .filter(|c| c.verb != "vm status")
        .map(|c| match c.argv.get(2) {
            Some(target) if c.verb != "vm clone" && c.verb != "vm exec" => format!("{} {target}", c.verb),
            _ => c.verb.clone(),
        })
        .collect();
    d.kill().await;
    made
}
