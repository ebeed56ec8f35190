//! The node's policies in the cluster: a daemon whose bring-up slot names a registry artifact by
//! digest serves it and says so on its Node (an annotation per slot with the digest, one with the
//! source, `PolicyReady`); a new digest the registry does not have is refused — `PolicyReady`
//! turns False naming the slot and the reason, the annotation keeps the serving digest, a Warning
//! Event lands on the Node — and `kubectl describe node` / `get node -o json` show all of it.
//!
//! And policies in other languages in the daemon (issue 40): `vk-cocoon run` with the Python
//! snapshot-before-destroy and the JavaScript cpu-class-admission examples configured decides
//! pods with them — the JavaScript one refuses a pod pinned to another CPU class, the Python one
//! has the VM saved and pushed before its delete — as its decision log and the cluster show.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use vk_cocoon::policy::decision_log::DecisionRecord;
use vk_cocoon::policy::distribution::PolicyArtifact;
use vk_cocoon::policy::{ContractVersion, Slot};
use vk_cocoon::registry::ManifestLookup;

use crate::daemon::*;
use crate::kube_support;
use crate::provider_support::seed_snapshot_on;

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

/// The example components of `policies/examples` (built by `.ci/test` with
/// `policies/examples/build.sh`), or `None` — the test then says it is skipped; under CI=true
/// their absence is a failure.
fn examples_dir() -> Option<std::path::PathBuf> {
    crate::policy_examples::dir_with(&["snapshot-before-destroy-py.wasm", "cpu-class-admission-js.wasm"])
}

/// The decision log's records of `slot` about pod `name` (the facts name the pod).
fn decisions_about(log: &std::path::Path, slot: Slot, name: &str) -> Vec<DecisionRecord> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str::<DecisionRecord>(line).expect("a decision log line"))
        .filter(|r| r.slot == slot && r.facts["pod"]["name"] == name)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn python_and_javascript_policies_decide_pods_in_the_daemon() {
    let Some(examples) = examples_dir() else {
        return;
    };
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace("lang").await;
    let mut machine = Machine::new("vk-lang").with_registry();
    seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
    let python = examples.join("snapshot-before-destroy-py.wasm");
    let javascript = examples.join("cpu-class-admission-js.wasm");
    let log = machine.dir.path().join("decisions.jsonl");
    machine.daemon_env.extend([
        (
            "VK_POLICY_SNAPSHOT_BEFORE_DESTROY".to_string(),
            python.display().to_string(),
        ),
        (
            "VK_POLICY_CPU_CLASS_ADMISSION".to_string(),
            javascript.display().to_string(),
        ),
        ("VK_SNAPSHOT_CPU_CLASS".to_string(), "genoa".to_string()),
        ("VK_DECISION_LOG".to_string(), log.display().to_string()),
    ]);
    let mut daemon = machine.start_daemon(cluster);

    // The node registers once every slot is loaded: CPython compiles for tens of seconds on a
    // busy machine, so the wait is longer than a Rust-only start's.
    let nodes: Api<Node> = Api::all(admin.clone());
    let name = machine.node.clone();
    let sources = |node: &Node| {
        let a = annotations(node);
        (
            a.get("policy.cocoonstack.io/snapshot-before-destroy.source").cloned(),
            a.get("policy.cocoonstack.io/cpu-class-admission.source").cloned(),
        )
    };
    let (python_source, javascript_source) = (
        format!("file:{}", python.display()),
        format!("file:{}", javascript.display()),
    );
    eventually(240, "the Node says the examples serve both slots", || {
        let (nodes, name) = (nodes.clone(), name.clone());
        let want = (Some(python_source.clone()), Some(javascript_source.clone()));
        async move { nodes.get_opt(&name).await.unwrap().is_some_and(|n| sources(&n) == want) }
    })
    .await;

    // A pod pinned to the node's class, and one pinned to another class.
    let pinned = |name: &str, vm: &str, class: &str| {
        let mut pod: Pod = managed_pod(&ns, &machine.node, name, vm, &[(IMAGE, "base")]);
        pod.spec.as_mut().unwrap().node_selector =
            Some([("cocoonstack.io/snapshot-cpu-class".to_string(), class.to_string())].into());
        pod
    };
    create_pod(&admin, &pinned("saved-0", "vm-saved", "genoa")).await;
    create_pod(&admin, &pinned("foreign-0", "vm-foreign", "skylake")).await;
    wait_up(&admin, &ns, "saved-0").await;

    // The JavaScript policy refuses the foreign class: permanently (the pod fails), with its
    // Event, and no VM is made for it.
    let refused = wait_pod(&admin, &ns, "foreign-0", 60, "phase Failed", |p| {
        p.is_some_and(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed"))
    })
    .await
    .unwrap();
    let message = annotation(&refused, LIFECYCLE_MESSAGE).unwrap_or_default();
    assert!(
        message.contains(r#"requires snapshot compatibility class "skylake""#),
        "{message}"
    );
    eventually(30, "a Warning SnapshotCPUClassMismatch Event about foreign-0", || {
        let (admin, ns) = (admin.clone(), ns.clone());
        async move {
            events_about(&admin, &ns, "foreign-0")
                .await
                .iter()
                .any(|(kind, reason, _)| kind == "Warning" && reason == "SnapshotCPUClassMismatch")
        }
    })
    .await;
    assert!(
        machine.vms_named("vm-foreign").await.is_empty(),
        "no VM for the refused pod"
    );

    // Delete the admitted pod as an operator does: the Python policy's snapshot decision has the
    // guest saved and pushed before the VM goes.
    cluster
        .kubectl_checked(&["delete", "pod", "saved-0", "-n", &ns, "--timeout=120s"])
        .unwrap();
    assert!(machine.vms_named("vm-saved").await.is_empty(), "the VM removed");
    match machine.registry_client().manifest("vm-saved", "latest").await.unwrap() {
        ManifestLookup::Found(artifact) => assert_eq!(artifact.annotations["cocoonstack.snapshot.baseimage"], "base"),
        ManifestLookup::Absent => panic!("vm-saved:latest was not pushed"),
    }

    // Who decided: the decision log names each component, and neither decision was a fail-safe
    // (the snapshot slot's fail-safe also snapshots, so the push alone would not tell).
    eventually(30, "the decision log has both decisions", || {
        let log = log.clone();
        async move {
            !decisions_about(&log, Slot::CpuClassAdmission, "foreign-0").is_empty()
                && !decisions_about(&log, Slot::SnapshotBeforeDestroy, "saved-0").is_empty()
        }
    })
    .await;
    for record in decisions_about(&log, Slot::CpuClassAdmission, "foreign-0") {
        assert_eq!(record.source, javascript_source);
        assert!(record.fail_safe.is_none(), "{record:?}");
        assert_eq!(record.decision["reason"], "class-mismatch", "{record:?}");
    }
    let admitted = decisions_about(&log, Slot::CpuClassAdmission, "saved-0");
    assert!(
        admitted
            .iter()
            .any(|r| r.source == javascript_source && r.decision["verdict"] == "Admit"),
        "{admitted:?}"
    );
    for record in decisions_about(&log, Slot::SnapshotBeforeDestroy, "saved-0") {
        assert_eq!(record.source, python_source);
        assert!(record.fail_safe.is_none(), "{record:?}");
        assert_eq!(
            record.decision["outcome"]["Snapshot"]["repository"], "vm-saved",
            "{record:?}"
        );
    }
    assert!(daemon.terminate().await.success(), "{}", daemon.log());
}
