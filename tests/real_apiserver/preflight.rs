//! The RBAC preflight against the real authorizers (Node, RBAC): the daemon run with a node
//! identity (`system:node:NAME`, which cannot patch pod metadata), and with a ClusterRole missing
//! one verb of `deploy/rbac.yaml`, stops at startup — before it lists, registers or writes
//! anything — with one message naming what is missing. (Real server: only real authorizers can
//! say no; the fake allows everything.)

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use vk_cocoon::runtime::CocoonRuntime;

use crate::daemon::*;
use crate::kube_support::{self, DAEMON_NAMESPACE, KubeCluster};

/// The `may not: …;` list of the preflight's message in `log`.
fn missing_list(log: &str) -> Vec<String> {
    let line = log
        .lines()
        .find(|l| l.contains("RBAC preflight:") && l.contains("may not:"))
        .unwrap_or_else(|| panic!("no preflight message in the log:\n{log}"));
    let after = line.split_once("may not: ").unwrap().1;
    let list = after
        .split_once("; vk-cocoon needs")
        .expect("the fix follows the list")
        .0;
    // "verb resource (what for), verb resource (what for)" → the "verb resource" parts.
    list.split("), ")
        .map(|item| item.split_once(" (").map_or(item, |(name, _)| name).to_string())
        .collect()
}

/// Runs the daemon as `kubeconfig` and returns its log once it has exited with a failure.
async fn stopped_at_startup(cluster: &KubeCluster, machine: &Machine, kubeconfig: &std::path::Path) -> String {
    let mut daemon = machine.start_daemon_as(kubeconfig);
    let status = daemon.exited(60).await;
    let log = daemon.log();
    assert!(
        !status.success(),
        "the daemon must not run without its permissions:\n{log}"
    );
    let nodes: Api<Node> = Api::all(cluster.admin_client().await);
    assert!(
        nodes.get_opt(&machine.node).await.unwrap().is_none(),
        "nothing registered before the preflight"
    );
    log
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_identity_stops_the_daemon_at_startup_naming_the_pod_patch_it_lacks() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let machine = Machine::new("vk-as-node");
    let kubeconfig = cluster.node_kubeconfig(&machine.node).unwrap();
    let log = stopped_at_startup(cluster, &machine, &kubeconfig).await;
    let who = format!("the identity system:node:{} may not:", machine.node);
    assert!(log.contains(&who), "{log}");
    // The Node authorizer grants the rest. It answers a pod `get` only for a named pod bound to
    // the node, which an unnamed review cannot name, so that is reported too.
    assert_eq!(missing_list(&log), vec!["get pods", "patch pods"], "{log}");
    assert!(log.contains("deploy/rbac.yaml"), "{log}");
    assert!(log.contains("cannot patch pod metadata"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_role_missing_one_verb_stops_the_daemon_naming_that_verb() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let account = kube_support::unique("vk-cocoon-no-delete");
    let manifest = rbac_without(&account, "pods", "delete");
    let file = cluster.state_dir().join(format!("{account}.json"));
    std::fs::write(&file, manifest).unwrap();
    cluster
        .kubectl_checked(&["apply", "-f", &file.display().to_string()])
        .unwrap();
    let kubeconfig = cluster.service_account_kubeconfig(DAEMON_NAMESPACE, &account).unwrap();
    // The binding is in effect (a verb it does grant) before the daemon asks.
    cluster
        .wait_until_allowed(&kubeconfig, &["patch", "pods", "--all-namespaces"])
        .unwrap();

    let machine = Machine::new("vk-no-delete");
    let log = stopped_at_startup(cluster, &machine, &kubeconfig).await;
    assert_eq!(missing_list(&log), vec!["delete pods"], "{log}");
    let who = format!("the identity system:serviceaccount:{DAEMON_NAMESPACE}:{account} may not:");
    assert!(log.contains(&who), "{log}");
    assert!(log.contains("deploy/rbac.yaml"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cocoon_older_than_the_floor_stops_the_daemon_naming_the_minimum() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    // The daemon's own identity: only the cocoon build is wrong.
    let machine = Machine::new("vk-old-cocoon");
    machine
        .sim
        .set_settings(|s| s.version = "v0.5.7-14-g4feeddc".into())
        .unwrap();
    let log = stopped_at_startup(cluster, &machine, &cluster.daemon_kubeconfig_path()).await;
    assert!(
        log.contains("is v0.5.7-14-g4feeddc, older than v0.5.8") && log.contains("install cocoon v0.5.8 or newer"),
        "{log}"
    );
    assert!(
        log.contains("VK_COCOON_BIN"),
        "the message says what to point where: {log}"
    );
    let verbs: Vec<String> = machine.sim.calls().unwrap().into_iter().map(|c| c.verb).collect();
    assert_eq!(verbs, ["version"], "nothing was asked of cocoon beyond its version");
    // What the floor spares the pods: this build does not know the daemon's verbs.
    let err = machine.runtime.reconcile_stale_create("vm-x").await.unwrap_err();
    assert!(format!("{err:?}").contains("unknown command"), "{err:?}");

    // A release at the floor runs (the rest of the suite runs the simulator's newer default).
    machine.sim.set_settings(|s| s.version = "v0.5.8".into()).unwrap();
    let mut daemon = machine.start_daemon(cluster);
    machine.wait_registered(cluster).await;
    assert!(daemon.log().contains("cocoon version"), "{}", daemon.log());
    assert!(daemon.terminate().await.success(), "{}", daemon.log());
}

/// `deploy/rbac.yaml` as a List for ServiceAccount, ClusterRole and binding all named `name`,
/// with `verb` taken out of the rule for `resource`.
fn rbac_without(name: &str, resource: &str, verb: &str) -> String {
    use serde::Deserialize;
    let text = std::fs::read_to_string(kube_support::rbac_yaml()).unwrap();
    let mut items = Vec::new();
    let mut removed = false;
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let mut object = serde_json::Value::deserialize(doc).unwrap();
        object["metadata"]["name"] = name.into();
        match object["kind"].as_str().unwrap() {
            "ClusterRole" => {
                for rule in object["rules"].as_array_mut().unwrap() {
                    if rule["resources"] == serde_json::json!([resource]) {
                        let verbs = rule["verbs"].as_array_mut().unwrap();
                        let before = verbs.len();
                        verbs.retain(|v| v != verb);
                        removed |= verbs.len() < before;
                    }
                }
            }
            "ClusterRoleBinding" => {
                object["roleRef"]["name"] = name.into();
                object["subjects"][0]["name"] = name.into();
            }
            _ => {}
        }
        items.push(object);
    }
    assert!(
        removed,
        "deploy/rbac.yaml grants {verb} {resource} in a rule of its own resource"
    );
    serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string()
}
