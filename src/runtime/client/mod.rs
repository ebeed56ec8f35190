//! [`CocoonCli`]: the process-level implementation of [`CocoonRuntime`] (argv only, never a shell).
//!
//! This file owns spawning and supervising `cocoon` processes (deadlines, stderr capture, the
//! [`CocoonRuntime`] verbs); `config` holds the client's settings and `export` the streaming
//! `snapshot export` reader.

use super::args::{self, CloneSpec, ExecSpec, RunSpec, verb_of};
use super::errors::{Result, RuntimeError};
use super::events::{self, EventConnection, WatchItem};
use super::parse::{self, ImageRecord, SnapshotRecord, StaleCreateOutcome, VmRecord};
use super::{CocoonRuntime, ExecIo};
use crate::host;
use async_trait::async_trait;
use futures::stream::BoxStream;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

mod config;
mod export;

pub use config::{BusyRetry, CocoonCliConfig, Timeouts};
pub use export::{SnapshotExport, copy_export, runtime_error_of};

/// The `cocoon` CLI client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct CocoonCli {
    cfg: Arc<CocoonCliConfig>,
}

/// The buffer of each `vm exec` stream copy (pipes are widened to match).
const EXEC_BUF: usize = 256 * 1024;

/// Keeps only the last `cap` bytes of stderr (errors are classified from it).
const STDERR_CAP: usize = 64 * 1024;

/// The most bytes of `vm logs` output kept: its last part (the newest lines, from a line
/// start). The log's size is a guest's to choose (a firecracker guest's console is its log), so
/// the daemon never holds all of it.
pub const LOGS_CAP: usize = 8 << 20;

fn check_ref(what: &str, r: &str) -> Result<()> {
    crate::runtime::args::unsafe_ref(what, r).map_or(Ok(()), |m| Err(RuntimeError::InvalidRequest(m)))
}

/// The end of a streaming verb whose stdout the caller reads: waits for `child`, then turns a
/// failed exit into the typed error its stderr names (`reference`: the object it was about).
fn exit_of(mut child: Child, verb: String, reference: String) -> futures::future::BoxFuture<'static, Result<()>> {
    let stderr = drain_stderr(child.stderr.take());
    Box::pin(async move {
        let status = child.wait().await.map_err(|source| RuntimeError::Io {
            verb: verb.clone(),
            source,
        })?;
        let stderr = stderr.await.unwrap_or_default();
        if status.success() {
            Ok(())
        } else {
            Err(parse::classify_failure(&verb, &reference, status.code(), &stderr))
        }
    })
}

/// `args` for the log: the value of each `-e K=V` (an exec's environment, which may hold
/// secrets) is left out.
fn redacted(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let (mut env_next, mut command) = (false, false);
    for a in args {
        if env_next {
            let name = a.split_once('=').map_or(a.as_str(), |(k, _)| k);
            out.push(format!("{name}=…"));
        } else {
            out.push(a.clone());
        }
        // Only flags before `--` are cocoon's; what follows is the guest command's argv.
        command |= a == "--";
        env_next = a == "-e" && !command;
    }
    out
}

/// Reads `r` to its end, keeping its last `cap` bytes (from the first line start in them when
/// anything was dropped). Linear: the front is dropped once per `cap` bytes read, so at most
/// twice `cap` is held.
async fn keep_tail(mut r: impl AsyncRead + Unpin, cap: usize) -> std::io::Result<Vec<u8>> {
    let mut kept = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut cut = false;
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        kept.extend_from_slice(&buf[..n]);
        if kept.len() > 2 * cap {
            kept.drain(..kept.len() - cap);
            cut = true;
        }
    }
    if kept.len() > cap {
        kept.drain(..kept.len() - cap);
        cut = true;
    }
    if cut && let Some(nl) = kept.iter().position(|b| *b == b'\n') {
        kept.drain(..=nl);
    }
    Ok(kept)
}

/// Drains a child's stderr in the background, keeping the tail.
fn drain_stderr(stderr: Option<tokio::process::ChildStderr>) -> tokio::task::JoinHandle<String> {
    tokio::spawn(async move {
        let Some(mut s) = stderr else { return String::new() };
        let mut keep = Vec::new();
        let mut buf = vec![0u8; 8192];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    keep.extend_from_slice(&buf[..n]);
                    if keep.len() > STDERR_CAP {
                        keep.drain(..keep.len() - STDERR_CAP);
                    }
                }
            }
        }
        String::from_utf8_lossy(&keep).into_owned()
    })
}

