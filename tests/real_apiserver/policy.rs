//! The node's policies in the cluster: a daemon whose bring-up slot names a registry artifact by
//! digest serves it and says so on its Node (an annotation per slot with the digest, one with the
//! source, `PolicyReady`); a new digest the registry does not have is refused — `PolicyReady`
//! turns False naming the slot and the reason, the annotation keeps the serving digest, a Warning
//! Event lands on the Node — and `kubectl describe node` / `get node -o json` show all of it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use vk_cocoon::policy::distribution::PolicyArtifact;
use vk_cocoon::policy::{ContractVersion, Slot};

use crate::daemon::*;
use crate::kube_support;

fn annotations(node: &Node) -> BTreeMap<String, String> {
    node.metadata.annotations.clone().unwrap_or_default()
}

fn policy_ready(node: &Node) -> Option<(String, String, String)> {
    let c = node
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PolicyReady")?;
    Some((
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ))
}

fn write_config(path: &std::path::Path, source: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("slots:\n  bring-up: {{source: '{source}'}}\n")).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_node_shows_the_digest_of_each_slot_and_a_refused_reload() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let admin = cluster.admin_client().await;
    let mut machine = Machine::new("vk-policy").with_registry();
    let reg = machine.registry.as_ref().unwrap();
    let upload = PolicyArtifact {
        slot: Slot::BringUp,
        contract: ContractVersion::CURRENT.to_string(),
        component: Slot::BringUp.default_component().to_vec(),
        cases: None,
    }
    .upload("bring-up.wasm", "2026-01-01T00:00:00Z");
    let digest = reg
        .client("", "")
        .push_artifact("policies/bring-up", "v1", &upload)
        .await
        .unwrap();
    let good = format!("oci://{}/policies/bring-up@{digest}", reg.host());
    let config = machine.dir.path().join("policies.yaml");
    write_config(&config, &good);
    let artifacts = machine.dir.path().join("artifacts");
    machine.daemon_env.extend([
        ("VK_POLICY_CONFIG".to_string(), config.display().to_string()),
        ("VK_POLICY_ARTIFACT_DIR".to_string(), artifacts.display().to_string()),
    ]);
    let mut daemon = machine.start_daemon(cluster);
    let nodes: Api<Node> = Api::all(admin.clone());
    let name = machine.node.clone();
    let component = vk_cocoon::registry::manifest::sha256_digest(Slot::BringUp.default_component());

    let get = |nodes: Api<Node>, name: String| async move { nodes.get_opt(&name).await.unwrap() };
    eventually(60, "the Node names the artifact serving bring-up", || {
        let (good, component) = (good.clone(), component.clone());
        let fetch = get(nodes.clone(), name.clone());
        async move {
            fetch.await.is_some_and(|n| {
                let a = annotations(&n);
                a.get("policy.cocoonstack.io/bring-up.source") == Some(&good)
                    && a.get("policy.cocoonstack.io/bring-up") == Some(&component)
                    && policy_ready(&n).is_some_and(|(status, _, _)| status == "True")
            })
        }
    })
    .await;
    let node = nodes.get(&name).await.unwrap();
    let a = annotations(&node);
    assert_eq!(a["policy.cocoonstack.io/guest-fixup.source"], "builtin");
    assert_eq!(
        a["policy.cocoonstack.io/bring-up.contract"],
        ContractVersion::CURRENT.to_string()
    );
    assert!(a["policy.cocoonstack.io/snapshot-before-destroy"].starts_with("sha256:"));

    // A digest the registry does not have: refused, the good one keeps serving.
    let absent = format!("oci://{}/policies/bring-up@sha256:{}", reg.host(), "0".repeat(64));
    write_config(&config, &absent);
    eventually(60, "PolicyReady turns False naming bring-up", || {
        let fetch = get(nodes.clone(), name.clone());
        async move {
            fetch
                .await
                .and_then(|n| policy_ready(&n))
                .is_some_and(|(status, reason, message)| {
                    status == "False" && reason == "PolicyReloadRefused" && message.contains("slot bring-up")
                })
        }
    })
    .await;
    let node = nodes.get(&name).await.unwrap();
    assert_eq!(
        annotations(&node)["policy.cocoonstack.io/bring-up"],
        component,
        "the last good digest serves"
    );
    let (_, _, message) = policy_ready(&node).unwrap();
    assert!(message.contains(&absent) && message.contains("fetch"), "{message}");

    // What an operator sees: kubectl describe node (annotations, the condition, both Events).
    eventually(60, "kubectl describe node shows the policies and both Events", || {
        let out = cluster.kubectl(&["describe", "node", &name]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        async move {
            text.contains("policy.cocoonstack.io/bring-up.source")
                && text.contains("PolicyReady")
                && text.contains("PolicyReloadRefused")
                && text.contains("PolicyRefused")
                && text.contains("PolicyLoaded")
        }
    })
    .await;
    let out = cluster.kubectl(&["get", "node", &name, "-o", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("kubectl get node -o json");
    assert_eq!(
        json["metadata"]["annotations"]["policy.cocoonstack.io/bring-up.source"],
        good.as_str()
    );

    // The good digest again: ready.
    write_config(&config, &good);
    eventually(60, "PolicyReady is True again", || {
        let fetch = get(nodes.clone(), name.clone());
        async move {
            fetch
                .await
                .and_then(|n| policy_ready(&n))
                .is_some_and(|(status, _, _)| status == "True")
        }
    })
    .await;
    // The daemon compiled every component in a worker process, none in itself.
    let log = daemon.log();
    assert!(log.contains("policy compiled in a worker process"), "{log}");
    assert!(!log.contains("compiling in the daemon"), "{log}");
    assert!(daemon.terminate().await.success(), "{}", daemon.log());
}
