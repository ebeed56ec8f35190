//! Policies in Python and JavaScript (issue 40): the examples under `policies/examples`, built
//! by their own toolchains (componentize-py, componentize-qjs) from `wit/vk-policy.wit` with
//! `policies/examples/build.sh`, pass the Rust defaults' case tables through `vk-cocoon policy
//! test`, run in the pool of large components, and what each language's clock and random do
//! inside a decision is pinned here.
//!
//! The components are built by `.ci/test` (into `target/policy-examples`, or
//! `$VK_POLICY_EXAMPLES_DIR`); without them these tests say they are skipped, except under
//! `CI=true`, where that is a failure.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use vk_cocoon::policy::input::{DecisionInput, facts_for};
use vk_cocoon::policy::slots::{CpuClassAdmission, SnapshotBeforeDestroy};
use vk_cocoon::policy::{DecisionError, LoadedPolicy, Origin, PolicyEngine, PolicySlot, SandboxLimits, Slot};

/// Every example, since the last component `build.sh` writes is there.
fn examples_dir() -> Option<PathBuf> {
    crate::policy_examples::dir_with(&["probe-js-async.wasm"])
}

/// Runs `vk-cocoon policy test TABLE --component COMPONENT` and checks every row passed.
fn table_passes(table: &str, component: &Path) {
    let table = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies").join(table);
    let rows = std::fs::read_to_string(&table).unwrap().matches("\n  - name: ").count();
    assert!(rows >= 10, "{} has its rows", table.display());
    let out = Command::new(env!("CARGO_BIN_EXE_vk-cocoon"))
        .args(["policy", "test"])
        .arg(&table)
        .arg("--component")
        .arg(component)
        .output()
        .expect("run vk-cocoon");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains(&format!("on the policy component {}", component.display())),
        "the table ran against the example, not the built-in policy:\n{text}"
    );
    assert_eq!(
        text.lines().last(),
        Some(format!("{rows} passed, 0 failed").as_str()),
        "{text}"
    );
}

#[test]
fn the_python_snapshot_policy_passes_the_rust_defaults_table() {
    let Some(dir) = examples_dir() else { return };
    table_passes(
        "snapshot-before-destroy/snapshot-before-destroy.cases.yaml",
        &dir.join("snapshot-before-destroy-py.wasm"),
    );
}

#[test]
fn the_javascript_admission_policy_passes_the_rust_defaults_table() {
    let Some(dir) = examples_dir() else { return };
    table_passes(
        "cpu-class-admission/cpu-class-admission.cases.yaml",
        &dir.join("cpu-class-admission-js.wasm"),
    );
}

#[test]
fn policy_check_reports_the_shape_the_pool_and_the_compile() {
    let Some(dir) = examples_dir() else { return };
    let component = dir.join("cpu-class-admission-js.wasm");
    let out = Command::new(env!("CARGO_BIN_EXE_vk-cocoon"))
        .args(["policy", "check"])
        .arg(&component)
        .output()
        .expect("run vk-cocoon");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    // QuickJS, built --sync: its interpreter, its libc and the bindings' glue are separate
    // modules with memories of their own (the Rust guests have one of each).
    assert!(
        text.contains("11 core instances, 3 memories") && text.contains("the pool of large components"),
        "{text}"
    );
    assert!(
        text.contains("compiled in ") && text.contains("KiB of native code"),
        "{text}"
    );
    assert!(
        text.contains("implements slot cpu-class-admission") && !text.contains("implements slot bring-up"),
        "{text}"
    );
}

#[test]
fn a_component_built_for_the_async_abi_is_refused_saying_how_to_build_it() {
    let Some(dir) = examples_dir() else { return };
    let path = dir.join("probe-js-async.wasm");
    let bytes = std::fs::read(&path).unwrap();
    let Err(error) = LoadedPolicy::<CpuClassAdmission>::load(engine(), None, Origin::File(path), &bytes) else {
        panic!("the host does not enable the component-model async ABI: the component must be refused");
    };
    let text = error.to_string();
    assert!(
        text.contains("async") && text.contains("componentize-qjs --sync"),
        "{text}"
    );
}

