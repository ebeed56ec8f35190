//! The `vk-cocoon` binary's command line: the policy authors' tools, and `run`'s settings
//! (`run_settings`).

use crate::registry_support;
mod run_settings;

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use policy_artifacts::hostile;

fn vk_cocoon(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vk-cocoon"))
        .args(args)
        .output()
        .expect("run vk-cocoon")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn policies_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("policies")
        .display()
        .to_string()
}

#[test]
fn an_invalid_log_level_or_format_is_an_error_naming_the_variable() {
    for (var, value) in [("VK_LOG_LEVEL", "info,vk_cocoon=loud"), ("VK_LOG_FORMAT", "xml")] {
        let out = Command::new(env!("CARGO_BIN_EXE_vk-cocoon"))
            .args(["policy", "test", &policies_dir()])
            .env(var, value)
            .output()
            .expect("run vk-cocoon");
        assert_eq!(out.status.code(), Some(2), "{var}={value}: {}", stderr(&out));
        assert!(stderr(&out).contains(var), "{}", stderr(&out));
        assert!(stdout(&out).is_empty(), "nothing ran: {}", stdout(&out));
    }
    // Valid values run the command (the tables) as usual.
    let out = Command::new(env!("CARGO_BIN_EXE_vk-cocoon"))
        .args(["policy", "test", &policies_dir()])
        .env("VK_LOG_FORMAT", "json")
        .env("VK_LOG_LEVEL", "info,vk_cocoon::policy=debug")
        .output()
        .expect("run vk-cocoon");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).ends_with("0 failed\n"), "{}", stdout(&out));
}

#[test]
fn the_default_tables_pass_and_the_report_ends_with_the_counts() {
    let out = vk_cocoon(&["policy", "test", &policies_dir()]);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}{}", stderr(&out));
    let last = text.lines().last().unwrap();
    let (passed, rest) = last.split_once(" passed, ").expect("N passed, N failed");
    assert_eq!(rest, "0 failed");
    assert!(passed.parse::<u32>().unwrap() >= 110, "{last}");
    for slot in vk_cocoon::policy::Slot::ALL {
        assert!(
            text.contains(&format!("slot {slot} on the built-in {slot} policy")),
            "{slot} table ran:\n{text}"
        );
    }
}

