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
//! an exit code saying which failure it was. The worker builds its engine from the daemon's
//! limits, so the artifact loads in the daemon's engine. wasmtime checks this again when it
//! deserializes the artifact.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, ExitCode, ExitStatus, Stdio};
use std::time::Duration;

use super::engine::{PolicyEngine, SandboxLimits};

/// How long one compile may take before the worker gives up on it. Far above any real policy:
/// the built-in components compile in well under a second.
pub const COMPILE_DEADLINE: Duration = Duration::from_secs(300);

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

/// The worker side: reads a component from stdin, compiles it for an engine built from
/// `limits`, and writes the artifact to stdout.
pub fn serve(limits: SandboxLimits, deadline: Duration) -> ExitCode {
    // A thread that ends the process at the deadline: the compiler cannot be interrupted from
    // within, but the whole process can.
    std::thread::spawn(move || {
        std::thread::sleep(deadline);
        eprintln!("compiling the component took longer than {deadline:?}; the compile was stopped");
        std::process::exit(i32::from(EXIT_DEADLINE));
    });
    let refuse = |message: String| {
        eprintln!("{message}");
        ExitCode::from(EXIT_REFUSED)
    };
    let mut component = Vec::new();
    if let Err(error) = std::io::stdin().read_to_end(&mut component) {
        return refuse(format!("reading the component from stdin: {error}"));
    }
    let engine = match PolicyEngine::new(limits) {
        Ok(engine) => engine,
        Err(error) => return refuse(format!("cannot start the wasm engine: {error:#}")),
    };
    let artifact = match engine.wasmtime().precompile_component(&component) {
        Ok(artifact) => artifact,
        Err(error) => return refuse(format!("{error:#}")),
    };
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(&artifact).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => refuse(format!("writing the compiled component to stdout: {error}")),
    }
}

/// The daemon side: compiles `component` in a worker started from `exe`.
pub(crate) fn compile(
    exe: &Path,
    limits: SandboxLimits,
    deadline: Duration,
    component: &[u8],
) -> Result<Vec<u8>, WorkerError> {
    let mut child = Command::new(exe)
        .args(["policy", "compile-worker"])
        .args(["--memory-bytes", &limits.memory_bytes.to_string()])
        .args(["--timeout-ms", &limits.timeout.as_millis().to_string()])
        .args(["--max-concurrent", &limits.max_concurrent.to_string()])
        .args(["--deadline-ms", &deadline.as_millis().to_string()])
        // Its stderr carries only its one message, never the daemon's log level's output.
        .env("VK_LOG_LEVEL", "off")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| WorkerError::Unavailable(format!("cannot start {}: {e}", exe.display())))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // Fed from a thread while this one collects stdout and stderr, so that no order of reads
    // and writes can deadlock on a full pipe. A worker that exits early breaks the pipe; its
    // exit status then says why.
    let output = std::thread::scope(|scope| {
        scope.spawn(move || {
            let _ = stdin.write_all(component);
        });
        child.wait_with_output()
    })
    .map_err(|e| WorkerError::Unavailable(format!("waiting for the compile worker: {e}")))?;
    let message = stderr_message(&output.stderr);
    verdict(output.status, message).map(|()| output.stdout)
}

/// What the worker's exit status means.
fn verdict(status: ExitStatus, message: String) -> Result<(), WorkerError> {
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
            "the compile worker was killed by signal {signal} (a compiler crash, or the OOM killer){}",
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
        assert!(verdict(exited(0), String::new()).is_ok());
        let failed = |r: Result<(), WorkerError>| match r {
            Err(WorkerError::Failed(message)) => message,
            other => panic!("expected a failed compile, got {other:?}"),
        };
        assert_eq!(failed(verdict(exited(10), "bad section".into())), "bad section");
        assert_eq!(failed(verdict(exited(11), "took too long".into())), "took too long");
        assert!(failed(verdict(exited(101), "boom".into())).starts_with("the compiler panicked: boom"));
        let crashed = failed(verdict(ExitStatus::from_raw(11), String::new()));
        assert!(crashed.contains("killed by signal 11"), "{crashed}");
        // clap's usage error: a binary at that path that has no compile worker.
        assert!(matches!(
            verdict(exited(2), "unrecognized subcommand".into()),
            Err(WorkerError::Unavailable(m)) if m.contains("unrecognized subcommand")
        ));
    }

    #[test]
    fn a_long_stderr_is_cut_to_a_message() {
        let message = stderr_message("x".repeat(MAX_MESSAGE * 2).as_bytes());
        assert_eq!(message.chars().count(), MAX_MESSAGE + 1);
        assert_eq!(stderr_message(b"  line\n"), "line");
    }
}