impl CocoonCli {
    pub fn new(cfg: CocoonCliConfig) -> Self {
        CocoonCli { cfg: Arc::new(cfg) }
    }

    pub fn config(&self) -> &CocoonCliConfig {
        &self.cfg
    }

    /// `cocoon version`: the build's metadata (`runtime::version` reads it).
    pub async fn version(&self) -> Result<String> {
        self.output(args::version(), "", self.cfg.timeouts.query).await
    }

    /// Killed when dropped: a cancelled or timed-out call leaves no cocoon process behind.
    fn command(&self, args: &[String]) -> Command {
        let mut cmd = super::process::cli_command(&self.cfg.bin, self.cfg.sudo, &self.cfg.env, args);
        cmd.kill_on_drop(true);
        cmd
    }

    fn spawn(&self, args: &[String], mut cmd: Command) -> Result<Child> {
        let verb = verb_of(args);
        tracing::debug!(%verb, argv = ?redacted(args), "cocoon: spawn");
        cmd.spawn().map_err(|source| RuntimeError::Spawn {
            verb,
            bin: self.cfg.bin.display().to_string(),
            source,
        })
    }

    /// Runs a verb to completion, returns stdout, classifies failures from stderr.
    async fn output(&self, args: Vec<String>, reference: &str, timeout: Duration) -> Result<String> {
        let verb = verb_of(&args);
        let child = self.spawn(&args, self.command(&args))?;
        let started = Instant::now();
        let out = match tokio::time::timeout(timeout, child.wait_with_output()).await {
            Ok(r) => r.map_err(|source| RuntimeError::Io {
                verb: verb.clone(),
                source,
            })?,
            Err(_) => {
                tracing::warn!(%verb, reference, ?timeout, "cocoon: timed out; killed");
                return Err(RuntimeError::Timeout { verb, after: timeout });
            }
        };
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            tracing::debug!(%verb, reference, elapsed = ?started.elapsed(), "cocoon: ok");
            return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let err = parse::classify_failure(&verb, reference, out.status.code(), &stderr);
        tracing::debug!(%verb, reference, code = ?out.status.code(), error = %err, "cocoon: failed");
        Err(err)
    }

    /// [`Self::output`] for a verb whose stdout may be large: only its last `cap` bytes are
    /// kept ([`keep_tail`]), read as they come.
    async fn output_tail(&self, args: Vec<String>, reference: &str, timeout: Duration, cap: usize) -> Result<String> {
        let verb = verb_of(&args);
        let mut child = self.spawn(&args, self.command(&args))?;
        let stderr = drain_stderr(child.stderr.take());
        let stdout = child.stdout.take().expect("stdout piped");
        let io = |source| RuntimeError::Io {
            verb: verb.clone(),
            source,
        };
        let run = async {
            let kept = keep_tail(stdout, cap).await.map_err(io)?;
            let status = child.wait().await.map_err(io)?;
            Ok::<_, RuntimeError>((kept, status))
        };
        let outcome = tokio::time::timeout(timeout, run).await;
        let (kept, status) = match outcome {
            Ok(r) => r?,
            Err(_) => {
                tracing::warn!(%verb, reference, ?timeout, "cocoon: timed out; killed");
                return Err(RuntimeError::Timeout { verb, after: timeout });
            }
        };
        let stderr = stderr.await.unwrap_or_default();
        if status.success() {
            return Ok(String::from_utf8_lossy(&kept).into_owned());
        }
        Err(parse::classify_failure(&verb, reference, status.code(), &stderr))
    }