// ---- clock and random inside a decision ---------------------------------------------------

const MEMORY_BYTES: usize = 32 << 20;

fn engine() -> &'static PolicyEngine {
    static ENGINE: OnceLock<PolicyEngine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        PolicyEngine::new(SandboxLimits {
            memory_bytes: MEMORY_BYTES,
            // CPython's first decision in a loaded test run can take a few milliseconds.
            timeout: Duration::from_secs(2),
            ..SandboxLimits::default()
        })
        .unwrap()
    })
}

fn load<S: PolicySlot>(path: PathBuf) -> LoadedPolicy<S> {
    let bytes = std::fs::read(&path).unwrap();
    let policy = LoadedPolicy::<S>::load(engine(), None, Origin::File(path.clone()), &bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        policy.is_large(),
        "{} runs in the pool of large components",
        path.display()
    );
    policy
}

fn python_probe() -> Option<&'static LoadedPolicy<SnapshotBeforeDestroy>> {
    static PROBE: OnceLock<LoadedPolicy<SnapshotBeforeDestroy>> = OnceLock::new();
    let dir = examples_dir()?;
    Some(PROBE.get_or_init(|| load(dir.join("probe-py.wasm"))))
}

fn js_probe() -> Option<&'static LoadedPolicy<CpuClassAdmission>> {
    static PROBE: OnceLock<LoadedPolicy<CpuClassAdmission>> = OnceLock::new();
    let dir = examples_dir()?;
    Some(PROBE.get_or_init(|| load(dir.join("probe-js.wasm"))))
}

fn facts<S: PolicySlot>(probe: &str) -> S::Facts {
    let input: DecisionInput = serde_yaml_ng::from_str(&format!(
        "pod: {{metadata: {{namespace: ns, name: p, annotations: {{probe: {probe}, vm.cocoonstack.io/name: vm1}}}}}}"
    ))
    .unwrap();
    facts_for::<S>(&input).unwrap()
}

/// The message of the probe's answer (what the call returned), or why the decision failed.
fn py(probe: &str) -> Result<String, DecisionError> {
    let policy = python_probe().expect("checked by the caller");
    policy
        .decide(engine(), &facts::<SnapshotBeforeDestroy>(probe))
        .map(|d| d.message)
}

fn js(probe: &str) -> Result<String, DecisionError> {
    let policy = js_probe().expect("checked by the caller");
    policy
        .decide(engine(), &facts::<CpuClassAdmission>(probe))
        .map(|d| d.message)
}

fn assert_trap(result: Result<String, DecisionError>, slot: Slot, what: &str) {
    match result {
        Err(DecisionError::Trap { slot: trapped, trap }) => {
            assert_eq!(trapped, slot);
            assert!(
                trap.contains("unreachable"),
                "{what}: a stubbed WASI call traps: {trap}"
            );
        }
        other => panic!("{what} must trap inside a decision (no WASI is granted), got {other:?}"),
    }
}

#[test]
fn python_clocks_and_os_randomness_trap_and_its_random_module_is_frozen_per_build() {
    if python_probe().is_none() {
        return;
    }
    // The probe answers normally when it reads no clock: the traps below are the clocks'.
    assert_eq!(py("none").unwrap(), "unknown probe none");
    assert_trap(py("time"), Slot::SnapshotBeforeDestroy, "time.time()");
    assert_trap(py("monotonic"), Slot::SnapshotBeforeDestroy, "time.monotonic()");
    assert_trap(py("urandom"), Slot::SnapshotBeforeDestroy, "os.urandom()");
    // `random` was seeded while the component was built (its state is in the memory image), and
    // every decision starts from that image: the same number, decision after decision.
    let first = py("random").unwrap();
    assert!(first.parse::<f64>().is_ok_and(|x| (0.0..1.0).contains(&x)), "{first}");
    for _ in 0..3 {
        assert_eq!(py("random").unwrap(), first, "random.random() is frozen per build");
    }
}

