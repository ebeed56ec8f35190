//! Streaming `snapshot export`: the child process's stdout as an [`AsyncRead`] whose EOF means
//! cocoon exited 0, the typed error a stream failure carries, and the copy helper callers use.

use super::{CocoonCli, check_ref, exit_of};
use crate::runtime::args;
use crate::runtime::args::verb_of;
use crate::runtime::errors::{Result, RuntimeError};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::process::ChildStdout;

impl CocoonCli {
    /// Opens a streaming export (`snapshot export NAME -o -`).
    pub async fn open_export(&self, name: &str) -> Result<SnapshotExport> {
        check_ref("snapshot", name)?;
        let args = args::snapshot_export(name);
        let verb = verb_of(&args);
        let mut child = self.spawn(&args, self.command(&args))?;
        let stdout = child.stdout.take().expect("stdout piped");
        crate::host::fs::widen_pipe(&stdout);
        let finish = exit_of(child, verb.clone(), name.to_string());
        let timeout = self.cfg.timeouts.transfer;
        Ok(SnapshotExport {
            stdout,
            finish: Some(finish),
            deadline: Box::pin(tokio::time::sleep(timeout)),
            timeout,
            verb,
            done: false,
        })
    }
}

/// A streaming `snapshot export`: the tar bytes as an [`AsyncRead`]. EOF is reported only after cocoon
/// exited 0; a failure (or the transfer deadline) surfaces as an `io::Error` wrapping [`RuntimeError`]
/// (see [`runtime_error_of`]). Dropping it kills the process.
pub struct SnapshotExport {
    stdout: ChildStdout,
    finish: Option<Pin<Box<dyn Future<Output = Result<()>> + Send>>>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
    verb: String,
    done: bool,
}

/// Extracts the [`RuntimeError`] carried by an `io::Error` from a stream of this module, if any.
pub fn runtime_error_of(e: std::io::Error) -> RuntimeError {
    if e.get_ref().is_some_and(|inner| inner.is::<RuntimeError>()) {
        if let Ok(inner) = e.into_inner().expect("checked").downcast::<RuntimeError>() {
            return *inner;
        }
        unreachable!("checked type");
    }
    RuntimeError::Io {
        verb: "stream".into(),
        source: e,
    }
}

impl AsyncRead for SnapshotExport {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(Ok(()));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.done = true;
            this.finish = None; // drops the child: killed
            return Poll::Ready(Err(std::io::Error::other(RuntimeError::Timeout {
                verb: this.verb.clone(),
                after: this.timeout,
            })));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stdout).poll_read(cx, buf) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) if buf.filled().len() > before => return Poll::Ready(Ok(())),
            Poll::Ready(Ok(())) => {}
        }
        // EOF on stdout: the result depends on the exit status.
        let Some(finish) = this.finish.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        match finish.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(r) => {
                this.done = true;
                this.finish = None;
                Poll::Ready(r.map_err(std::io::Error::other))
            }
        }
    }
}

/// Copies a streaming export into `out`, returning the byte count; failures come back typed.
pub async fn copy_export(mut export: impl AsyncRead + Unpin, out: &mut (dyn AsyncWrite + Unpin + Send)) -> Result<u64> {
    let n = tokio::io::copy(&mut export, out).await.map_err(runtime_error_of)?;
    out.flush().await.map_err(|source| RuntimeError::Io {
        verb: "snapshot export".into(),
        source,
    })?;
    Ok(n)
}
