//! Typed async client for the `cocoon` CLI (issue 3).
//!
//! - [`CocoonRuntime`]: what the provider uses (mockable; object-safe).
//! - [`CocoonCli`]: runs `VK_COCOON_BIN` (optionally via `sudo -n`) with an argv, never a shell; per-call
//!   timeouts; dropping a call's future kills its process.
//! - Pure parts: [`args`] (argv), [`parse`] (JSON and stderr), [`quantity`] (k8s quantities → bytes),
//!   [`events`] (line reader, backoff, reconnecting stream).

pub mod args;
pub mod client;
pub mod config;
pub mod errors;
pub mod events;
pub mod macos;
pub mod parse;
mod process;
pub mod quantity;
pub mod version;

pub use args::{Backend, CloneSource, CloneSpec, CpuPolicy, ExecSpec, RestoreMode, RunSpec};
pub use client::{BusyRetry, CocoonCli, CocoonCliConfig, SnapshotExport, Timeouts, copy_export, runtime_error_of};
pub use errors::{Result, RuntimeError};
pub use events::{WatchBackoff, WatchItem};
pub use parse::{EventKind, ImageRecord, SnapshotRecord, StaleCreateOutcome, VmEvent, VmRecord, VmState};

use async_trait::async_trait;
use futures::stream::BoxStream;
use std::path::Path;
use tokio::io::{AsyncRead, AsyncWrite};

/// The streams of one `vm exec`. `stdin: Some` attaches stdin (`-i`).
pub struct ExecIo<'a> {
    pub stdin: Option<&'a mut (dyn AsyncRead + Unpin + Send)>,
    pub stdout: &'a mut (dyn AsyncWrite + Unpin + Send),
    pub stderr: &'a mut (dyn AsyncWrite + Unpin + Send),
}

/// Captured result of [`CocoonRuntime::exec_capture`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Everything the provider asks of cocoon.
#[async_trait]
pub trait CocoonRuntime: Send + Sync {
    /// `vm run`; re-inspects once when the result is not running or has pid 0.
    async fn run(&self, spec: &RunSpec) -> Result<VmRecord>;
    /// `vm clone`; the record may carry `hints`.
    async fn clone_vm(&self, spec: &CloneSpec) -> Result<VmRecord>;
    /// `vm inspect`; [`RuntimeError::VmNotFound`] only when cocoon says so.
    async fn inspect(&self, reference: &str) -> Result<VmRecord>;
    async fn list(&self) -> Result<Vec<VmRecord>>;
    /// `vm rm --force`; an absent VM is success.
    async fn remove(&self, reference: &str) -> Result<()>;
    async fn start(&self, reference: &str) -> Result<()>;
    async fn reconcile_stale_create(&self, reference: &str) -> Result<StaleCreateOutcome>;
    async fn net_resize(&self, reference: &str, nics: u32) -> Result<()>;
    /// `vm exec`, streaming; a non-zero guest status is [`RuntimeError::ExecExit`].
    async fn exec(&self, reference: &str, spec: &ExecSpec, io: ExecIo<'_>) -> Result<()>;
    /// `vm logs [--tail N]`.
    async fn logs(&self, reference: &str, tail: Option<u64>) -> Result<String>;
    /// `vm status --event --format json`, reconnecting forever; drop the stream to stop.
    fn watch_events(&self) -> BoxStream<'static, WatchItem>;
    /// `snapshot save --name NAME VMID`; on a taken name removes the holder (retrying while leased) and saves again.
    async fn snapshot_save(&self, name: &str, vm_id: &str) -> Result<()>;
    async fn snapshot_inspect(&self, name: &str) -> Result<SnapshotRecord>;
    async fn snapshot_list(&self, vm: Option<&str>) -> Result<Vec<SnapshotRecord>>;
    /// `snapshot rm`; absent is success; retried while leased.
    async fn snapshot_remove_if_exists(&self, name: &str) -> Result<()>;
    /// Removes NAME if present, then `snapshot import --name NAME` with `tar` streamed on stdin.
    async fn snapshot_import(&self, name: &str, tar: &mut (dyn AsyncRead + Unpin + Send)) -> Result<()>;
    /// `snapshot export NAME -o -` as a stream; EOF only after a successful exit (errors via [`runtime_error_of`]).
    async fn snapshot_export(&self, name: &str) -> Result<Box<dyn AsyncRead + Send + Unpin>>;
    /// `snapshot export NAME --to-dir DIR`.
    async fn snapshot_export_to_dir(&self, name: &str, dir: &Path) -> Result<()>;
    async fn image_pull(&self, reference: &str, force: bool) -> Result<()>;
    /// `image inspect`; [`RuntimeError::ImageNotFound`] when absent.
    async fn image_inspect(&self, reference: &str) -> Result<ImageRecord>;
    /// `image import NAME` with the image (qcow2 or tar) streamed on stdin.
    async fn image_import(&self, name: &str, data: &mut (dyn AsyncRead + Unpin + Send)) -> Result<()>;

    /// `vm exec` with captured output; a non-zero guest status is returned in `code`, not as an error.
    async fn exec_capture(&self, reference: &str, spec: &ExecSpec, stdin: Option<&[u8]>) -> Result<ExecOutput> {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let mut cursor = stdin.map(|s| std::io::Cursor::new(s.to_vec()));
        let io = ExecIo {
            stdin: cursor.as_mut().map(|c| c as &mut (dyn AsyncRead + Unpin + Send)),
            stdout: &mut out,
            stderr: &mut err,
        };
        let code = match self.exec(reference, spec, io).await {
            Ok(()) => 0,
            Err(RuntimeError::ExecExit { code }) => code,
            Err(e) => return Err(e),
        };
        Ok(ExecOutput {
            code,
            stdout: out,
            stderr: err,
        })
    }
}
