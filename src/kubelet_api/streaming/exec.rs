//! `/exec/{namespace}/{pod}/{container}`: `cocoon vm exec [-i] VM -- argv` with the client's
//! streams. stdin is fed as it arrives (`-i` only when the client sends stdin), stdout and
//! stderr go out as the command writes them, the exit code comes back as the status kubectl
//! turns into its own exit code. A client that leaves stops the command (the `cocoon` process
//! is killed with the request, and with it the agent's command); nothing outlives the request.

use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncRead, AsyncWrite};

use super::Requester;
use super::remotecommand::{self, Options, Outcome, Streams};
use super::target::{self, Target};
use super::upgrade::plain;
use crate::kubelet_api::state::ApiState;
use crate::runtime::{ExecIo, ExecSpec, RuntimeError};

/// Why `kubectl exec -t` is refused (kubectl prints it).
pub const NO_TTY: &str = "vk-cocoon: a TTY was requested (-t), but cocoon vm exec runs the command through the VM's cocoon-agent, which allocates no terminal; run the command without -t (-i still streams stdin)";

pub async fn exec(
    State(api): State<Arc<ApiState>>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    req: Request,
) -> Response {
    let opts = match Options::parse(&query, true) {
        Ok(o) => o,
        Err(e) => return plain(StatusCode::BAD_REQUEST, format!("invalid exec request: {e}")),
    };
    let target = match target::resolve(&api, &namespace, &pod, Some(&container)) {
        Ok(t) => t,
        Err(refusal) => return refusal.into_response(),
    };
    let who = Requester::of(&req, &namespace, &pod);
    let admission = match api
        .streaming
        .admit(api.metrics.streams.with_label_values(&["exec"]), &who)
    {
        Ok(a) => a,
        Err(refusal) => return refusal.into_response(),
    };
    let run_api = api.clone();
    remotecommand::serve(api, req, opts.clone(), admission, "exec", move |streams| {
        run(run_api, target, opts, streams)
    })
    .await
}

async fn run(api: Arc<ApiState>, target: Target, opts: Options, mut streams: Streams) {
    if opts.tty {
        streams.finish(&Outcome::BadRequest(NO_TTY.into())).await;
        return;
    }
    let spec = ExecSpec {
        argv: opts.command.clone(),
        stdin: streams.stdin.is_some(),
        unbounded: true,
        ..Default::default()
    };
    let closed = streams.closed.clone();
    let outcome = {
        let mut no_stdout = tokio::io::sink();
        let mut no_stderr = tokio::io::sink();
        let io = ExecIo {
            stdin: streams
                .stdin
                .as_mut()
                .map(|s| s.as_mut() as &mut (dyn AsyncRead + Unpin + Send)),
            stdout: match streams.stdout.as_mut() {
                Some(o) => o.as_mut() as &mut (dyn AsyncWrite + Unpin + Send),
                None => &mut no_stdout,
            },
            stderr: match streams.stderr.as_mut() {
                Some(o) => o.as_mut() as &mut (dyn AsyncWrite + Unpin + Send),
                None => &mut no_stderr,
            },
        };
        tokio::select! {
            r = api.runtime.exec(&target.vm.id, &spec, io) => match r {
                Ok(()) => Outcome::Success,
                Err(RuntimeError::ExecExit { code }) => Outcome::ExitCode(code),
                Err(e) => Outcome::Internal(format!("error executing command in VM {}: {e}", target.vm.id)),
            },
            _ = closed.cancelled() => {
                // Dropping the exec kills its cocoon process (and the agent's command with it).
                // The command line may carry secrets: at info only the pod and VM are named.
                tracing::info!(pod = %format!("{}/{}", target.namespace, target.pod), vm = %target.vm.id, "exec: the client left; the command was stopped");
                tracing::debug!(vm = %target.vm.id, argv = ?opts.command, "exec: the stopped command");
                return;
            }
            _ = api.shutdown.cancelled() => Outcome::Internal("vk-cocoon is shutting down; the command was stopped".into()),
        }
    };
    tracing::debug!(vm = %target.vm.id, argv = ?opts.command, ?outcome, "exec: done");
    streams.finish(&outcome).await;
}