    /// Runs a verb with `input` streamed to its stdin.
    async fn with_stdin(
        &self,
        args: Vec<String>,
        reference: &str,
        input: &mut (dyn AsyncRead + Unpin + Send),
    ) -> Result<()> {
        let verb = verb_of(&args);
        let timeout = self.cfg.timeouts.transfer;
        let mut cmd = self.command(&args);
        cmd.stdin(Stdio::piped()).stdout(Stdio::null());
        let mut child = self.spawn(&args, cmd)?;
        let stderr = drain_stderr(child.stderr.take());
        let mut stdin = child.stdin.take().expect("stdin piped");
        host::fs::widen_pipe(&stdin);
        let work = async {
            let mut buf = vec![0u8; 256 * 1024];
            let mut input_error = None;
            loop {
                let n = match input.read(&mut buf).await {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) => {
                        input_error = Some(e);
                        break;
                    }
                };
                if stdin.write_all(&buf[..n]).await.is_err() {
                    break; // the process stopped reading; its exit status tells why
                }
            }
            if let Some(e) = input_error {
                // Never let cocoon register a truncated stream.
                let _ = child.start_kill();
                let _ = child.wait().await;
                return Err(RuntimeError::Io {
                    verb: verb.clone(),
                    source: std::io::Error::new(e.kind(), format!("reading the input stream: {e}")),
                });
            }
            let _ = stdin.shutdown().await;
            drop(stdin);
            child.wait().await.map_err(|source| RuntimeError::Io {
                verb: verb.clone(),
                source,
            })
        };
        let status = match tokio::time::timeout(timeout, work).await {
            Ok(r) => r?,
            Err(_) => return Err(RuntimeError::Timeout { verb, after: timeout }),
        };
        let stderr = stderr.await.unwrap_or_default();
        if status.success() {
            return Ok(());
        }
        Err(parse::classify_failure(&verb, reference, status.code(), &stderr))
    }

    /// `snapshot rm`, retried while the snapshot is leased; absent counts as success.
    async fn remove_snapshot_retrying(&self, reference: &str) -> Result<()> {
        let deadline = Instant::now() + self.cfg.busy_retry.budget;
        loop {
            match self
                .output(args::snapshot_rm(reference), reference, self.cfg.timeouts.query)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.is_snapshot_not_found() => return Ok(()),
                Err(RuntimeError::SnapshotInUse { .. })
                    if Instant::now() + self.cfg.busy_retry.interval <= deadline =>
                {
                    tracing::info!(snapshot = reference, "cocoon: snapshot in use; retrying rm");
                    tokio::time::sleep(self.cfg.busy_retry.interval).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn save_once(&self, name: &str, vm_id: &str) -> Result<()> {
        self.output(args::snapshot_save(name, vm_id), name, self.cfg.timeouts.create)
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl CocoonRuntime for CocoonCli {
    async fn run(&self, spec: &RunSpec) -> Result<VmRecord> {
        check_ref("image", &spec.image)?;
        let a = args::run(spec);
        let vm = parse::parse_vm("vm run", &self.output(a, &spec.image, self.cfg.timeouts.create).await?)?;
        if !vm.state.is_running() || vm.pid == 0 {
            tracing::debug!(id = %vm.id, state = vm.state.as_str(), "cocoon: vm run returned a non-running record; re-inspecting");
            return self.inspect(&vm.id).await;
        }
        Ok(vm)
    }

    async fn clone_vm(&self, spec: &CloneSpec) -> Result<VmRecord> {
        let reference = match &spec.source {
            args::CloneSource::Snapshot(s) => s.clone(),
            args::CloneSource::Dir(d) => d.clone(),
        };
        check_ref("clone source", &reference)?;
        parse::parse_vm(
            "vm clone",
            &self
                .output(args::clone(spec), &reference, self.cfg.timeouts.create)
                .await?,
        )
    }

    async fn inspect(&self, reference: &str) -> Result<VmRecord> {
        check_ref("vm", reference)?;
        parse::parse_vm(
            "vm inspect",
            &self
                .output(args::inspect(reference), reference, self.cfg.timeouts.query)
                .await?,
        )
    }

    async fn list(&self) -> Result<Vec<VmRecord>> {
        parse::parse_vm_list(&self.output(args::list(), "", self.cfg.timeouts.query).await?)
    }

    async fn remove(&self, reference: &str) -> Result<()> {
        check_ref("vm", reference)?;
        match self
            .output(args::remove(reference), reference, self.cfg.timeouts.query)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.is_vm_not_found() => {
                tracing::debug!(vm = reference, "cocoon: vm already absent");
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    async fn start(&self, reference: &str) -> Result<()> {
        check_ref("vm", reference)?;
        self.output(args::start(reference), reference, self.cfg.timeouts.create)
            .await
            .map(|_| ())
    }

    async fn reconcile_stale_create(&self, reference: &str) -> Result<StaleCreateOutcome> {
        check_ref("vm", reference)?;
        parse::parse_stale_create(
            &self
                .output(
                    args::reconcile_stale_create(reference),
                    reference,
                    self.cfg.timeouts.query,
                )
                .await?,
        )
    }

    async fn net_resize(&self, reference: &str, nics: u32) -> Result<()> {
        check_ref("vm", reference)?;
        self.output(args::net_resize(reference, nics), reference, self.cfg.timeouts.query)
            .await
            .map(|_| ())
    }

    async fn exec(&self, reference: &str, spec: &ExecSpec, io: ExecIo<'_>) -> Result<()> {
        check_ref("vm", reference)?;
        if spec.argv.is_empty() {
            return Err(RuntimeError::InvalidRequest("vm exec needs a command".into()));
        }
        let ExecIo {
            stdin: input,
            stdout: out,
            stderr: err,
        } = io;
        let spec = ExecSpec {
            stdin: input.is_some(),
            ..spec.clone()
        };
        let a = args::exec(reference, &spec);
        let verb = verb_of(&a);
        let mut cmd = self.command(&a);
        if input.is_some() {
            cmd.stdin(Stdio::piped());
        }
        let mut child = self.spawn(&a, cmd)?;
        let mut child_in = child.stdin.take();
        let mut child_out = child.stdout.take().expect("stdout piped");
        let mut child_err = child.stderr.take().expect("stderr piped");
        if let Some(ci) = &child_in {
            host::fs::widen_pipe(ci);
        }
        host::fs::widen_pipe(&child_out);
        let feed = async {
            if let (Some(input), Some(ci)) = (input, child_in.as_mut()) {
                let mut input = tokio::io::BufReader::with_capacity(EXEC_BUF, input);
                let _ = tokio::io::copy_buf(&mut input, ci).await;
                let _ = ci.shutdown().await;
            }
            drop(child_in.take());
        };
        let pump_out = async {
            let mut from = tokio::io::BufReader::with_capacity(EXEC_BUF, &mut child_out);
            let r = tokio::io::copy_buf(&mut from, &mut *out).await.map(|_| ());
            let _ = out.flush().await;
            r
        };
        let pump_err = async {
            let mut tail = Vec::new();
            let mut buf = vec![0u8; 8192];
            loop {
                match child_err.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let _ = err.write_all(&buf[..n]).await;
                        tail.extend_from_slice(&buf[..n]);
                        if tail.len() > STDERR_CAP {
                            tail.drain(..tail.len() - STDERR_CAP);
                        }
                    }
                }
            }
            let _ = err.flush().await;
            String::from_utf8_lossy(&tail).into_owned()
        };
        let timeout = if spec.unbounded {
            None
        } else {
            Some(self.cfg.timeouts.exec)
        };
        let all = async {
            let outputs = async {
                let (out_res, tail) = tokio::join!(pump_out, pump_err);
                let status = child.wait().await;
                (out_res, tail, status)
            };
            tokio::pin!(feed, outputs);
            // The command may finish while the client still holds stdin open: its exit ends
            // the exec (the rest of stdin has nowhere to go).
            let mut fed = false;
            loop {
                tokio::select! {
                    () = &mut feed, if !fed => fed = true,
                    r = &mut outputs => break r,
                }
            }
        };
        let (out_res, tail, status) = match timeout {
            None => all.await,
            Some(timeout) => match tokio::time::timeout(timeout, all).await {
                Ok(r) => r,
                Err(_) => return Err(RuntimeError::Timeout { verb, after: timeout }),
            },
        };
        let status = status.map_err(|source| RuntimeError::Io {
            verb: verb.clone(),
            source,
        })?;
        out_res.map_err(|source| RuntimeError::Io {
            verb: verb.clone(),
            source,
        })?;
        if status.success() {
            return Ok(());
        }
        let code = status.code();
        // cocoon prints `Error: …` only for its own (transport) failures; a guest command's status comes bare.
        if tail.lines().any(|l| l.starts_with("Error: ")) {
            return Err(parse::classify_failure(&verb, reference, code, &tail));
        }
        match code {
            Some(code) => Err(RuntimeError::ExecExit { code }),
            None => Err(RuntimeError::Command {
                verb,
                code: None,
                stderr: format!("killed by a signal; stderr: {}", tail.trim()),
            }),
        }
    }

    async fn logs(&self, reference: &str, tail: Option<u64>) -> Result<String> {
        check_ref("vm", reference)?;
        self.output_tail(
            args::logs(reference, tail),
            reference,
            self.cfg.timeouts.query,
            LOGS_CAP,
        )
        .await
    }

    fn watch_events(&self) -> BoxStream<'static, WatchItem> {
        let me = self.clone();
        let connect: events::Connect = Box::new(
            move || -> futures::future::BoxFuture<'static, Result<EventConnection>> {
                let me = me.clone();
                Box::pin(async move {
                    let a = args::events();
                    let verb = verb_of(&a);
                    let mut child = me.spawn(&a, me.command(&a))?;
                    let stdout = child.stdout.take().expect("stdout piped");
                    Ok(EventConnection {
                        stdout: Box::new(stdout),
                        finished: exit_of(child, verb, String::new()),
                    })
                })
            },
        );
        events::watch(connect, self.cfg.watch_backoff)
    }

    async fn snapshot_save(&self, name: &str, vm_id: &str) -> Result<()> {
        check_ref("snapshot", name)?;
        check_ref("vm", vm_id)?;
        match self.save_once(name, vm_id).await {
            Err(RuntimeError::NameTaken { holder, stderr, .. }) => {
                let holder = holder.unwrap_or_else(|| name.to_string());
                tracing::info!(snapshot = name, %holder, %stderr, "cocoon: snapshot name taken; removing the holder and saving again");
                self.remove_snapshot_retrying(&holder).await?;
                self.save_once(name, vm_id).await
            }
            other => other,
        }
    }

    async fn snapshot_inspect(&self, name: &str) -> Result<SnapshotRecord> {
        check_ref("snapshot", name)?;
        parse::parse_snapshot(
            &self
                .output(args::snapshot_inspect(name), name, self.cfg.timeouts.query)
                .await?,
        )
    }

    async fn snapshot_list(&self, vm: Option<&str>) -> Result<Vec<SnapshotRecord>> {
        if let Some(vm) = vm {
            check_ref("vm", vm)?;
        }
        parse::parse_snapshot_list(
            &self
                .output(args::snapshot_list(vm), vm.unwrap_or(""), self.cfg.timeouts.query)
                .await?,
        )
    }

    async fn snapshot_remove_if_exists(&self, name: &str) -> Result<()> {
        check_ref("snapshot", name)?;
        self.remove_snapshot_retrying(name).await
    }

    async fn snapshot_import(&self, name: &str, tar: &mut (dyn AsyncRead + Unpin + Send)) -> Result<()> {
        check_ref("snapshot", name)?;
        self.remove_snapshot_retrying(name).await?;
        self.with_stdin(args::snapshot_import(name), name, tar).await
    }

    async fn snapshot_export(&self, name: &str) -> Result<Box<dyn AsyncRead + Send + Unpin>> {
        Ok(Box::new(self.open_export(name).await?))
    }

    async fn snapshot_export_to_dir(&self, name: &str, dir: &Path) -> Result<()> {
        check_ref("snapshot", name)?;
        let dir = dir
            .to_str()
            .ok_or_else(|| RuntimeError::InvalidRequest(format!("export directory {dir:?} is not UTF-8")))?;
        self.output(args::snapshot_export_dir(name, dir), name, self.cfg.timeouts.transfer)
            .await
            .map(|_| ())
    }

    async fn image_pull(&self, reference: &str, force: bool) -> Result<()> {
        check_ref("image", reference)?;
        self.output(args::image_pull(reference, force), reference, self.cfg.timeouts.create)
            .await
            .map(|_| ())
    }

    async fn image_inspect(&self, reference: &str) -> Result<ImageRecord> {
        check_ref("image", reference)?;
        parse::parse_image(
            &self
                .output(args::image_inspect(reference), reference, self.cfg.timeouts.query)
                .await?,
        )
    }

    async fn image_import(&self, name: &str, data: &mut (dyn AsyncRead + Unpin + Send)) -> Result<()> {
        check_ref("image", name)?;
        self.with_stdin(args::image_import(name), name, data).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn keep_tail_holds_the_last_whole_lines_within_the_cap() {
        let text: String = (0..10_000).map(|i| format!("line {i}\n")).collect();
        let kept = keep_tail(text.as_bytes(), 1000).await.unwrap();
        assert!(kept.len() <= 1000);
        let kept = String::from_utf8(kept).unwrap();
        assert!(kept.starts_with("line ") && kept.ends_with("line 9999\n"), "{kept}");
        assert!(text.ends_with(&kept));
        // Under the cap, everything.
        assert_eq!(keep_tail(&b"a\nb"[..], 1000).await.unwrap(), b"a\nb");
    }

    #[test]
    fn logged_argv_leaves_out_environment_values() {
        let args: Vec<String> = ["vm", "exec", "-e", "TOKEN=s3cret", "vm1", "--", "env", "-e", "X=1"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            redacted(&args),
            ["vm", "exec", "-e", "TOKEN=…", "vm1", "--", "env", "-e", "X=1"]
        );
    }
}
