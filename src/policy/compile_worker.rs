//! Compiling policy components in a child process.
//!
//! The daemon turns each component into native code once (the compile cache serves every later
//! start). Compiling inside the daemon leaves cranelift's code pages and the heap it freed in the
//! daemon's resident set for the rest of its life: about 10 MiB of a node daemon that tracks
//! 1,000 pods in under 64 MiB (the `daemon_memory` bench). And a component crafted to crash the
//! compiler, or to keep it busy forever, would take the node daemon with it.
//!
//! So the daemon runs its own binary (`/proc/self/exe`: the running build, even after an
//! upgrade replaced the file) as a worker, `vk-cocoon policy compile-worker`: the
//! component on stdin, the compiled artifact on stdout, and on failure one message on stderr and
//! an exit code saying which failure it was. The worker compiles with the daemon's code
//! settings but without its instance pool, so it can run under an address-space limit; wasmtime
//! checks that the artifact fits the daemon's engine when it deserializes it.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use super::engine::compiling_engine;

/// How long one compile may take before the worker gives up on it. Far above any real policy:
/// the built-in components compile in well under a second.
pub const COMPILE_DEADLINE: Duration = Duration::from_secs(300);

/// The worker's address space, in MiB (`RLIMIT_AS`): the binary, the compiler's heap and its
/// threads' stacks. The built-in components need a small fraction of it; a component that
/// drives the compiler past it fails instead of taking the node's memory.
pub const COMPILE_ADDRESS_SPACE_MIB: u64 = 4096;

/// The deadlines an operator may set, in seconds (`VK_POLICY_COMPILE_DEADLINE_S`).
pub const DEADLINE_RANGE_S: std::ops::RangeInclusive<u64> = 1..=3600;
/// The address spaces an operator may set, in MiB: below 256 the worker cannot even start its
/// engine.
pub const ADDRESS_SPACE_RANGE_MIB: std::ops::RangeInclusive<u64> = 256..=(1 << 20);

/// How long and how big one compile may get (`compile:` in the policy configuration file,
/// `VK_POLICY_COMPILE_DEADLINE_S` and `VK_POLICY_COMPILE_ADDRESS_SPACE_MIB`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct CompileLimits {
    #[serde(rename = "deadline-seconds", default = "default_deadline", with = "seconds")]
    pub deadline: Duration,
    #[serde(default = "default_address_space_mib")]
    pub address_space_mib: u64,
}

fn default_deadline() -> Duration {
    COMPILE_DEADLINE
}

fn default_address_space_mib() -> u64 {
    COMPILE_ADDRESS_SPACE_MIB
}