#[test]
fn a_failing_case_fails_the_run_and_shows_the_decision() {
    let dir = tempfile::tempdir().unwrap();
    let table = dir.path().join("wrong.cases.yaml");
    fs::write(
        &table,
        "slot: cpu-class-admission\ncases:\n  - name: expects the impossible\n    expect: {verdict: {Reject: {kind: Permanent}}}\n",
    )
    .unwrap();
    let out = vk_cocoon(&["policy", "test", table.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(!out.status.success());
    assert!(
        text.contains(
            "FAIL expects the impossible: verdict: expected {\"Reject\":{\"kind\":\"Permanent\"}}, got \"Admit\""
        ),
        "{text}"
    );
    assert!(text.contains("decision: {"), "{text}");
    assert_eq!(text.lines().last(), Some("0 passed, 1 failed"));
}

#[test]
fn no_cases_is_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let out = vk_cocoon(&["policy", "test", dir.path().to_str().unwrap()]);
    assert!(!out.status.success());
    assert_eq!(stdout(&out).lines().last(), Some("0 passed, 0 failed"));
    assert!(stderr(&out).contains("no case ran"), "{}", stderr(&out));
}

#[test]
fn a_table_tests_the_component_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("mine.wasm"), hostile::TRAPPER).unwrap();
    fs::write(
        dir.path().join("mine.cases.yaml"),
        "slot: bring-up\ncases:\n  - name: a panicking policy fails safe\n    expect: {outcome: {Refuse: {kind: RetryLater, event: BringUpPolicyFailed}}, reason: policy-failed}\n    message-contains: [unreachable]\n",
    )
    .unwrap();
    let out = vk_cocoon(&["policy", "test", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(stdout(&out).contains("mine.wasm"), "{}", stdout(&out));
}

#[test]
fn eval_prints_one_decision_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("pod.yaml");
    fs::write(
        &input,
        r#"
pod:
  apiVersion: v1
  kind: Pod
  metadata: {namespace: ns, name: p}
  spec:
    containers: [{name: agent, resources: {requests: {cpu: 500m}, limits: {cpu: "2"}}}]
host: {path: Clone}
"#,
    )
    .unwrap();
    let out = vk_cocoon(&[
        "policy",
        "eval",
        "--slot",
        "resource-translation",
        "--input",
        input.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("stdout is one JSON document");
    let cpu = &json["outcome"]["Translated"]["cpu"];
    assert_eq!(cpu["cpu-weight"], 20);
    assert_eq!(cpu["cpu-quota-us"], 200000);
    assert_eq!(json["reason"], "translated");
}

#[test]
fn eval_of_a_guest_fixup_prints_the_argv_to_exec() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("clone.yaml");
    fs::write(
        &input,
        r#"
pod:
  metadata: {namespace: ns, name: p, annotations: {vm.cocoonstack.io/name: vm1, cocoonset.cocoonstack.io/managed: "true", cocoonset.cocoonstack.io/os: windows}}
host: {vm-id: id-1, nics: [{mac: "52:54:00:00:00:01", ip: 10.0.0.2, gateway: 10.0.0.1, prefix: 24}]}
"#,
    )
    .unwrap();
    let out = vk_cocoon(&[
        "policy",
        "eval",
        "--slot",
        "guest-fixup",
        "--input",
        input.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("stdout is one JSON document");
    let fixup = &json["outcome"]["Run"];
    assert_eq!(json["reason"], "windows");
    assert_eq!(fixup["kind"], "Windows");
    assert_eq!(fixup["argv"][0], "powershell");
    assert_eq!(fixup["argv"].as_array().map(Vec::len), Some(4));
}

#[test]
fn every_default_component_checks_as_exactly_its_own_slot() {
    let dir = tempfile::tempdir().unwrap();
    for slot in vk_cocoon::policy::Slot::ALL {
        let path = dir.path().join(format!("{slot}.wasm"));
        fs::write(&path, slot.default_component()).unwrap();
        let out = vk_cocoon(&["policy", "check", path.to_str().unwrap()]);
        let text = stdout(&out);
        assert!(out.status.success(), "{slot}: {}", stderr(&out));
        assert!(
            text.contains(&format!(
                "implements slot {slot} (world {slot}-policy) of contract cocoonstack:vk-policy@0.3.0"
            )),
            "{text}"
        );
        assert_eq!(
            text.matches("implements slot").count(),
            1,
            "one slot per default: {text}"
        );
    }
}

#[test]
fn check_accepts_a_policy_and_refuses_hostile_components_with_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.path().join(name);
        fs::write(&path, bytes).unwrap();
        path.display().to_string()
    };
    let good = write(
        "admission.wasm",
        vk_cocoon::policy::Slot::CpuClassAdmission.default_component(),
    );
    let out = vk_cocoon(&["policy", "check", &good]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("implements slot cpu-class-admission"),
        "{}",
        stdout(&out)
    );

    let wasi = write("wasi.wasm", hostile::WASI_IMPORTER);
    let out = vk_cocoon(&["policy", "check", &wasi]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("wasi:"), "{}", stderr(&out));

    let corrupt = write("corrupt.wasm", b"\0asm garbage");
    let out = vk_cocoon(&["policy", "check", &corrupt]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("not a valid WebAssembly component"),
        "{}",
        stderr(&out)
    );

    let out = vk_cocoon(&["policy", "check", &good, "--slot", "bring-up"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("must export cocoonstack:vk-policy/bring-up@0.3.0"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn check_names_the_contract_version_it_found_and_refuses_one_it_does_not_speak() {
    let dir = tempfile::tempdir().unwrap();
    let old = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/v0.1.0/bring-up.wasm");
    let out = vk_cocoon(&["policy", "check", old.to_str().unwrap()]);
    let text = stdout(&out);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        text.contains("exports bring-up of contract cocoonstack:vk-policy@0.1.0"),
        "{text}"
    );
    assert!(
        text.contains("implements slot bring-up (world bring-up-policy) of contract cocoonstack:vk-policy@0.1.0")
            && text.contains("the host adapts it to cocoonstack:vk-policy@0.3.0"),
        "{text}"
    );

    let future = dir.path().join("future.wasm");
    fs::write(&future, hostile::FUTURE_CONTRACT).unwrap();
    let out = vk_cocoon(&["policy", "check", future.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        stdout(&out).contains(
            "cpu-class-admission of contract cocoonstack:vk-policy@0.9.0 (a version this daemon does not speak)"
        ),
        "{}",
        stdout(&out)
    );
    let err = stderr(&out);
    assert!(err.contains("speaks versions 0.1.0, 0.2.0, 0.3.0"), "{err}");
    assert_eq!(err.lines().count(), 1, "said once, not per slot: {err}");
}

#[test]
fn a_scaffolded_policy_of_every_slot_builds_and_passes_its_own_table() {
    // One target directory for every scaffold, kept between runs (wit-bindgen builds once).
    let target = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("policy-new");
    let lock = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.lock");
    let root = tempfile::tempdir().unwrap();
    for slot in vk_cocoon::policy::Slot::ALL {
        let dir = root.path().join(format!("my-{slot}"));
        let out = vk_cocoon(&["policy", "new", slot.name(), dir.to_str().unwrap()]);
        assert!(out.status.success(), "{slot}: {}", stderr(&out));
        assert!(
            stdout(&out).contains("cargo build --release --target wasm32-wasip2"),
            "{}",
            stdout(&out)
        );
        // The workspace's lock pins wit-bindgen to the version already fetched (hermetic test).
        fs::copy(&lock, dir.join("Cargo.lock")).unwrap();
        let build = std::process::Command::new(env!("CARGO"))
            .current_dir(&dir)
            .args(["build", "--release", "--offline", "--target", "wasm32-wasip2"])
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .output()
            .unwrap();
        assert!(
            build.status.success(),
            "{slot}: {}",
            String::from_utf8_lossy(&build.stderr)
        );
        // Where a plain `cargo build` in the crate would have put it (the table points there).
        let crate_name = format!("my_{}", slot.name().replace('-', "_"));
        let built = target.join(format!("wasm32-wasip2/release/{crate_name}.wasm"));
        let release = dir.join("target/wasm32-wasip2/release");
        fs::create_dir_all(&release).unwrap();
        fs::copy(&built, release.join(format!("{crate_name}.wasm"))).unwrap();

        let out = vk_cocoon(&["policy", "test", dir.to_str().unwrap()]);
        let text = stdout(&out);
        assert!(out.status.success(), "{slot}: {text}{}", stderr(&out));
        assert!(
            text.contains(&format!("{crate_name}.wasm")),
            "the table's own component ran: {text}"
        );
        assert!(text.contains("contract cocoonstack:vk-policy@0.3.0"), "{text}");
        assert!(text.trim_end().ends_with("passed, 0 failed"), "{text}");
    }
    let again = vk_cocoon(&[
        "policy",
        "new",
        "bring-up",
        root.path().join("my-bring-up").to_str().unwrap(),
    ]);
    assert!(!again.status.success(), "a non-empty directory is never overwritten");
}

/// `policy push` validates and tests before it uploads and prints the digest-pinned reference;
/// `policy pull` of that reference writes back the same component and table (a real registry).
#[test]
fn push_prints_the_pinned_reference_and_pull_writes_back_the_same_component_and_table() {
    let reg = registry_support::TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let component = dir.path().join("bring-up.wasm");
    fs::write(&component, vk_cocoon::policy::Slot::BringUp.default_component()).unwrap();
    let table_text = fs::read_to_string(Path::new(&policies_dir()).join("bring-up/bring-up.cases.yaml")).unwrap();
    fs::write(dir.path().join("bring-up.cases.yaml"), &table_text).unwrap();
    let tagged = format!("oci://{}/policies/bring-up:v1", reg.host());

    let out = vk_cocoon(&["policy", "push", component.to_str().unwrap(), &tagged]);
    assert!(out.status.success(), "{}", stderr(&out));
    let pinned = stdout(&out).trim().to_string();
    let prefix = format!("oci://{}/policies/bring-up@sha256:", reg.host());
    assert!(
        pinned.starts_with(&prefix) && pinned.len() == prefix.len() + 64,
        "{pinned}"
    );
    assert!(
        stderr(&out).contains("cases of") && stderr(&out).contains("pass"),
        "{}",
        stderr(&out)
    );

    let pulled = dir.path().join("pulled");
    let out = vk_cocoon(&["policy", "pull", &pinned, "-o", pulled.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), pinned);
    assert_eq!(
        fs::read(pulled.join("bring-up.wasm")).unwrap(),
        vk_cocoon::policy::Slot::BringUp.default_component()
    );
    assert_eq!(
        fs::read_to_string(pulled.join("bring-up.cases.yaml")).unwrap(),
        table_text
    );

    // Pulling the tag resolves it to the same digest.
    let out = vk_cocoon(&["policy", "pull", &tagged, "-o", pulled.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), pinned);
}

#[test]
fn push_refuses_a_component_that_fails_its_table_and_a_reference_without_a_tag() {
    let reg = registry_support::TestRegistry::start();
    let dir = tempfile::tempdir().unwrap();
    let component = dir.path().join("bring-up.wasm");
    fs::write(&component, hostile::TRAPPER).unwrap();
    let table = Path::new(&policies_dir()).join("bring-up/bring-up.cases.yaml");
    let tagged = format!("oci://{}/policies/trapper:v1", reg.host());
    let out = vk_cocoon(&[
        "policy",
        "push",
        component.to_str().unwrap(),
        &tagged,
        "--slot",
        "bring-up",
        "--cases",
        table.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("fails its case table"), "{}", stderr(&out));
    // Nothing reached the registry.
    assert_eq!(reg.http_status("GET", "/v2/policies/trapper/manifests/v1"), Some(404));

    let digest = format!("oci://{}/policies/trapper@sha256:{}", reg.host(), "0".repeat(64));
    let out = vk_cocoon(&[
        "policy",
        "push",
        component.to_str().unwrap(),
        &digest,
        "--slot",
        "bring-up",
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("push to a tag"), "{}", stderr(&out));
}

/// The decision log's lines (what `Policies::decide` writes for the daemon) parse, and
/// `policy eval --from-log` replays one: the same component decides the same, a candidate that
/// decides otherwise exits 1 naming the difference; a logged fail-safe says so.
#[test]
fn logged_decisions_parse_and_replay_against_a_candidate() {
    use vk_cocoon::policy::decision_log::{DecisionLog, DecisionRecord, LogTarget};
    use vk_cocoon::policy::input::{DecisionInput, facts_for};
    use vk_cocoon::policy::slots::BringUp;
    use vk_cocoon::policy::{LoadedPolicy, Origin, Policies, PolicyEngine, PolicyMetrics, SandboxLimits, Slot};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("decisions.jsonl");
    let log = DecisionLog::open(LogTarget::File {
        path: path.clone(),
        max_bytes: 1 << 20,
    })
    .unwrap();
    let engine = PolicyEngine::new(SandboxLimits::default()).unwrap();
    let policies = Policies::with_defaults(engine.clone(), None, PolicyMetrics::unregistered())
        .unwrap()
        .with_decision_log(Some(log));
    let long = "x".repeat(5000);
    let input: DecisionInput = serde_yaml_ng::from_str(&format!(
        "pod: {{metadata: {{namespace: ns, name: p, annotations: {{vm.cocoonstack.io/name: vm1, cocoonset.cocoonstack.io/managed: 'true', cocoonset.cocoonstack.io/image: 'snap:v1', note: '{long}'}}}}}}"
    ))
    .unwrap();
    let facts = facts_for::<BringUp>(&input).unwrap();
    assert_eq!(policies.decide::<BringUp>(&facts).reason, "clone");
    let trapper =
        LoadedPolicy::<BringUp>::load(&engine, None, Origin::File("trapper.wasm".into()), hostile::TRAPPER).unwrap();
    policies.install(trapper);
    assert_eq!(policies.decide::<BringUp>(&facts).reason, "policy-failed");
    // The log is written by its own thread: wait for both lines.
    policies.flush_decision_log();

    let text = fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "one line per decision");
    let first: DecisionRecord = serde_json::from_str(lines[0]).unwrap();
    let second: DecisionRecord = serde_json::from_str(lines[1]).unwrap();
    assert_eq!((first.slot, first.source.as_str()), (Slot::BringUp, "builtin"));
    assert_eq!(
        first.component,
        vk_cocoon::registry::manifest::sha256_digest(Slot::BringUp.default_component())
    );
    assert_eq!(first.contract, vk_cocoon::policy::ContractVersion::CURRENT.to_string());
    assert_eq!(first.decision["reason"], "clone");
    assert!(first.fail_safe.is_none() && first.latency_us > 0);
    assert!(first.facts_truncated, "the 5000-byte annotation value is cut");
    assert!(lines[0].len() < 4000, "{} bytes", lines[0].len());
    assert_ne!(first.id, second.id);
    assert_eq!(second.fail_safe.as_ref().map(|f| f.error.as_str()), Some("trap"));
    assert_eq!(second.source, "file:trapper.wasm");

    // The same (built-in) component decides the same.
    let out = vk_cocoon(&["policy", "eval", "--from-log", lines[0]]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("same decision as logged"), "{}", stderr(&out));
    let replayed: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(replayed, first.decision);

    // A candidate that decides otherwise is a regression: exit 1 and the first difference.
    let candidate = dir.path().join("trapper.wasm");
    fs::write(&candidate, hostile::TRAPPER).unwrap();
    let out = vk_cocoon(&[
        "policy",
        "eval",
        "--from-log",
        lines[0],
        "--component",
        candidate.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("differs from the logged decision"),
        "{}",
        stderr(&out)
    );

    // The logged fail-safe replayed against the built-in: it was the fail-safe, this is not.
    let out = vk_cocoon(&["policy", "eval", "--from-log", lines[1]]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("was the fail-safe, this one is not"),
        "{}",
        stderr(&out)
    );

    let out = vk_cocoon(&["policy", "eval", "--from-log", "{not json"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not a decision log line"), "{}", stderr(&out));
}

#[test]
fn bench_prints_p50_and_p99_for_every_case_of_a_table() {
    let table = Path::new(&policies_dir()).join("cpu-class-admission/cpu-class-admission.cases.yaml");
    let out = vk_cocoon(&["policy", "bench", table.to_str().unwrap(), "--iterations", "20"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let cases = vk_cocoon::policy::cases::CaseTable::load(&table).unwrap().cases;
    for case in &cases {
        let row = text
            .lines()
            .find(|l| l.starts_with(&case.name))
            .unwrap_or_else(|| panic!("no row for {}: {text}", case.name));
        let numbers: Vec<f64> = row[case.name.len()..]
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert!(
            numbers.len() == 3 && numbers[0] > 0.0 && numbers[1] >= numbers[0] && numbers[2] == 0.0,
            "{row}"
        );
    }
    assert!(text.contains("median of the per-case p50s"), "{text}");
}
