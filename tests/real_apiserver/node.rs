//! `vk-cocoon run` as a process on the real server, under the `deploy/rbac.yaml` identity: it
//! registers its Node, renews its Lease, brings a pod to Ready, serves `/metrics` and stops
//! cleanly on SIGTERM; when it stops renewing, the real node lifecycle controller marks the node
//! unreachable, and a restart makes node and pod Ready again. (Real server: RBAC, the Node and
//! Lease validation, the pod status strategy and the controller-manager are what is being tried
//! here; nothing needs a fault the fake alone can inject.)

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::runtime::wait::await_condition;

use crate::daemon::*;
use crate::kube_support;
use crate::provider_support::seed_snapshot_on;

#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_registers_renews_its_lease_runs_a_pod_serves_metrics_and_stops_on_sigterm() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace("daemon").await;
    let machine = Machine::new("vk-daemon");
    seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
    let mut daemon = machine.start_daemon(cluster);

    // Registration: the Node with our identity, Ready.
    let nodes: Api<Node> = Api::all(admin.clone());
    let node_name = machine.node.clone();
    eventually(60, "node registered and Ready", || {
        let nodes = nodes.clone();
        let name = node_name.clone();
        async move {
            nodes.get_opt(&name).await.unwrap().is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
        }
    })
    .await;

    // A pod bound to it comes up, and Ready lands through the real pods/status.
    let pod = managed_pod(&ns, &machine.node, "d-0", "vm-daemon", &[(IMAGE, "base")]);
    create_pod(&admin, &pod).await;
    let up = wait_up(&admin, &ns, "d-0").await;
    let vms = machine.vms_named("vm-daemon").await;
    assert_eq!(vms.len(), 1, "one VM for the pod: {vms:?}");
    assert_eq!(annotation(&up, VM_ID), Some(vms[0].id.as_str()));
    assert_eq!(
        up.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running"),
        "{:?}",
        up.status
    );

    // Its probe scope (VK_PROBE_NETWORKS, loopback in every test): a pod whose pre-assigned
    // address is off the machine is not probed; the pod says why and the log names the address.
    let mut lan = managed_pod(&ns, &machine.node, "lan-0", "lan", &[]);
    lan.metadata.annotations = Some(
        [
            ("vm.cocoonstack.io/name", "lan"),
            ("vm.cocoonstack.io/id", "ext-1"),
            ("vm.cocoonstack.io/ip", "10.1.2.3"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    create_pod(&admin, &lan).await;
    let why = "Ready=False naming the refused address";
    wait_pod(&admin, &ns, "lan-0", 60, why, |p| {
        p.and_then(ready_condition)
            .is_some_and(|(s, m)| s == "False" && m.contains("10.1.2.3 is outside VK_PROBE_NETWORKS"))
    })
    .await;
    let refused = daemon.acknowledge_probe_refusals();
    assert!(
        refused.len() == 1 && refused[0].contains("10.1.2.3"),
        "one refusal, naming the address: {refused:?}"
    );

    // The Lease is renewed (every 10 s by default): its renewTime moves.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let renew_time = |l: Option<Lease>| l.and_then(|l| l.spec).and_then(|s| s.renew_time).map(|t| t.0);
    let first = renew_time(leases.get_opt(&machine.node).await.unwrap()).expect("a Lease with a renewTime");
    eventually(40, "the Lease renewed", || {
        let leases = leases.clone();
        let name = machine.node.clone();
        async move { renew_time(leases.get_opt(&name).await.unwrap()).is_some_and(|t| t > first) }
    })
    .await;
    let lease = leases.get(&machine.node).await.unwrap();
    assert_eq!(
        lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()),
        Some(machine.node.as_str())
    );

    // The status reconciler compares the stored status with its own view (first 10 s after the
    // start, about when the Lease renews): what the real server stores is what the daemon wrote,
    // so it never republishes.
    assert!(
        !daemon.log().contains("pod status drifted"),
        "the real server keeps the published status as written"
    );

    let text = daemon.scrape_metrics().expect("/metrics answers");
    assert!(
        text.contains(r#"cocoon_vk_pod_lifecycle_total{op="create",reason="",result="ok"} 1"#),
        "{text}"
    );
    assert!(text.contains("cocoon_vk_vm_boot_duration_seconds_count"), "{text}");
    assert!(
        text.contains("cocoon_vk_policy_decision_seconds"),
        "policy metrics are served too: {text}"
    );

    assert!(
        daemon.log().contains("every permission the daemon needs is granted"),
        "the RBAC preflight passed for deploy/rbac.yaml's identity"
    );
    let status = daemon.terminate().await;
    assert!(status.success(), "clean exit on SIGTERM: {status:?}\n{}", daemon.log());
    assert!(
        machine.vms_named("vm-daemon").await.len() == 1,
        "stopping the daemon leaves the VMs running"
    );
}

/// The node lifecycle controller of the real controller-manager: a node whose daemon stops
/// renewing its Lease is marked `Unknown`, tainted `unreachable` and its pods set Not Ready; the
/// restarted daemon renews the Lease and republishes the node's and the pod's status, so the
/// controller lifts the taint and the pod is Ready again on the same VM.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_whose_daemon_stops_goes_unreachable_and_a_restart_makes_it_and_its_pod_ready_again() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    assert!(
        cluster.has_controllers(),
        "this test is about the node lifecycle controller"
    );
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace("unreachable").await;
    let machine = Machine::new("vk-unreachable");
    seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
    let mut daemon = machine.start_daemon(cluster);
    create_pod(
        &admin,
        &managed_pod(&ns, &machine.node, "agent-0", "vm-u", &[(IMAGE, "base")]),
    )
    .await;
    wait_up(&admin, &ns, "agent-0").await;
    let vm = machine.vms_named("vm-u").await.remove(0);

    let ready = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone())
    };
    let unreachable = |n: &Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/unreachable"))
    };
    let nodes = Api::<Node>::all(admin.clone());
    let wait_node = |what: &'static str, cond: Box<dyn Fn(&Node) -> bool + Send>| {
        let nodes = nodes.clone();
        let name = machine.node.clone();
        async move {
            // The controller waits out its grace period (tens of seconds) on a silent node.
            let watch = await_condition(nodes, &name, move |n: Option<&Node>| n.is_some_and(&cond));
            tokio::time::timeout(std::time::Duration::from_secs(150), watch)
                .await
                .unwrap_or_else(|_| panic!("node {name}: timed out waiting until {what}"))
                .unwrap()
        }
    };

    daemon.kill9();
    wait_node(
        "Ready is Unknown and the unreachable taint is set",
        Box::new(move |n| ready(n).as_deref() == Some("Unknown") && unreachable(n)),
    )
    .await;
    wait_pod(&admin, &ns, "agent-0", 60, "marked Not Ready by the controller", |p| {
        p.is_some_and(|p| !is_ready(p))
    })
    .await;

    let _daemon = machine.start_daemon(cluster);
    wait_node(
        "Ready again, the taint lifted",
        Box::new(move |n| ready(n).as_deref() == Some("True") && !unreachable(n)),
    )
    .await;
    let pod = wait_up(&admin, &ns, "agent-0").await;
    assert_eq!(annotation(&pod, VM_ID), Some(vm.id.as_str()), "the same VM, adopted");
    assert_eq!(machine.calls("vm clone").len(), 1, "nothing booted twice");
}
