//! Policies from a real registry (Debian's docker-registry on loopback): a slot naming
//! `oci://…@sha256:…` serves it; a new digest in the configuration file swaps it with the same
//! checks as a file; a corrupt blob, a digest the registry does not have, an artifact of another
//! slot and a tag are refused with the last good version kept; a registry outage at startup is
//! served from the local store, and without a stored copy the start fails naming the reference.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use policy_artifacts::hostile;
use vk_cocoon::policy::config::PolicyConfig;
use vk_cocoon::policy::distribution::PolicyArtifact;
use vk_cocoon::policy::reload::PolicyReloader;
use vk_cocoon::policy::slots::BringUp;
use vk_cocoon::policy::status::ReloadResult;
use vk_cocoon::policy::{ContractVersion, LoadError, Policies, Slot};

use super::registry_support::TestRegistry;
use super::{clone_pod, policies, wait_until};

/// Pushes `component` as an artifact of `slot` (with `cases`, if any) to `repo:tag`; its digest.
fn push(reg: &TestRegistry, repo: &str, tag: &str, slot: Slot, component: &[u8], cases: Option<&str>) -> String {
    let artifact = PolicyArtifact {
        slot,
        contract: ContractVersion::CURRENT.to_string(),
        component: component.to_vec(),
        cases: cases.map(|c| c.as_bytes().to_vec()),
    };
    let upload = artifact.upload("policy.wasm", "2026-01-01T00:00:00Z");
    let registry = reg.client("", "");
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(registry.push_artifact(repo, tag, &upload))
        .expect("push")
}

struct Node {
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("policies.yaml");
        Node { dir, config }
    }

    fn artifacts(&self) -> PathBuf {
        self.dir.path().join("artifacts")
    }

    /// Writes the configuration file naming `source` for bring-up (atomically, as deploy tools do).
    fn configure(&self, source: &str, extra: &str) {
        let text = format!(
            "slots:\n  bring-up: {{source: '{source}'}}\nartifact-dir: {}\ncache-dir: null\n{extra}",
            self.artifacts().display()
        );
        let tmp = self.config.with_extension("tmp");
        fs::write(&tmp, text).unwrap();
        fs::rename(&tmp, &self.config).unwrap();
    }

    fn reloader(&self, policies: &Arc<Policies>) -> Arc<PolicyReloader> {
        let path = self.config.to_str().unwrap().to_string();
        let config = PolicyConfig::from_env(|k| (k == "VK_POLICY_CONFIG").then(|| path.clone())).unwrap();
        Arc::new(PolicyReloader::from_config(policies.clone(), &config))
    }
}

fn oci(reg: &TestRegistry, repo: &str, digest: &str) -> String {
    format!("oci://{}/{repo}@{digest}", reg.host())
}

const TABLE: &str = r#"
slot: bring-up
cases:
  - name: a plain clone
    pod: {metadata: {annotations: {vm.cocoonstack.io/name: vm1, cocoonset.cocoonstack.io/managed: "true", cocoonset.cocoonstack.io/image: "snap:v1"}}}
    expect: {outcome: {Proceed: {Clone: {local-snapshot: "snap:v1"}}}}
"#;

fn refused_reason(policies: &Policies) -> Option<&'static str> {
    match policies.status().current().refused.get(&Slot::BringUp)?.result {
        ReloadResult::Refused { reason, .. } => Some(reason),
        ReloadResult::Accepted { .. } => None,
    }
}