mod seconds {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

impl CompileLimits {
    /// What is wrong with limits read from a file, if anything (the variables are checked when
    /// parsed).
    pub fn problem(&self) -> Option<String> {
        let seconds = self.deadline.as_secs();
        if !DEADLINE_RANGE_S.contains(&seconds) {
            return Some(format!(
                "compile.deadline-seconds is {seconds}; accepted: a whole number between {} and {}",
                DEADLINE_RANGE_S.start(),
                DEADLINE_RANGE_S.end()
            ));
        }
        if !ADDRESS_SPACE_RANGE_MIB.contains(&self.address_space_mib) {
            return Some(format!(
                "compile.address-space-mib is {}; accepted: a whole number between {} and {}",
                self.address_space_mib,
                ADDRESS_SPACE_RANGE_MIB.start(),
                ADDRESS_SPACE_RANGE_MIB.end()
            ));
        }
        None
    }
}

impl Default for CompileLimits {
    fn default() -> Self {
        CompileLimits {
            deadline: default_deadline(),
            address_space_mib: default_address_space_mib(),
        }
    }
}

/// The worker refused the component; stderr says why.
const EXIT_REFUSED: u8 = 10;
/// The compile ran past its deadline.
const EXIT_DEADLINE: u8 = 11;
/// Rust's exit code for a panic.
const EXIT_PANIC: i32 = 101;

/// The most of the worker's stderr kept in an error message.
const MAX_MESSAGE: usize = 4096;

/// Why a compile in the worker did not produce an artifact.
#[derive(Debug)]
pub(crate) enum WorkerError {
    /// The worker could not run (no `/proc`, an exec refused), or the binary at that path does
    /// not speak this protocol: the caller compiles in its own process instead.
    Unavailable(String),
    /// The component failed to compile: refused, past the deadline, or it crashed the
    /// compiler. Compiling it again in the daemon would risk the daemon.
    Failed(String),
}

/// The worker side: reads a component from stdin, compiles it, and writes the artifact to
/// stdout, within `limits`.
pub fn serve(limits: CompileLimits) -> ExitCode {
    let refuse = |message: String| {
        eprintln!("{message}");
        ExitCode::from(EXIT_REFUSED)
    };
    // A thread that ends the process at the deadline: the compiler cannot be interrupted from
    // within, but the whole process can. Started before the address-space limit, which then
    // bounds only the compile.
    let deadline = limits.deadline;
    let watchdog = std::thread::Builder::new().spawn(move || {
        std::thread::sleep(deadline);
        eprintln!("compiling the component took longer than {deadline:?}; the compile was stopped");
        std::process::exit(i32::from(EXIT_DEADLINE));
    });
    if let Err(error) = watchdog {
        return refuse(format!("cannot start the compile worker's deadline: {error}"));
    }
    if let Err(error) = crate::host::process::limit_address_space(limits.address_space_mib << 20) {
        return refuse(format!("cannot limit the compile worker's address space: {error}"));
    }
    let mut component = Vec::new();
    if let Err(error) = std::io::stdin().read_to_end(&mut component) {
        return refuse(format!("reading the component from stdin: {error}"));
    }
    let engine = match compiling_engine() {
        Ok(engine) => engine,
        Err(error) => return refuse(format!("cannot start the wasm engine: {error:#}")),
    };
    let artifact = match engine.precompile_component(&component) {
        Ok(artifact) => artifact,
        Err(error) => return refuse(format!("{error:#}")),
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(&artifact).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => refuse(format!("writing the compiled component to stdout: {error}")),
    }
}

/// How long past its deadline the daemon waits for the worker before killing it: the worker's
/// own watchdog ends it at the deadline; the grace covers its start and the write of its
/// artifact. A worker that outlives both (a watchdog that never ran, a process stopped by a
/// signal) is killed, so a compile never holds the daemon's load forever.
pub const KILL_GRACE: Duration = Duration::from_secs(5);

/// The daemon side: compiles `component` in a worker started from `exe`.
pub(crate) fn compile(exe: &Path, limits: CompileLimits, component: &[u8]) -> Result<Vec<u8>, WorkerError> {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(exe)
        .args(["policy", "compile-worker"])
        .args(["--deadline-ms", &limits.deadline.as_millis().to_string()])
        .args(["--address-space-mib", &limits.address_space_mib.to_string()])
        // Its stderr carries only its one message, never the daemon's log level's output.
        .env("VK_LOG_LEVEL", "off")
        // Its own process group: a kill past the deadline takes whatever it started too, so
        // nothing keeps the pipes open.
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| WorkerError::Unavailable(format!("cannot start {}: {e}", exe.display())))?;
    let pid = child.id() as libc::pid_t;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let mut stderr = child.stderr.take().expect("stderr is piped");
    // Fed and read from threads while this one waits on the exit, so that no order of reads
    // and writes can deadlock on a full pipe. A worker that exits early breaks the pipe; its
    // exit status then says why.
    let limit = limits.deadline + KILL_GRACE;
    let (status, out, err, killed) = std::thread::scope(|scope| {
        scope.spawn(move || {
            let _ = stdin.write_all(component);
        });
        let out = scope.spawn(move || {
            let mut bytes = Vec::new();
            stdout.read_to_end(&mut bytes).map(|_| bytes)
        });
        let err = scope.spawn(move || {
            let mut bytes = Vec::new();
            let _ = stderr.read_to_end(&mut bytes);
            bytes
        });
        let (exited, waited) = std::sync::mpsc::channel();
        scope.spawn(move || {
            let _ = exited.send(child.wait());
        });
        let (status, killed) = match waited.recv_timeout(limit) {
            Ok(status) => (status, false),
            Err(_) => {
                // The worker is not reaped until the waiting thread's wait returns, so its group
                // id still names it.
                let _ = crate::host::process::kill_group(pid);
                (waited.recv().unwrap_or_else(|e| Err(std::io::Error::other(e))), true)
            }
        };
        let out = out
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the reader panicked")));
        let err = err.join().unwrap_or_default();
        (status, out, err, killed)
    });
    if killed {
        return Err(WorkerError::Failed(format!(
            "the compile worker was still running {KILL_GRACE:?} past its {:?} deadline and was killed",
            limits.deadline
        )));
    }
    let status = status.map_err(|e| WorkerError::Unavailable(format!("waiting for the compile worker: {e}")))?;
    let out = out.map_err(|e| WorkerError::Unavailable(format!("reading the compile worker's output: {e}")))?;
    verdict(status, stderr_message(&err), limits).map(|()| out)
}

