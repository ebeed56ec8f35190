//! Swapping a slot's policy without rebuilding: the operator's file is validated (and its case
//! table run) before an atomic swap; a bad version keeps the last good one and says why; the
//! compile cache survives restarts.

mod distribution;
use crate::registry_support;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use policy_artifacts::hostile;
use vk_cocoon::policy::config::SlotConfig;
use vk_cocoon::policy::contract::bring_up::Facts;
use vk_cocoon::policy::input::{DecisionInput, facts_for};
use vk_cocoon::policy::reload::PolicyReloader;
use vk_cocoon::policy::slots::BringUp;
use vk_cocoon::policy::{CompileCache, LoadError, Policies, PolicyEngine, PolicyMetrics, SandboxLimits, Slot};

fn policies(cache: Option<CompileCache>) -> Arc<Policies> {
    let engine = PolicyEngine::new(SandboxLimits::default()).unwrap();
    Arc::new(Policies::with_defaults(engine, cache, PolicyMetrics::unregistered()).unwrap())
}

fn clone_pod() -> Facts {
    let input: DecisionInput = serde_yaml_ng::from_str(
        "pod: {metadata: {namespace: ns, name: p, annotations: {vm.cocoonstack.io/name: vm1, cocoonset.cocoonstack.io/managed: 'true', cocoonset.cocoonstack.io/image: 'snap:v1'}}}",
    )
    .unwrap();
    facts_for::<BringUp>(&input).unwrap()
}

/// Replaces `path` the way deploy tools do: write aside, then rename over it.
fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, bytes).unwrap();
    fs::rename(&tmp, path).unwrap();
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_changed_file_changes_the_next_decision_and_a_bad_one_keeps_the_last_good() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bring-up.wasm");
    fs::write(&path, Slot::BringUp.default_component()).unwrap();
    let policies = policies(None);
    let slots = BTreeMap::from([(Slot::BringUp, SlotConfig::file(path.clone()))]);
    let reloader = Arc::new(PolicyReloader::new(policies.clone(), slots));
    reloader.load_all().unwrap();
    let _watcher = reloader.clone().watch().unwrap();
    assert_eq!(policies.decide::<BringUp>(&clone_pod()).reason, "clone");

    // A valid component that decides differently (it traps, so bring-up fails safe).
    replace(&path, hostile::TRAPPER);
    wait_until("the new component serves", || {
        policies.decide::<BringUp>(&clone_pod()).reason == "policy-failed"
    });
    assert_eq!(policies.metrics().reloads(Slot::BringUp, "ok"), 2);

    // A corrupt file is refused; the trapper stays installed.
    let serving = policies.digest(Slot::BringUp);
    replace(&path, b"not wasm at all");
    wait_until("the corrupt file is refused", || {
        policies.metrics().reloads(Slot::BringUp, "corrupt") >= 1
    });
    assert_eq!(policies.digest(Slot::BringUp), serving);

    // A WASI component is refused too.
    replace(&path, hostile::WASI_IMPORTER);
    wait_until("the WASI file is refused", || {
        policies.metrics().reloads(Slot::BringUp, "forbidden_imports") >= 1
    });
    assert_eq!(policies.digest(Slot::BringUp), serving);

    // And the good default comes back.
    replace(&path, Slot::BringUp.default_component());
    wait_until("the default serves again", || {
        policies.decide::<BringUp>(&clone_pod()).reason == "clone"
    });
}

#[test]
fn a_case_table_beside_the_component_guards_every_swap() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bring-up.wasm");
    fs::write(&path, Slot::BringUp.default_component()).unwrap();
    fs::write(
        dir.path().join("bring-up.cases.yaml"),
        r#"
slot: bring-up
cases:
  - name: a plain clone
    pod: {metadata: {annotations: {vm.cocoonstack.io/name: vm1, cocoonset.cocoonstack.io/managed: "true", cocoonset.cocoonstack.io/image: "snap:v1"}}}
    expect: {outcome: {Proceed: {Clone: {local-snapshot: "snap:v1"}}}}
"#,
    )
    .unwrap();
    let policies = policies(None);
    let slots = BTreeMap::from([(Slot::BringUp, SlotConfig::file(path.clone()))]);
    let reloader = PolicyReloader::new(policies.clone(), slots);
    reloader.load_all().expect("the default passes its table");
    let good = policies.digest(Slot::BringUp);

    fs::write(&path, hostile::TRAPPER).unwrap();
    let error = reloader.reload(Slot::BringUp).unwrap_err();
    match &error {
        LoadError::CasesFailed {
            failed, total, first, ..
        } => {
            assert_eq!((*failed, *total), (1, 1));
            assert!(first.contains("a plain clone"), "{first}");
        }
        other => panic!("expected the table to refuse the swap, got {other}"),
    }
    assert_eq!(
        policies.digest(Slot::BringUp),
        good,
        "the last good version keeps serving"
    );
    assert_eq!(policies.metrics().reloads(Slot::BringUp, "cases_failed"), 1);
    assert_eq!(policies.decide::<BringUp>(&clone_pod()).reason, "clone");
}

#[test]
fn a_bad_operator_policy_at_startup_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("admission.wasm");
    fs::write(&path, hostile::WASI_IMPORTER).unwrap();
    let slots = BTreeMap::from([(Slot::CpuClassAdmission, SlotConfig::file(path.clone()))]);
    let error = PolicyReloader::new(policies(None), slots).load_all().unwrap_err();
    assert!(error.to_string().contains(&path.display().to_string()), "{error}");

    let missing = BTreeMap::from([(Slot::CpuClassAdmission, SlotConfig::file(dir.path().join("nope.wasm")))]);
    let error = PolicyReloader::new(policies(None), missing).load_all().unwrap_err();
    assert!(matches!(error, LoadError::Read { .. }), "{error}");
}

#[test]
fn compiled_components_are_cached_by_digest_and_engine() {
    let dir = tempfile::tempdir().unwrap();
    let cache = CompileCache::new(dir.path());
    drop(policies(Some(cache.clone())));
    let entries: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".cwasm"))
        .collect();
    assert_eq!(
        entries.len(),
        Slot::ALL.len(),
        "one compiled entry per default policy: {entries:?}"
    );
    assert!(entries.iter().all(|n| n.contains("-wasmtime-48.0.8-")), "{entries:?}");

    // A tampered entry is detected and recompiled; the policies still decide correctly.
    let victim = dir.path().join(&entries[0]);
    fs::write(&victim, b"garbage").unwrap();
    let restarted = policies(Some(cache));
    assert_eq!(restarted.decide::<BringUp>(&clone_pod()).reason, "clone");
    assert_ne!(fs::read(&victim).unwrap(), b"garbage", "the entry was rewritten");
}