#[test]
fn a_slot_naming_a_digest_serves_it_and_a_new_digest_swaps_with_the_same_checks() {
    let reg = TestRegistry::start();
    let good = push(
        &reg,
        "policies/bring-up",
        "v1",
        Slot::BringUp,
        Slot::BringUp.default_component(),
        Some(TABLE),
    );
    let node = Node::new();
    node.configure(&oci(&reg, "policies/bring-up", &good), "");
    let policies = policies(None);
    let reloader = node.reloader(&policies);
    reloader.load_all().expect("the artifact passes its own table");
    let _watcher = reloader.clone().watch().unwrap();
    let active = policies.active(Slot::BringUp);
    assert_eq!(active.source, oci(&reg, "policies/bring-up", &good));
    assert_eq!(policies.decide::<BringUp>(&clone_pod()).reason, "clone");
    let serving = policies.digest(Slot::BringUp);

    // A new digest whose component fails the table it carries: refused, the last good serves.
    let failing = push(
        &reg,
        "policies/bring-up",
        "v2",
        Slot::BringUp,
        hostile::TRAPPER,
        Some(TABLE),
    );
    node.configure(&oci(&reg, "policies/bring-up", &failing), "");
    wait_until("the failing artifact is refused", || {
        refused_reason(&policies) == Some("cases_failed")
    });
    assert_eq!(policies.digest(Slot::BringUp), serving);

    // An artifact pushed for another slot is refused by its annotation.
    let admission = push(
        &reg,
        "policies/admission",
        "v1",
        Slot::CpuClassAdmission,
        Slot::CpuClassAdmission.default_component(),
        None,
    );
    node.configure(&oci(&reg, "policies/admission", &admission), "");
    wait_until("the other slot's artifact is refused", || {
        refused_reason(&policies) == Some("wrong_slot")
    });

    // A digest the registry does not have.
    let absent = format!("sha256:{}", "0".repeat(64));
    node.configure(&oci(&reg, "policies/bring-up", &absent), "");
    wait_until("the unknown digest is refused", || {
        refused_reason(&policies) == Some("fetch")
    });

    // A corrupt blob: the registry serves bytes that do not hash to the layer's digest.
    let corrupt = push(&reg, "policies/bring-up", "v3", Slot::BringUp, hostile::TRAPPER, None);
    let trapper_blob = reg.blob_path(&vk_cocoon::registry::manifest::sha256_digest(hostile::TRAPPER));
    let mut bytes = fs::read(&trapper_blob).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    fs::write(&trapper_blob, &bytes).unwrap();
    node.configure(&oci(&reg, "policies/bring-up", &corrupt), "");
    wait_until("the corrupt artifact is refused", || {
        policies.status().current().refused.get(&Slot::BringUp).is_some_and(|o| {
            matches!(&o.result, ReloadResult::Refused { message, .. } if message.contains(&corrupt) && message.contains("is corrupt"))
        })
    });
    assert_eq!(
        policies.digest(Slot::BringUp),
        serving,
        "the last good version keeps serving"
    );
    assert_eq!(policies.decide::<BringUp>(&clone_pod()).reason, "clone");

    // A sound new digest swaps in (the trapper without a table: it fails safe at decisions).
    fs::write(&trapper_blob, hostile::TRAPPER).unwrap();
    let trapper_ok = push(&reg, "policies/bring-up-2", "v1", Slot::BringUp, hostile::TRAPPER, None);
    node.configure(&oci(&reg, "policies/bring-up-2", &trapper_ok), "");
    wait_until("the new digest serves", || {
        policies.decide::<BringUp>(&clone_pod()).reason == "policy-failed"
    });
    assert!(
        policies.status().current().refused.is_empty(),
        "an accepted load clears the refusal"
    );
    assert_eq!(policies.metrics().reloads(Slot::BringUp, "ok"), 2);
}

#[test]
fn a_registry_outage_at_startup_serves_the_stored_digest_and_without_one_the_start_fails() {
    let mut reg = TestRegistry::start();
    let digest = push(
        &reg,
        "policies/bring-up",
        "v1",
        Slot::BringUp,
        Slot::BringUp.default_component(),
        Some(TABLE),
    );
    let node = Node::new();
    let source = oci(&reg, "policies/bring-up", &digest);
    node.configure(&source, "");
    node.reloader(&policies(None)).load_all().expect("first start pulls it");

    reg.kill();
    let restarted = policies(None);
    node.reloader(&restarted)
        .load_all()
        .expect("the stored copy serves through the outage");
    assert_eq!(restarted.active(Slot::BringUp).source, source);
    assert_eq!(restarted.decide::<BringUp>(&clone_pod()).reason, "clone");

    // A fresh node (empty store) cannot start on it, and says which reference and why.
    let fresh = Node::new();
    fresh.configure(&source, "");
    let error = fresh.reloader(&policies(None)).load_all().unwrap_err();
    assert!(matches!(error, LoadError::Fetch { .. }), "{error}");
    let text = error.to_string();
    assert!(text.contains(&source) && text.contains("no copy to serve"), "{text}");
}

#[test]
fn a_tag_is_refused_unless_allowed_and_then_resolved_to_a_digest() {
    let reg = TestRegistry::start();
    let digest = push(
        &reg,
        "policies/bring-up",
        "stable",
        Slot::BringUp,
        Slot::BringUp.default_component(),
        None,
    );
    let tagged = format!("oci://{}/policies/bring-up:stable", reg.host());
    let node = Node::new();
    node.configure(&tagged, "");
    let error = node.reloader(&policies(None)).load_all().unwrap_err();
    assert!(error.to_string().contains("pinned by digest"), "{error}");

    node.configure(&tagged, "allow-tags: true\n");
    let policies = policies(None);
    node.reloader(&policies).load_all().expect("an allowed tag resolves");
    assert_eq!(
        policies.active(Slot::BringUp).source,
        oci(&reg, "policies/bring-up", &digest)
    );
}

/// What the daemon's `VK_POLICY_*` accepts is what the config file accepts.
#[test]
fn the_environment_names_a_registry_source_like_the_file() {
    let reg = TestRegistry::start();
    let digest = push(
        &reg,
        "p/b",
        "v1",
        Slot::BringUp,
        Slot::BringUp.default_component(),
        None,
    );
    let dir = tempfile::tempdir().unwrap();
    let vars = BTreeMap::from([
        ("VK_POLICY_BRING_UP".to_string(), oci(&reg, "p/b", &digest)),
        ("VK_POLICY_ARTIFACT_DIR".to_string(), dir.path().display().to_string()),
    ]);
    let config = PolicyConfig::from_env(|k| vars.get(k).cloned()).unwrap();
    let policies = policies(None);
    PolicyReloader::from_config(policies.clone(), &config)
        .load_all()
        .unwrap();
    assert_eq!(policies.active(Slot::BringUp).source, oci(&reg, "p/b", &digest));
    assert!(stored(dir.path()), "the artifact is kept by digest");
}

fn stored(dir: &Path) -> bool {
    fs::read_dir(dir.join("sha256")).is_ok_and(|mut d| d.next().is_some())
}