/// What the worker's exit status means.
fn verdict(status: ExitStatus, message: String, limits: CompileLimits) -> Result<(), WorkerError> {
    use std::os::unix::process::ExitStatusExt;
    if status.success() {
        return Ok(());
    }
    match (status.code(), status.signal()) {
        (Some(code), _) if code == i32::from(EXIT_REFUSED) || code == i32::from(EXIT_DEADLINE) => {
            Err(WorkerError::Failed(message))
        }
        (Some(EXIT_PANIC), _) => Err(WorkerError::Failed(format!("the compiler panicked: {message}"))),
        (_, Some(signal)) => Err(WorkerError::Failed(format!(
            "the compile worker was killed by signal {signal} (a compiler crash, or past its {} MiB address-space limit){}",
            limits.address_space_mib,
            if message.is_empty() {
                String::new()
            } else {
                format!(": {message}")
            }
        ))),
        (code, _) => Err(WorkerError::Unavailable(format!(
            "the compile worker exited with {code:?}, which is not its protocol: {message}"
        ))),
    }
}

fn stderr_message(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    match text.char_indices().nth(MAX_MESSAGE) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    fn exited(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code << 8)
    }

    #[test]
    fn exit_statuses_map_to_what_the_daemon_does_next() {
        assert!(verdict(exited(0), String::new(), CompileLimits::default()).is_ok());
        let failed = |r: Result<(), WorkerError>| match r {
            Err(WorkerError::Failed(message)) => message,
            other => panic!("expected a failed compile, got {other:?}"),
        };
        assert_eq!(
            failed(verdict(exited(10), "bad section".into(), CompileLimits::default())),
            "bad section"
        );
        assert_eq!(
            failed(verdict(exited(11), "took too long".into(), CompileLimits::default())),
            "took too long"
        );
        assert!(
            failed(verdict(exited(101), "boom".into(), CompileLimits::default()))
                .starts_with("the compiler panicked: boom")
        );
        let crashed = failed(verdict(
            ExitStatus::from_raw(11),
            String::new(),
            CompileLimits::default(),
        ));
        assert!(crashed.contains("killed by signal 11"), "{crashed}");
        // clap's usage error: a binary at that path that has no compile worker.
        assert!(matches!(
            verdict(exited(2), "unrecognized subcommand".into(), CompileLimits::default()),
            Err(WorkerError::Unavailable(m)) if m.contains("unrecognized subcommand")
        ));
    }

    #[test]
    fn a_long_stderr_is_cut_to_a_message() {
        let message = stderr_message("x".repeat(MAX_MESSAGE * 2).as_bytes());
        assert_eq!(message.chars().count(), MAX_MESSAGE + 1);
        assert_eq!(stderr_message(b"  line\n"), "line");
    }

    #[test]
    fn a_worker_that_hangs_is_killed_past_its_deadline() {
        use std::os::unix::fs::PermissionsExt;
        // A worker that ignores its watchdog (a compiler wedged with signals blocked, say).
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("wedged-worker");
        std::fs::write(&exe, "#!/bin/sh\nexec sleep 600\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let limits = CompileLimits {
            deadline: Duration::from_millis(200),
            ..CompileLimits::default()
        };
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(compile(&exe, limits, b"\0asm"));
        });
        let bound = limits.deadline + Duration::from_secs(20);
        match result.recv_timeout(bound) {
            Ok(Err(WorkerError::Failed(message))) => assert!(message.contains("deadline"), "{message}"),
            Ok(other) => panic!("expected a failed compile, got {other:?}"),
            Err(_) => panic!("the daemon still waits for its compile worker after {bound:?}"),
        }
    }
}
