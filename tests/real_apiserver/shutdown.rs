//! SIGTERM to `vk-cocoon run` in the middle of a hibernate, on the real server and a real
//! registry: the ordered shutdown stops taking pod operations and lets the hibernate in flight
//! finish within the shutdown deadline (`VK_SHUTDOWN_DEADLINE`); a hibernate that cannot finish
//! in time (its cocoon call parked by the simulator, as the crash harness parks one) is left
//! where a crash would leave it — the guest in its VM, nothing lost — and the next daemon
//! finishes it. Either way the process exits within the deadline. (Real server and process: the
//! signal is a real SIGTERM, the pod's annotations are read back from a real apiserver.)

use std::time::{Duration, Instant};

use cocoon_sim::Sim;
use kube::api::Api;

use crate::daemon::*;
use crate::hibernate::{HIBERNATE, tag_exists, wait_lifecycle};
use crate::kube_support;
use crate::provider_support::seed_snapshot_on;
use crate::registry_support::dir_files;
use crate::runtime_support;

/// Sends SIGTERM and checks the daemon exits cleanly within `deadline`; returns how long it took.
async fn sigterm_exits_within(daemon: &mut DaemonProcess, deadline: Duration) -> Duration {
    let signalled = Instant::now();
    // The daemon is a child this test started and has not reaped: its pid names no other process.
    vk_cocoon::host::process::terminate(daemon.pid()).expect("SIGTERM the daemon");
    let status = daemon.exited(deadline.as_secs() + 30).await;
    let took = signalled.elapsed();
    eprintln!("exit {took:?} after SIGTERM (deadline {deadline:?})");
    assert!(
        status.success(),
        "a clean exit on SIGTERM: {status:?}\n{}",
        daemon.log()
    );
    assert!(
        took < deadline,
        "the daemon took {took:?} to stop, past its {deadline:?} deadline"
    );
    took
}

/// A daemon with a registry and shutdown deadline `deadline`, and its pod `agent-0` (VM `vm`) up.
struct Up {
    admin: kube::Client,
    ns: String,
    machine: Machine,
    daemon: DaemonProcess,
}

async fn up_with_deadline(cluster: &kube_support::KubeCluster, name: &str, vm: &str, deadline: Duration) -> Up {
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace(name).await;
    let mut machine = Machine::new(&format!("vk-{name}")).with_registry();
    machine
        .daemon_env
        .push(("VK_SHUTDOWN_DEADLINE".into(), format!("{}s", deadline.as_secs())));
    seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
    let daemon = machine.start_daemon(cluster);
    create_pod(
        &admin,
        &managed_pod(&ns, &machine.node, "agent-0", vm, &[(IMAGE, "base")]),
    )
    .await;
    wait_up(&admin, &ns, "agent-0").await;
    Up {
        admin,
        ns,
        machine,
        daemon,
    }
}

/// The hibernate is saving the guest when SIGTERM comes: the daemon does not start anything
/// new, lets the hibernate finish — the guest pushed to `<vm>:hibernate`, the VM removed, the
/// pod annotated hibernated — and only then exits, within the deadline and cleanly.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_in_the_middle_of_a_hibernate_lets_it_finish_within_the_deadline() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let deadline = Duration::from_secs(20);
    let Up {
        admin,
        ns,
        machine,
        mut daemon,
    } = up_with_deadline(cluster, "sigterm", "vm-t", deadline).await;
    // The save takes 2 s, so the signal lands inside it.
    machine.sim.delay("snapshot save", Some(1), 2_000).unwrap();
    cluster
        .kubectl_checked(&["annotate", "pod", "agent-0", "-n", &ns, &format!("{HIBERNATE}=true")])
        .unwrap();
    machine.wait_cocoon_running("snapshot save", true).await;

    sigterm_exits_within(&mut daemon, deadline).await;
    // Finished before the exit, with no daemon running since.
    assert!(
        machine.vms_named("vm-t").await.is_empty(),
        "the hibernate removed the VM before the exit"
    );
    assert!(tag_exists(&machine, "vm-t").await, "the guest is in vm-t:hibernate");
    let pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), &ns)
        .get("agent-0")
        .await
        .unwrap();
    assert_eq!(lifecycle(&pod), Some("hibernated"), "the pod says hibernated");
    assert_eq!(annotation(&pod, VM_ID), None, "no VM id on the hibernated pod");
    assert!(
        !daemon.log().contains("abandon"),
        "nothing was abandoned:\n{}",
        daemon.log()
    );
}

