//! The daemon compiles components in a child process (`vk-cocoon policy compile-worker`): its
//! artifact is the one the daemon loads and caches, a component it refuses fails the load with
//! the compiler's own reason, a crashed, overdue or oversized compile fails the load without a
//! retry in the daemon, and a worker that cannot start costs only an in-process compile.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use vk_cocoon::policy::compile_worker::CompileLimits;
use vk_cocoon::policy::contract::cpu_class_admission::Verdict;
use vk_cocoon::policy::slots::CpuClassAdmission;
use vk_cocoon::policy::{CompileCache, LoadError, LoadedPolicy, Origin, PolicyEngine, PolicySlot, SandboxLimits};

fn limits() -> SandboxLimits {
    SandboxLimits::default()
}

/// An engine that compiles in workers started from `exe`, within the default limits.
fn worker_engine(exe: PathBuf) -> PolicyEngine {
    PolicyEngine::new(limits())
        .unwrap()
        .compile_in_worker(exe, CompileLimits::default())
}

fn daemon_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vk-cocoon"))
}

/// A component header followed by bytes that are not a component body: it passes the loader's
/// header check, so only the compiler can refuse it.
fn uncompilable() -> Vec<u8> {
    let mut bytes = b"\0asm\x0d\x00\x01\x00".to_vec();
    bytes.extend_from_slice(&[0xff; 64]);
    bytes
}

/// Writes an executable shell script and waits until it can be run: a test thread elsewhere
/// that forks while the file is still open for writing makes `exec` fail with ETXTBSY until that
/// child has exec'd in turn.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    fs::write(&path, format!("#!/bin/sh\n[ \"$1\" = --probe ] && exit 0\n{body}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    loop {
        match Command::new(&path).arg("--probe").status() {
            Ok(status) => {
                assert!(status.success(), "probing {}: {status}", path.display());
                return path;
            }
            Err(error) if error.raw_os_error() == Some(libc::ETXTBSY) => std::thread::yield_now(),
            Err(error) => panic!("running {}: {error}", path.display()),
        }
    }
}

fn load(
    engine: &PolicyEngine,
    cache: Option<&CompileCache>,
    bytes: &[u8],
) -> Result<LoadedPolicy<CpuClassAdmission>, LoadError> {
    LoadedPolicy::load(engine, cache, Origin::File("policy.wasm".into()), bytes)
}

fn corrupt_detail(result: Result<LoadedPolicy<CpuClassAdmission>, LoadError>) -> String {
    match result {
        Err(LoadError::Corrupt { detail, .. }) => detail,
        Err(other) => panic!("expected the compiler's refusal, got {other}"),
        Ok(_) => panic!("the component loaded"),
    }
}

#[test]
fn the_worker_compiles_the_artifact_the_daemon_loads_and_caches() {
    let dir = tempfile::tempdir().unwrap();
    // The daemon's binary behind a wrapper that keeps a copy of what the worker wrote.
    let copy = dir.path().join("artifact");
    let wrapper = script(
        dir.path(),
        "worker",
        &format!(
            "\"{}\" \"$@\" > \"{}\"; status=$?; cat \"{}\"; exit $status",
            daemon_binary().display(),
            copy.display(),
            copy.display()
        ),
    );
    let engine = worker_engine(wrapper);
    let cache = CompileCache::new(dir.path().join("cache"));
    let policy = load(&engine, Some(&cache), CpuClassAdmission::default_component()).expect("loads");

    let artifact = fs::read(&copy).expect("the worker ran");
    assert!(!artifact.is_empty());
    let cached: Vec<Vec<u8>> = fs::read_dir(cache.dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .map(|p| fs::read(p).unwrap())
        .collect();
    assert_eq!(cached, vec![artifact], "the cache keeps the worker's artifact");

    // And it decides: the built-in admission policy rejects a pod classified for another
    // snapshot CPU class.
    let input = serde_yaml_ng::from_str(
        "pod: {metadata: {namespace: ns, name: p}, spec: {nodeSelector: {cocoonstack.io/snapshot-cpu-class: a}}}\nhost: {node-class: b}",
    )
    .unwrap();
    let facts = vk_cocoon::policy::input::facts_for::<CpuClassAdmission>(&input).unwrap();
    let decision = policy.decide(&engine, &facts).expect("decides");
    assert!(matches!(decision.verdict, Verdict::Reject(_)), "{decision:?}");
}

#[test]
fn a_component_the_compiler_refuses_fails_with_the_compilers_own_reason() {
    let in_process = corrupt_detail(load(&PolicyEngine::new(limits()).unwrap(), None, &uncompilable()));
    let engine = worker_engine(daemon_binary());
    let in_worker = corrupt_detail(load(&engine, None, &uncompilable()));
    assert_eq!(in_worker, in_process);
}

#[test]
fn a_crashed_compile_fails_the_load_without_compiling_in_the_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let crasher = script(dir.path(), "worker", "cat > /dev/null; kill -SEGV $$");
    let engine = worker_engine(crasher);
    let detail = corrupt_detail(load(&engine, None, CpuClassAdmission::default_component()));
    assert!(detail.contains("killed by signal 11"), "{detail}");
}

