//! `/attach/{namespace}/{pod}/{container}`: the VM's serial console — `console.sock` in its run
//! directory, cloud-hypervisor's `--serial socket=` — as an interactive stream:
//! stdin goes to the guest's serial port, what the guest prints comes back on stdout. A terminal
//! (`-t`) is fine here (the console is one). cloud-hypervisor serves one console client at a
//! time, so one session holds a VM's console; another gets 409 until it ends. The session
//! ends when the client leaves, or with `Success` when the console closes (the VM stopped).

use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;

use super::remotecommand::{self, Options, Outcome, Streams};
use super::target::{self, Target};
use super::upgrade::plain;
use super::{ConsoleLock, Requester};
use crate::kubelet_api::state::ApiState;

fn console_path(api: &ApiState, target: &Target) -> PathBuf {
    api.paths
        .vm_run_dir(&target.vm.hypervisor, &target.vm.id)
        .join("console.sock")
}

pub async fn attach(
    State(api): State<Arc<ApiState>>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    req: Request,
) -> Response {
    let opts = match Options::parse(&query, false) {
        Ok(o) => o,
        Err(e) => return plain(StatusCode::BAD_REQUEST, format!("invalid attach request: {e}")),
    };
    let target = match target::resolve(&api, &namespace, &pod, Some(&container)) {
        Ok(t) => t,
        Err(refusal) => return refusal.into_response(),
    };
    if target.vm.hypervisor == crate::hypervisor::Hypervisor::Firecracker {
        return plain(
            StatusCode::BAD_REQUEST,
            format!(
                "VM {} runs on firecracker, whose serial console cocoon writes to the VM's log (no console socket): use kubectl logs -f",
                target.vm.id
            ),
        );
    }
    let console = console_path(&api, &target);
    let Some(lock) = api.streaming.lock_console(&target.vm.id) else {
        return plain(
            StatusCode::CONFLICT,
            format!(
                "the serial console of VM {} is attached by another session (cloud-hypervisor serves one console client at a time); try again when it ends",
                target.vm.id
            ),
        );
    };
    let who = Requester::of(&req, &namespace, &pod);
    let admission = match api
        .streaming
        .admit(api.metrics.streams.with_label_values(&["attach"]), &who)
    {
        Ok(a) => a,
        Err(refusal) => return refusal.into_response(),
    };
    let run_api = api.clone();
    remotecommand::serve(api, req, opts, admission, "attach", move |streams| {
        run(run_api, target, console, lock, streams)
    })
    .await
}

async fn run(api: Arc<ApiState>, target: Target, console: PathBuf, _lock: ConsoleLock, mut streams: Streams) {
    let socket = match UnixStream::connect(&console).await {
        Ok(s) => s,
        Err(e) => {
            let message = format!(
                "error attaching to the serial console of VM {} ({}): {e}",
                target.vm.id,
                console.display()
            );
            streams.finish(&Outcome::Internal(message)).await;
            return;
        }
    };
    let (mut from_guest, mut to_guest) = socket.into_split();
    let closed = streams.closed.clone();
    let mut stdin = streams.stdin.take();
    let typing = async {
        if let Some(stdin) = stdin.as_mut() {
            // The client's stdin ending does not end the attach: the console goes on.
            let _ = tokio::io::copy(stdin, &mut to_guest).await;
            let _ = to_guest.flush().await;
        }
        std::future::pending::<()>().await
    };
    let mut no_stdout = tokio::io::sink();
    let showing = async {
        match streams.stdout.as_mut() {
            Some(out) => tokio::io::copy(&mut from_guest, out).await,
            None => tokio::io::copy(&mut from_guest, &mut no_stdout).await,
        }
    };
    let outcome = tokio::select! {
        r = showing => match r {
            Ok(_) => Outcome::Success,
            Err(e) if closed.is_cancelled() => {
                tracing::debug!(error = %e, "attach: the client left");
                return;
            }
            Err(e) => Outcome::Internal(format!("the serial console of VM {}: {e}", target.vm.id)),
        },
        _ = typing => unreachable!("typing never ends by itself"),
        _ = closed.cancelled() => {
            tracing::info!(vm = %target.vm.id, "attach: the client left; the console is released");
            return;
        }
        _ = api.shutdown.cancelled() => Outcome::Internal("vk-cocoon is shutting down".into()),
    };
    streams.finish(&outcome).await;
}
