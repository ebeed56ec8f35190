//! Typed async client for the `cocoon-macos` CLI (QEMU/KVM macOS guests):
//! [`MacosRuntime`] is what the provider uses, [`MacosCli`] runs `VK_COCOON_MACOS_BIN` with an
//! argv (never a shell). `vm run` and `vm start` outlive the call that asked for them: they run
//! on a task of their own with a 5 min budget, and when that runs out the process gets SIGTERM
//! and 90 s of grace before SIGKILL — a half-launched QEMU is never killed outright because a
//! pod operation was cancelled.

pub mod args;
pub mod record;

pub use args::{MacRunSpec, Vnc};
pub use record::{MacImage, MacVm, MacosError};

use crate::runtime::args::verb_of;
use async_trait::async_trait;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

pub type Result<T> = std::result::Result<T, MacosError>;

/// Everything the provider asks of cocoon-macos.
#[async_trait]
pub trait MacosRuntime: Send + Sync {
    /// `image inspect`; [`MacosError::ImageNotFound`] when absent.
    async fn image_inspect(&self, image: &str) -> Result<MacImage>;
    async fn image_pull(&self, image: &str) -> Result<()>;
    /// `vm inspect`; [`MacosError::VmNotFound`] only when the CLI says so.
    async fn inspect(&self, name: &str) -> Result<MacVm>;
    /// `vm run` (detached from the caller; see the module doc).
    async fn run(&self, spec: &MacRunSpec) -> Result<()>;
    /// `vm start` of a dead record (detached, as `run`).
    async fn start(&self, name: &str, vnc: &Option<Vnc>) -> Result<()>;
    /// `vm rm`; a VM that is not there is success.
    async fn remove(&self, name: &str) -> Result<()>;
}

#[derive(Debug, Clone)]
pub struct MacosCliConfig {
    /// `VK_COCOON_MACOS_BIN` (default `/usr/local/bin/cocoon-macos`, ≥ v0.1.8).
    pub bin: PathBuf,
    /// Run as `sudo -n <bin> …` (`VK_COCOON_SUDO`, shared with cocoon).
    pub sudo: bool,
    /// Extra environment for every invocation (e.g. `COCOON_MACOS_HOME`).
    pub env: Vec<(String, String)>,
    /// inspect, rm, image inspect.
    pub query_timeout: Duration,
    /// `vm run` / `vm start`.
    pub launch_timeout: Duration,
    /// SIGTERM → SIGKILL grace of a launch past its budget.
    pub launch_grace: Duration,
    /// `image pull` (a macOS golden image is tens of GiB).
    pub pull_timeout: Duration,
}

impl Default for MacosCliConfig {
    fn default() -> Self {
        Self {
            bin: PathBuf::from("/usr/local/bin/cocoon-macos"),
            sudo: false,
            env: Vec::new(),
            query_timeout: Duration::from_secs(60),
            launch_timeout: Duration::from_secs(300),
            launch_grace: Duration::from_secs(90),
            pull_timeout: Duration::from_secs(3600),
        }
    }
}

/// The `cocoon-macos` CLI client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MacosCli {
    cfg: Arc<MacosCliConfig>,
}

fn check_ref(what: &str, r: &str) -> Result<()> {
    crate::runtime::args::unsafe_ref(what, r).map_or(Ok(()), |m| Err(MacosError::InvalidRequest(m)))
}

/// Output of one finished invocation.
struct Finished {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl MacosCli {
    pub fn new(cfg: MacosCliConfig) -> Self {
        Self { cfg: Arc::new(cfg) }
    }

    pub fn config(&self) -> &MacosCliConfig {
        &self.cfg
    }

    fn command(&self, args: &[String]) -> Command {
        super::process::cli_command(&self.cfg.bin, self.cfg.sudo, &self.cfg.env, args)
    }