#[test]
fn a_python_policy_that_catches_memory_error_is_reported_out_of_memory() {
    if python_probe().is_none() {
        return;
    }
    assert_eq!(
        py("catch-oom"),
        Err(DecisionError::OutOfMemory {
            slot: Slot::SnapshotBeforeDestroy,
            limit_bytes: MEMORY_BYTES
        }),
        "the guest caught MemoryError and answered; the host still reports the limit"
    );
    // The next decision starts from a fresh instance, untouched by the last one.
    assert_eq!(py("none").unwrap(), "unknown probe none");
}

#[test]
fn javascript_clocks_trap_and_math_random_is_frozen_per_build() {
    if js_probe().is_none() {
        return;
    }
    assert_eq!(js("none").unwrap(), "unknown probe none");
    // QuickJS reads the WASI clock for both: stubbed, it traps.
    assert_trap(js("date"), Slot::CpuClassAdmission, "Date.now()");
    assert_trap(js("performance"), Slot::CpuClassAdmission, "performance.now()");
    // Math.random's state was seeded when the component was built (wizer snapshots it).
    let first = js("random").unwrap();
    assert!(first.parse::<f64>().is_ok_and(|x| (0.0..1.0).contains(&x)), "{first}");
    for _ in 0..3 {
        assert_eq!(js("random").unwrap(), first, "Math.random() is frozen per build");
    }
}

#[test]
fn a_javascript_policy_that_catches_its_out_of_memory_is_reported_out_of_memory() {
    if js_probe().is_none() {
        return;
    }
    assert_eq!(
        js("catch-oom"),
        Err(DecisionError::OutOfMemory {
            slot: Slot::CpuClassAdmission,
            limit_bytes: MEMORY_BYTES
        })
    );
}

// ---- pushed and pulled by digest --------------------------------------------------------

