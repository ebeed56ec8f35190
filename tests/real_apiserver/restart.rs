//! `kill -9` of `vk-cocoon run` on the real server, mid-create and mid-hibernate, then a restart
//! under the same identity that converges: one VM per pod, the guest's state never lost. (Real
//! server: the restart's reconcile reads the pods, annotations and Events as a real apiserver
//! stored them; the kill is a real SIGKILL of the process — its cocoon child outlives it and
//! finishes, as a real cocoon would.)

use cocoon_sim::Sim;

use crate::daemon::*;
use crate::hibernate::{HIBERNATE, tag_exists, wait_event, wait_lifecycle};
use crate::kube_support;
use crate::provider_support::seed_snapshot_on;
use crate::registry_support::dir_files;
use crate::runtime_support;

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_killed_mid_create_restarts_into_one_vm_for_the_pod() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace("kill-create").await;
    let machine = Machine::new("vk-kill-create");
    seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
    let mut daemon = machine.start_daemon(cluster);
    machine.wait_registered(cluster).await;

    machine.sim.delay("vm clone", Some(1), 3_000).unwrap();
    create_pod(
        &admin,
        &managed_pod(&ns, &machine.node, "agent-0", "vm-k", &[(IMAGE, "base")]),
    )
    .await;
    machine.wait_cocoon_running("vm clone", true).await;
    daemon.kill9();
    // The clone the daemon started finishes without it.
    machine.wait_cocoon_running("vm clone", false).await;
    assert_eq!(machine.vms_named("vm-k").await.len(), 1);

    let _daemon = machine.start_daemon(cluster);
    let pod = wait_up(&admin, &ns, "agent-0").await;
    let vms = machine.vms_named("vm-k").await;
    assert_eq!(vms.len(), 1, "one VM for the pod: {vms:?}");
    assert_eq!(annotation(&pod, VM_ID), Some(vms[0].id.as_str()), "adopted by name");
    assert_eq!(machine.calls("vm clone").len(), 1, "nothing booted twice");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_daemon_killed_mid_hibernate_restarts_and_finishes_it_without_losing_the_guest() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace("kill-hibernate").await;
    let machine = Machine::new("vk-kill-hibernate").with_registry();
    seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
    let mut daemon = machine.start_daemon(cluster);
    create_pod(
        &admin,
        &managed_pod(&ns, &machine.node, "agent-0", "vm-m", &[(IMAGE, "base")]),
    )
    .await;
    wait_up(&admin, &ns, "agent-0").await;

    machine.sim.delay("snapshot save", Some(1), 3_000).unwrap();
    cluster
        .kubectl_checked(&["annotate", "pod", "agent-0", "-n", &ns, &format!("{HIBERNATE}=true")])
        .unwrap();
    wait_lifecycle(&admin, &ns, "agent-0", "hibernating").await;
    machine.wait_cocoon_running("snapshot save", true).await;
    daemon.kill9();
    machine.wait_cocoon_running("snapshot save", false).await;
    assert_eq!(machine.vms_named("vm-m").await.len(), 1, "the VM outlived the daemon");
    assert!(!tag_exists(&machine, "vm-m").await, "nothing pushed before the kill");

    let _daemon = machine.start_daemon(cluster);
    wait_lifecycle(&admin, &ns, "agent-0", "hibernated").await;
    wait_event(&admin, &ns, "agent-0", "ResumedAfterRestart", "op=hibernate").await;
    assert!(
        machine.vms_named("vm-m").await.is_empty(),
        "the hibernate finished: the VM is gone"
    );
    // Nothing lost: the registry holds the guest's last save byte for byte.
    let local = machine.sim.snapshot_dir("vm-m").unwrap().expect("the warm local copy");
    let other = tempfile::tempdir().unwrap();
    let other_sim = Sim::new(other.path()).unwrap();
    let other_runtime = vk_cocoon::runtime::CocoonCli::new(runtime_support::config(&other_sim));
    machine
        .registry_client()
        .pull_snapshot(&other_runtime, "vm-m", "hibernate", "check")
        .await
        .unwrap();
    let pulled = other_sim.snapshot_dir("check").unwrap().unwrap();
    assert_eq!(dir_files(&pulled), dir_files(&local), "the registry copy is the guest");
}
