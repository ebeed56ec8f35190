//! Bad input and cocoon failures: the create boots no VM, leaves a Warning Event and a lifecycle
//! message, and a retry after the fault boots exactly one VM.

use super::*;

/// Lifecycle: L1, L5, L6, L24.
/// Checklist rows: create_test/MissingVMNameRejected, create_test/CloneFromDirRejectsRelativePath,
/// create_test/CloneModeRejectsBackendMismatch
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
    // A VM name cocoon would refuse (a shell command in it): refused before any cocoon call.
    create(
        &env,
        &managed(
            "shelly",
            "vk-$(touch x)",
            &[("cocoonset.cocoonstack.io/image", "fc-snap")],
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
        ("shelly", "is not a VM name cocoon accepts"),
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
            && has_event(&env, "shelly", "InvalidVMSpec")
            && has_event(&env, "fc", "SnapshotBackendMismatch")
    })
    .await;
    assert!(calls(&env, "vm clone").is_empty(), "nothing cloned");
    assert!(vms(&env).await.is_empty(), "nothing booted");
    // Its delete has nothing to do with cocoon either: the pod goes.
    delete(&env, "shelly").await;
    eventually(30, "shelly deleted", || get(&env, "shelly").is_none()).await;
    let named: Vec<_> = env
        .sim
        .calls()
        .unwrap()
        .into_iter()
        .filter(|c| c.argv.iter().any(|a| a.contains("touch")))
        .map(|c| c.argv)
        .collect();
    assert!(named.is_empty(), "no cocoon call ever named the bad VM: {named:?}");
    // Each refusal is counted once, under its own reason (checklist: a CPU-class rejection is
    // `{create,failed,snapshot_cpu_class_mismatch}` only; a missing name `{create,skipped,missing_vmname}`).
    let m = d.provider.metrics();
    assert_eq!(m.lifecycle_count("create", "failed", "snapshot_cpu_class_mismatch"), 1);
    assert_eq!(m.lifecycle_count("create", "skipped", "missing_vmname"), 1);
    assert_eq!(m.lifecycle_count("create", "failed", "invalid_vm_spec"), 1);
    assert_eq!(
        m.lifecycle_count("create", "failed", ""),
        2,
        "reldir and fc, the policy's permanent refusals, once each"
    );
    d.kill().await;
}

/// Checklist rows: create_test/BringUpFailureAllowsRetry, create_test/CloneErrorPropagates
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

/// A `vm run` that fails and a clone from a directory that fails each say why on the pod (the
/// clone-from-dir failure names the directory as well as cocoon's cause), leave no VM behind
/// or indexed, and the retry after cocoon recovers boots exactly one VM.
/// Checklist rows: create_test/RunErrorPropagates, create_test/CloneFromDirRuntimeFailureSurfacesError
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_run_or_clone_from_dir_says_why_and_leaves_no_vm() {
    let env = env(false).await;
    seed_snapshot(&env, "staged", "ghcr.io/x/base:1").await;
    std::fs::create_dir_all(env.sim_dir.path().join("exports")).unwrap();
    let dir = env.sim_dir.path().join("exports/golden");
    env.runtime.snapshot_export_to_dir("staged", &dir).await.unwrap();
    let dir = dir.canonicalize().unwrap().display().to_string();
    env.sim
        .inject_failure("vm run", 1000, "Error: run: no space left on device", 1)
        .unwrap();
    env.sim
        .inject_failure("vm clone", 1000, "Error: clone: snapshot.json is unreadable", 1)
        .unwrap();
    let d = start(&env, Options::default());
    create(
        &env,
        &managed(
            "run-0",
            "vm-run",
            &[
                ("cocoonset.cocoonstack.io/image", "ghcr.io/x/tool:1"),
                ("cocoonset.cocoonstack.io/mode", "run"),
            ],
        ),
    )
    .await;
    create(
        &env,
        &managed("dir-0", "vm-dir", &[("vm.cocoonstack.io/clone-from-dir", &dir)]),
    )
    .await;
    eventually(60, "the run failure on the pod", || {
        events(&env, "run-0")
            .iter()
            .any(|(r, n)| r == "RunFailed" && n.contains("no space left on device"))
    })
    .await;
    eventually(
        60,
        "the clone-from-dir failure on the pod, naming the directory",
        || {
            events(&env, "dir-0")
                .iter()
                .any(|(_, n)| n.contains("snapshot.json is unreadable") && n.contains(&dir))
        },
    )
    .await;
    for vm in ["vm-run", "vm-dir"] {
        assert!(vm_named(&env, vm).await.is_none(), "{vm} left behind");
        assert!(d.provider.state().vm_by_name(vm).is_none(), "{vm} indexed");
    }
    env.sim.clear_faults().unwrap();
    wait_ready(&env, "run-0").await;
    wait_ready(&env, "dir-0").await;
    assert_eq!(vms(&env).await.iter().filter(|v| v.name() == "vm-run").count(), 1);
    assert_eq!(vms(&env).await.iter().filter(|v| v.name() == "vm-dir").count(), 1);
    d.kill().await;
}