/// The Python and JavaScript examples travel as the Rust policies do: `vk-cocoon policy push`
/// (with the Rust default's case table, vetted before the upload) prints a digest-pinned
/// reference; a node whose policy configuration names those digests pulls both from a real
/// registry (Debian's docker-registry on loopback), runs the tables they carry, serves them —
/// the CPython component is 18 MB, beyond what a pull once read — and decides as the local files
/// do.
#[test]
fn python_and_javascript_policies_are_pushed_and_served_by_digest() {
    use vk_cocoon::policy::config::PolicyConfig;
    use vk_cocoon::policy::reload::PolicyReloader;
    use vk_cocoon::policy::{Policies, PolicyMetrics};

    let Some(dir) = examples_dir() else { return };
    let reg = crate::registry_support::TestRegistry::start();
    let policies_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
    let push = |component: &Path, slot: Slot| {
        let table = policies_dir.join(format!("{slot}/{slot}.cases.yaml"));
        let tagged = format!("oci://{}/policies/{slot}:v1", reg.host());
        let out = Command::new(env!("CARGO_BIN_EXE_vk-cocoon"))
            .args(["policy", "push"])
            .arg(component)
            .arg(&tagged)
            .arg("--cases")
            .arg(&table)
            .output()
            .expect("run vk-cocoon");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{slot}: {stdout}{stderr}");
        let pinned = stdout.trim().to_string();
        assert!(
            pinned.starts_with(&format!("oci://{}/policies/{slot}@sha256:", reg.host())),
            "{pinned}"
        );
        pinned
    };
    let python = dir.join("snapshot-before-destroy-py.wasm");
    let javascript = dir.join("cpu-class-admission-js.wasm");
    let python_ref = push(&python, Slot::SnapshotBeforeDestroy);
    let javascript_ref = push(&javascript, Slot::CpuClassAdmission);

    // The daemon's loading of a policy configuration (what `vk-cocoon run` does at start).
    let node = tempfile::tempdir().unwrap();
    let config_path = node.path().join("policies.yaml");
    std::fs::write(
        &config_path,
        format!(
            "slots:\n  snapshot-before-destroy: {{source: '{python_ref}'}}\n  cpu-class-admission: {{source: '{javascript_ref}'}}\nartifact-dir: {}\ncache-dir: null\n",
            node.path().join("artifacts").display()
        ),
    )
    .unwrap();
    let path = config_path.display().to_string();
    let config = PolicyConfig::from_env(|k| (k == "VK_POLICY_CONFIG").then(|| path.clone())).unwrap();
    let policies =
        std::sync::Arc::new(Policies::with_defaults(engine().clone(), None, PolicyMetrics::unregistered()).unwrap());
    PolicyReloader::from_config(policies.clone(), &config)
        .load_all()
        .expect("both artifacts pull and pass the tables they carry");
    for (slot, reference, file) in [
        (Slot::SnapshotBeforeDestroy, &python_ref, &python),
        (Slot::CpuClassAdmission, &javascript_ref, &javascript),
    ] {
        let active = policies.active(slot);
        assert_eq!(&active.source, reference, "{slot} is served from the registry");
        assert_eq!(
            active.digest,
            vk_cocoon::registry::manifest::sha256_digest(&std::fs::read(file).unwrap()),
            "{slot}: the bytes served are the example's"
        );
    }

    // They decide, and as the local files do: a main agent's VM is snapshotted before its
    // destroy; a pod pinned to another CPU class is refused, permanently, with its Event.
    let snapshot_input: DecisionInput = serde_yaml_ng::from_str(
        "pod: {metadata: {namespace: ns, name: demo-0, ownerReferences: [{apiVersion: cocoonset.cocoonstack.io/v1, kind: CocoonSet, name: demo, uid: cs-1, controller: true}], annotations: {vm.cocoonstack.io/name: vk-ns-demo-0-505043, cocoonset.cocoonstack.io/managed: 'true', cocoonset.cocoonstack.io/image: 'agent-base:v3', cocoonset.cocoonstack.io/snapshot-policy: main-only}}}\nhost: {pusher-configured: true, vm-running: true}",
    )
    .unwrap();
    let facts = facts_for::<SnapshotBeforeDestroy>(&snapshot_input).unwrap();
    let served = serde_json::to_value(policies.decide::<SnapshotBeforeDestroy>(&facts)).unwrap();
    let local = load::<SnapshotBeforeDestroy>(python.clone())
        .decide(engine(), &facts)
        .unwrap();
    assert_eq!(served, serde_json::to_value(&local).unwrap());
    assert_eq!(served["reason"], "snapshot", "{served}");
    assert_eq!(
        served["outcome"]["Snapshot"]["repository"], "vk-ns-demo-0-505043",
        "{served}"
    );

    let admission_input: DecisionInput = serde_yaml_ng::from_str(
        "pod: {metadata: {namespace: ns, name: agent-0, annotations: {vm.cocoonstack.io/name: vm1}}, spec: {nodeSelector: {cocoonstack.io/snapshot-cpu-class: genoa}}, status: {phase: Running}}\nhost: {context: Create, node-name: node-a, node-class: skylake}",
    )
    .unwrap();
    let facts = facts_for::<CpuClassAdmission>(&admission_input).unwrap();
    let served = serde_json::to_value(policies.decide::<CpuClassAdmission>(&facts)).unwrap();
    let local = load::<CpuClassAdmission>(javascript.clone())
        .decide(engine(), &facts)
        .unwrap();
    assert_eq!(served, serde_json::to_value(&local).unwrap());
    assert_eq!(served["reason"], "class-mismatch", "{served}");
    assert_eq!(
        served["verdict"]["Reject"]["event"], "SnapshotCpuClassMismatch",
        "{served}"
    );
}

/// A component beyond what a node pulls is refused by `policy push`, before anything is
/// uploaded, with the limit in the message (not later, by every node's pull).
#[test]
fn push_refuses_a_component_beyond_what_a_node_pulls() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("huge.wasm");
    let limit = vk_cocoon::policy::distribution::MAX_LAYER_BYTES;
    std::fs::write(&big, vec![0u8; limit as usize + 1]).unwrap();
    // Nothing listens on port 9 of loopback: the refusal must come before any registry call.
    let out = Command::new(env!("CARGO_BIN_EXE_vk-cocoon"))
        .args(["policy", "push"])
        .arg(&big)
        .arg("oci://127.0.0.1:9/policies/huge:v1")
        .args(["--slot", "bring-up"])
        .output()
        .expect("run vk-cocoon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("is {} bytes", limit + 1)) && stderr.contains("at most 67108864 bytes (64 MiB)"),
        "{stderr}"
    );
}
