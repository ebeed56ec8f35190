//! A hostile tenant on a shared node (real apiserver, `vk-cocoon run`, kubectl as the tenant).
//!
//! The victim runs `web-0` (VM `vm-web`) in its own namespace. The attacker is a ServiceAccount
//! of another namespace that may do what tenants usually may there — create and delete pods,
//! exec, attach, port-forward, read logs — and nothing else. It tries every way the pod
//! annotations offer to reach the victim's guest: adopt its VM by id or by name, fork it, clone
//! a host directory, name a path as a VM id. Each is refused with a Warning Event on the
//! attacker's pod, exec / attach / port-forward / logs on the attacker's pods reach nothing, and
//! the victim's pod and VM are untouched throughout.
//!
//! The daemon's guest network here is its simulator's loopback subnet only (`GUEST_NETWORK`),
//! as a node's guest network is its guests' subnet: the node's own loopback (where the kubelet
//! API and anything else of the host listens) is outside it.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, DeleteParams, PostParams};

use crate::daemon::*;
use crate::kubelet_node::Node;
use crate::kubelet_node::exec_node_with;

const NAME: &str = "vm.cocoonstack.io/name";
const MANAGED: &str = "cocoonset.cocoonstack.io/managed";
const IP: &str = "vm.cocoonstack.io/ip";
const FORK_FROM: &str = "vm.cocoonstack.io/fork-from";
const CLONE_FROM_DIR: &str = "vm.cocoonstack.io/clone-from-dir";

/// The attacker: a namespace of its own and a kubeconfig for a ServiceAccount there that may
/// manage pods and use every pod subresource a tenant is usually given, in that namespace only.
struct Tenant {
    ns: String,
    kubeconfig: std::path::PathBuf,
}

async fn tenant(node: &Node) -> Tenant {
    let ns = node.cluster.namespace("mallory").await;
    let admin = node.admin.clone();
    let rule = |resources: &[&str], verbs: &[&str]| PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    };
    let role = Role {
        metadata: kube::api::ObjectMeta {
            name: Some("tenant".into()),
            ..Default::default()
        },
        rules: Some(vec![
            rule(&["pods"], &["create", "get", "list", "watch", "delete"]),
            rule(&["pods/exec", "pods/attach", "pods/portforward"], &["create", "get"]),
            rule(&["pods/log"], &["get"]),
            rule(&["events"], &["get", "list"]),
        ]),
    };
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let sa = k8s_openapi::api::core::v1::ServiceAccount {
        metadata: kube::api::ObjectMeta {
            name: Some("mallory".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: kube::api::ObjectMeta {
                    name: Some("tenant".into()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: "tenant".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: "mallory".into(),
                    namespace: Some(ns.clone()),
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();
    let kubeconfig = node.cluster.service_account_kubeconfig(&ns, "mallory").unwrap();
    node.cluster
        .wait_until_allowed(&kubeconfig, &["create", "pods/exec", "-n", &ns])
        .unwrap();
    Tenant { ns, kubeconfig }
}

impl Tenant {
    fn kubectl(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["-n", &self.ns, "--request-timeout=60s"])
            .args(args)
            .env_remove("KUBECONFIG");
        c
    }

    /// Runs kubectl as the tenant: (success, stdout, stderr). A command still running after
    /// 30 s (an attach or a follow that got a stream) is stopped and counts as a success: it
    /// reached something.
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let mut child = self
            .kubectl(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let out = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = out.read_to_string(&mut text);
            text
        });
        let err = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = err.read_to_string(&mut text);
            text
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let success = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status.success();
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break true;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        (success, out.join().unwrap(), err.join().unwrap())
    }

    /// Creates pod `name` on the victim's node with `annotations`, as the tenant.
    async fn pod(&self, node: &Node, name: &str, annotations: &[(&str, &str)]) {
        let mut pod = crate::provider_support::agent_pod(name, annotations);
        pod.metadata.namespace = Some(self.ns.clone());
        pod.spec.as_mut().unwrap().node_name = Some(node.machine.node.clone());
        let client = crate::kube_support::client_for(&self.kubeconfig).await;
        Api::<Pod>::namespaced(client, &self.ns)
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("the tenant creates pod {name}: {e}"));
    }
}

/// Waits until the daemon has acted on the tenant's pod `name`: it is Ready (the attack got
/// through) or has a Warning Event (refused).
async fn settled(node: &Node, tenant: &Tenant, name: &str) {
    let pods = Api::<Pod>::namespaced(node.admin.clone(), &tenant.ns);
    eventually(60, &format!("{}/{name} Ready or warned about", tenant.ns), || {
        let pods = pods.clone();
        async move {
            let ready = pods.get_opt(name).await.unwrap().is_some_and(|p| is_ready(&p));
            ready
                || events_about(&node.admin, &tenant.ns, name)
                    .await
                    .iter()
                    .any(|(t, _, _)| t == "Warning")
        }
    })
    .await;
}