/// The hibernate's `snapshot save` did its work but never answers (the simulator parks it, as
/// the crash harness does) when SIGTERM comes: the daemon waits for it up to the drain's share
/// of the deadline, then abandons it at that step and exits within the deadline. The guest is
/// still in its VM and the pod does not claim to be hibernated; the next daemon finishes the
/// hibernate, and the registry holds the guest byte for byte.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_while_a_hibernate_is_stuck_exits_within_the_deadline_and_the_next_daemon_finishes_it() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let deadline = Duration::from_secs(4);
    let Up {
        admin,
        ns,
        machine,
        mut daemon,
    } = up_with_deadline(cluster, "sigterm-stuck", "vm-s", deadline).await;
    // The hibernate's second cocoon call (its save, after a `vm inspect`) does its work and
    // parks instead of answering.
    machine.sim.stage_crash(2, true).unwrap();
    cluster
        .kubectl_checked(&["annotate", "pod", "agent-0", "-n", &ns, &format!("{HIBERNATE}=true")])
        .unwrap();
    eventually(60, "the hibernate's save parked", || async {
        machine.sim.crash_log().unwrap().iter().any(|l| l.event == "parked")
    })
    .await;
    let parked = machine.sim.crash_log().unwrap();
    assert_eq!(
        parked
            .iter()
            .map(|l| (l.verb.as_str(), l.event.as_str()))
            .collect::<Vec<_>>(),
        [("vm inspect", "done"), ("snapshot save", "parked")],
        "the hibernate is held inside its save: {parked:?}"
    );

    let took = sigterm_exits_within(&mut daemon, deadline).await;
    // It waited for the hibernate (the drain's share is 4 s - 0.5 s - 0.8 s) before giving up.
    assert!(
        took >= Duration::from_millis(2_700),
        "the daemon stopped after {took:?} without waiting for the hibernate in flight"
    );
    assert!(
        daemon
            .log()
            .contains("pod operation abandoned at the shutdown deadline"),
        "the abandoned hibernate is logged:\n{}",
        daemon.log()
    );
    // Parked consistently: the guest is in its VM, nothing was pushed or removed, the pod does
    // not claim to be hibernated.
    machine.sim.clear_crash().unwrap();
    assert_eq!(machine.vms_named("vm-s").await.len(), 1, "the VM is still there");
    assert!(!tag_exists(&machine, "vm-s").await, "nothing pushed before the exit");
    let pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(admin.clone(), &ns)
        .get("agent-0")
        .await
        .unwrap();
    assert_ne!(
        lifecycle(&pod),
        Some("hibernated"),
        "the pod does not claim to be hibernated"
    );
    drop(daemon);

    let _daemon = machine.start_daemon(cluster);
    let hibernated = wait_lifecycle(&admin, &ns, "agent-0", "hibernated").await;
    assert!(
        machine.vms_named("vm-s").await.is_empty(),
        "the hibernate finished: the VM is gone"
    );
    assert_eq!(annotation(&hibernated, VM_ID), None, "no VM id on the hibernated pod");
    // Nothing lost: the registry holds the guest's save byte for byte.
    let local = machine.sim.snapshot_dir("vm-s").unwrap().expect("the warm local copy");
    let other = tempfile::tempdir().unwrap();
    let other_sim = Sim::new(other.path()).unwrap();
    let other_runtime = vk_cocoon::runtime::CocoonCli::new(runtime_support::config(&other_sim));
    machine
        .registry_client()
        .pull_snapshot(&other_runtime, "vm-s", "hibernate", "check")
        .await
        .unwrap();
    let pulled = other_sim.snapshot_dir("check").unwrap().unwrap();
    assert_eq!(dir_files(&pulled), dir_files(&local), "the registry copy is the guest");
}