#[test]
fn a_worker_that_cannot_start_costs_an_in_process_compile() {
    let dir = tempfile::tempdir().unwrap();
    let engine = worker_engine(dir.path().join("missing"));
    load(&engine, None, CpuClassAdmission::default_component()).expect("compiled in process");
    // A binary that does not speak the protocol (clap's usage error) is treated the same way.
    let other = script(
        dir.path(),
        "other",
        "echo \"error: unrecognized subcommand\" >&2; exit 2",
    );
    let engine = worker_engine(other);
    load(&engine, None, CpuClassAdmission::default_component()).expect("compiled in process");
}

/// Runs `vk-cocoon policy compile-worker` on the built-in admission component.
fn worker_with(deadline_ms: &str, address_space_mib: &str) -> std::process::Output {
    let mut worker = Command::new(daemon_binary())
        .args(["policy", "compile-worker", "--deadline-ms", deadline_ms])
        .args(["--address-space-mib", address_space_mib])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The worker may be gone before all of it is written.
    let _ = worker
        .stdin
        .take()
        .unwrap()
        .write_all(CpuClassAdmission::default_component());
    worker.wait_with_output().unwrap()
}

#[test]
fn a_compile_past_its_deadline_is_stopped_with_a_message() {
    let out = worker_with("1", "4096");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "{stderr}");
    assert!(stderr.contains("took longer than 1ms"), "{stderr}");
    assert!(out.stdout.is_empty(), "no partial artifact");
}

#[test]
fn the_engine_runs_its_worker_within_the_configured_limits() {
    // VK_POLICY_COMPILE_DEADLINE_S and the file's `compile:` reach the worker through the engine.
    let overdue = CompileLimits {
        deadline: std::time::Duration::from_millis(1),
        ..CompileLimits::default()
    };
    let engine = PolicyEngine::new(limits())
        .unwrap()
        .compile_in_worker(daemon_binary(), overdue);
    let detail = corrupt_detail(load(&engine, None, CpuClassAdmission::default_component()));
    assert!(detail.contains("took longer than 1ms"), "{detail}");
}

#[test]
fn a_worker_past_its_address_space_limit_aborts_instead_of_growing() {
    use std::os::unix::process::ExitStatusExt;
    // Under what the worker already maps: its first allocation after the limit fails. Which
    // one comes first depends on scheduling: a heap allocation ("memory allocation of N bytes
    // failed"), or a compiler thread's signal stack ("Cannot allocate memory"), seen once on a
    // loaded machine. Either way the worker aborts.
    let out = worker_with("300000", "16");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{:?}: {stderr}", out.status);
    assert!(
        stderr.contains("memory allocation of") || stderr.contains("Cannot allocate memory"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "no artifact");
    // The default limit leaves the built-in policies ample room.
    let out = worker_with("300000", "4096");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!out.stdout.is_empty());
}