    /// Runs a verb to completion within `timeout`. `detached`: on its own task (the caller
    /// dropping its future does not stop it) and stopped with SIGTERM + grace when late;
    /// otherwise killed when late or dropped.
    async fn exec(&self, args: Vec<String>, timeout: Duration, detached: bool) -> Result<Finished> {
        let verb = verb_of(&args);
        tracing::debug!(%verb, argv = ?args::redacted(&args), "cocoon-macos: spawn");
        let mut cmd = self.command(&args);
        cmd.kill_on_drop(!detached);
        let mut child = cmd.spawn().map_err(|source| MacosError::Spawn {
            verb: verb.clone(),
            bin: self.cfg.bin.display().to_string(),
            source,
        })?;
        let grace = self.cfg.launch_grace;
        let work = async move {
            let mut out = child.stdout.take().expect("stdout piped");
            let mut err = child.stderr.take().expect("stderr piped");
            let read_out = async {
                let mut s = String::new();
                let _ = out.read_to_string(&mut s).await;
                s
            };
            let read_err = async {
                let mut s = String::new();
                let _ = err.read_to_string(&mut s).await;
                s
            };
            let waited = tokio::time::timeout(timeout, async {
                let (stdout, stderr, status) = tokio::join!(read_out, read_err, child.wait());
                (stdout, stderr, status)
            })
            .await;
            match waited {
                Ok((stdout, stderr, status)) => {
                    let status = status.map_err(|source| MacosError::Io {
                        verb: verb.clone(),
                        source,
                    })?;
                    Ok(Finished {
                        code: status.code(),
                        stdout,
                        stderr,
                    })
                }
                Err(_) => {
                    if detached && let Some(pid) = child.id() {
                        tracing::warn!(%verb, ?timeout, ?grace, "cocoon-macos: late; SIGTERM, then SIGKILL after the grace");
                        // The pid is our unreaped child: it names no other process.
                        let _ = crate::host::process::terminate(pid as i32);
                        if tokio::time::timeout(grace, child.wait()).await.is_err() {
                            let _ = child.kill().await;
                        }
                    } else {
                        let _ = child.kill().await;
                    }
                    Err(MacosError::Timeout { verb, after: timeout })
                }
            }
        };
        if detached {
            tokio::spawn(work).await.map_err(|e| MacosError::Io {
                verb: verb_of(&args),
                source: std::io::Error::other(format!("the launch task failed: {e}")),
            })?
        } else {
            work.await
        }
    }

    /// Runs a verb; stdout on success, a classified error otherwise.
    async fn output(&self, args: Vec<String>, reference: &str, timeout: Duration, detached: bool) -> Result<String> {
        let verb = verb_of(&args);
        let f = self.exec(args, timeout, detached).await?;
        if f.code == Some(0) {
            tracing::debug!(%verb, reference, "cocoon-macos: ok");
            return Ok(f.stdout);
        }
        let err = record::classify(&verb, reference, f.code, &f.stderr);
        tracing::debug!(%verb, reference, code = ?f.code, error = %err, "cocoon-macos: failed");
        Err(err)
    }
}

#[async_trait]
impl MacosRuntime for MacosCli {
    async fn image_inspect(&self, image: &str) -> Result<MacImage> {
        check_ref("image", image)?;
        let out = self
            .output(args::image_inspect(image), image, self.cfg.query_timeout, false)
            .await?;
        record::parse_json("image inspect", &out)
    }

    async fn image_pull(&self, image: &str) -> Result<()> {
        check_ref("image", image)?;
        self.output(args::image_pull(image), image, self.cfg.pull_timeout, true)
            .await
            .map(|_| ())
    }

    async fn inspect(&self, name: &str) -> Result<MacVm> {
        check_ref("vm", name)?;
        let out = self
            .output(args::inspect(name), name, self.cfg.query_timeout, false)
            .await?;
        record::parse_json("vm inspect", &out)
    }

    async fn run(&self, spec: &MacRunSpec) -> Result<()> {
        check_ref("vm", &spec.name)?;
        check_ref("image", &spec.image)?;
        self.output(args::run(spec), &spec.name, self.cfg.launch_timeout, true)
            .await
            .map(|_| ())
    }

    async fn start(&self, name: &str, vnc: &Option<Vnc>) -> Result<()> {
        check_ref("vm", name)?;
        self.output(args::start(name, vnc), name, self.cfg.launch_timeout, true)
            .await
            .map(|_| ())
    }

    async fn remove(&self, name: &str) -> Result<()> {
        check_ref("vm", name)?;
        match self.output(args::rm(name), name, self.cfg.query_timeout, false).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e),
        }
    }
}