/// Waits for a Warning Event with `reason` on the tenant's pod `name`; returns its note.
async fn warned(node: &Node, tenant: &Tenant, name: &str, reason: &str) -> String {
    let mut seen;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        seen = events_about(&node.admin, &tenant.ns, name).await;
        if let Some((_, _, note)) = seen.iter().find(|(t, r, _)| t == "Warning" && r == reason) {
            return note.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no Warning {reason} on {}/{name} within 60 s; its events: {seen:?}\n--- daemon log ---\n{}",
            tenant.ns,
            node.daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The victim is as it was: its one VM with the same id, running, Ready, nothing saved of it
/// and nothing removed.
async fn victim_untouched(node: &Node, id: &str) {
    let vms = node.machine.vms_named("vm-web").await;
    assert_eq!(vms.len(), 1, "{vms:?}");
    assert_eq!(vms[0].id, id, "the victim's VM is the one it booted");
    assert_eq!(vms[0].state.as_str(), "running");
    let pod = Api::<Pod>::namespaced(node.admin.clone(), &node.ns)
        .get("web-0")
        .await
        .unwrap();
    assert!(is_up(&pod), "the victim's pod stays up: {:?}", pod.status);
    for verb in ["vm rm", "snapshot save", "vm net"] {
        let calls = node.machine.calls(verb);
        assert!(
            !calls.iter().any(|c| c.contains(id) || c.contains("vm-web")),
            "cocoon {verb} touched the victim: {calls:?}"
        );
    }
    let execs = node.machine.sim.exec_log().unwrap();
    assert!(
        execs.iter().all(|e| !e.argv.iter().any(|a| a == "tenant-probe")),
        "a tenant's command ran in the victim's guest: {execs:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_cannot_reach_another_tenants_vm_through_pod_annotations() {
    let Some(node) = exec_node_with("victim", &[("VK_PROBE_NETWORKS", GUEST_NETWORK)]).await else {
        return;
    };
    let victim = node.machine.vms_named("vm-web").await.remove(0);
    let victim_ip = victim.primary_ip().unwrap().to_string();
    let web_port = node.machine.sim.settings().unwrap().guest_http_ports[0].to_string();
    let mallory = tenant(&node).await;

    // 1. An unmanaged pod that names the victim's VM id and guest address.
    mallory
        .pod(
            &node,
            "steal-id",
            &[(NAME, "steal"), (VM_ID, &victim.id), (IP, &victim_ip)],
        )
        .await;
    settled(&node, &mallory, "steal-id").await;
    let (ok, out, err) = mallory.run(&["exec", "steal-id", "--", "echo", "tenant-probe"]);
    assert!(!ok && out.is_empty(), "exec into the stolen VM must fail: {out}{err}");
    let (ok, out, err) = mallory.run(&["logs", "steal-id"]);
    assert!(!ok && !out.contains("vm-web"), "logs of the stolen VM: {out}{err}");
    let (ok, _, err) = mallory.run(&["attach", "steal-id"]);
    assert!(!ok, "attach to the stolen VM's console must fail: {err}");
    // Port-forward to the victim guest's web server: kubectl listens, but no connection reaches
    // the guest.
    let mut pf = mallory
        .kubectl(&["port-forward", "pod/steal-id", &format!(":{web_port}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = pf.stdout.take().unwrap();
    let local = {
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while stdout.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        String::from_utf8_lossy(&line).into_owned()
    };
    if let Some(rest) = local.strip_prefix("Forwarding from 127.0.0.1:") {
        let port: u16 = rest.split_once(' ').unwrap().0.parse().unwrap();
        let answer = reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(format!("http://127.0.0.1:{port}/secret"))
            .timeout(Duration::from_secs(30))
            .send()
            .await;
        assert!(
            answer.is_err(),
            "the victim's guest answered the tenant's port-forward: {answer:?}"
        );
    }
    let _ = pf.kill();
    let _ = pf.wait();
    let note = warned(&node, &mallory, "steal-id", "VMOwnedByAnotherPod").await;
    assert!(note.contains(&victim.id) || note.contains("vm-web"), "{note}");

    // 2. A managed pod that names the victim's VM: not adopted; deleting it leaves the VM.
    mallory
        .pod(
            &node,
            "steal-name",
            &[(NAME, "vm-web"), (MANAGED, "true"), (IMAGE, "base")],
        )
        .await;
    settled(&node, &mallory, "steal-name").await;
    let (ok, out, err) = mallory.run(&["exec", "steal-name", "--", "echo", "tenant-probe"]);
    assert!(
        !ok && out.is_empty(),
        "exec into the victim's VM, adopted by name, must fail: {out}{err}"
    );
    let note = warned(&node, &mallory, "steal-name", "VMOwnedByAnotherPod").await;
    assert!(note.contains("vm-web"), "{note}");
    let client = crate::kube_support::client_for(&mallory.kubeconfig).await;
    Api::<Pod>::namespaced(client.clone(), &mallory.ns)
        .delete("steal-name", &DeleteParams::default())
        .await
        .unwrap();
    wait_pod(&node.admin, &mallory.ns, "steal-name", 60, "deleted", |p| p.is_none()).await;
    victim_untouched(&node, &victim.id).await;

    // 3. A fork of the victim's VM.
    mallory
        .pod(
            &node,
            "fork",
            &[(NAME, "vm-fork"), (MANAGED, "true"), (FORK_FROM, "vm-web")],
        )
        .await;
    warned(&node, &mallory, "fork", "VMOwnedByAnotherPod").await;
    assert!(node.machine.vms_named("vm-fork").await.is_empty());

    // 4. A clone of a directory of the host (here the victim's snapshot store).
    let store = node.machine.sim.root().join("snapshots").display().to_string();
    mallory
        .pod(
            &node,
            "dir",
            &[(NAME, "vm-dir"), (MANAGED, "true"), (CLONE_FROM_DIR, &store)],
        )
        .await;
    warned(&node, &mallory, "dir", "InvalidVMSpec").await;
    assert!(node.machine.calls("vm clone").iter().all(|c| !c.contains("--from-dir")));

    // 5. A VM id that is a path: the console socket and log file paths never leave cocoon's.
    let bait = tempfile::tempdir().unwrap();
    let console = std::os::unix::net::UnixListener::bind(bait.path().join("console.sock")).unwrap();
    console.set_nonblocking(true).unwrap();
    let path_id = bait.path().display().to_string();
    mallory
        .pod(&node, "path-id", &[(NAME, "path"), (VM_ID, &path_id), (IP, &victim_ip)])
        .await;
    warned(&node, &mallory, "path-id", "InvalidVMSpec").await;
    let (ok, _, err) = mallory.run(&["attach", "path-id"]);
    assert!(!ok, "{err}");
    assert!(
        console.accept().is_err(),
        "the daemon connected to a socket the tenant chose"
    );

    victim_untouched(&node, &victim.id).await;
    // The victim's own exec still works.
    let out = node
        .kubectl(&["exec", "-n", &node.ns, "web-0", "--", "echo", "still-mine"])
        .stdout;
    assert_eq!(String::from_utf8_lossy(&out).trim(), "still-mine");
}

/// Without `VK_PROBE_NETWORKS` the guest networks are derived: an address cocoon gave a guest,
/// or one in cocoon-net's pool. The node's own loopback is never one of them, so a guest
/// there (the simulator's guests are) is neither probed nor reachable by port-forward, and the
/// pod says why.
#[tokio::test(flavor = "multi_thread")]
async fn the_derived_guest_networks_never_include_the_nodes_loopback() {
    let Some(cluster) = crate::kube_support::shared().await else {
        return;
    };
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace("derived").await;
    let mut machine = Machine::new("derived");
    // Empty is unset: the daemon derives its guest networks.
    machine.daemon_env = vec![("VK_PROBE_NETWORKS".into(), String::new())];
    crate::provider_support::seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
    let mut daemon = machine.start_daemon(cluster);
    create_pod(
        &admin,
        &managed_pod(&ns, &machine.node, "lo-0", "vm-lo", &[(IMAGE, "base")]),
    )
    .await;
    let pod = wait_pod(
        &admin,
        &ns,
        "lo-0",
        90,
        "lifecycle ready, Not Ready naming the refusal",
        |p| {
            p.is_some_and(|p| {
                lifecycle(p) == Some("ready")
                    && ready_condition(p)
                        .is_some_and(|(status, message)| status == "False" && message.contains("special-purpose"))
            })
        },
    )
    .await
    .unwrap();
    let (_, message) = ready_condition(&pod).unwrap();
    let ip = machine
        .vms_named("vm-lo")
        .await
        .remove(0)
        .primary_ip()
        .unwrap()
        .to_string();
    assert!(message.contains(&ip), "the message names the address: {message}");
    // The refusal this test provoked, in the log as well (it would fail the test as an
    // unexpected probe off the machine otherwise).
    let refused = daemon.acknowledge_probe_refusals();
    assert!(
        !refused.is_empty() && refused.iter().all(|line| line.contains(&ip)),
        "the daemon logs the refused probe of {ip}: {refused:?}"
    );
}
