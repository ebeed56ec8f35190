//! `GET /containerLogs/{namespace}/{pod}/{container}`: the VM's hypervisor log, with the
//! kubelet's `tailLines`, `limitBytes`, `timestamps`, `sinceSeconds`/`sinceTime` and `follow`.
//! A snapshot of the log comes from `cocoon vm logs --tail N`; `follow` streams the
//! hypervisor's log file itself (the file `cocoon vm logs` reads), from the tail on.

pub mod follow;
pub mod lines;
pub mod query;

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};

use super::source::PodVm;
use super::state::ApiState;
use lines::Emitter;
use query::LogQuery;

/// What `kubectl logs` shows for a pod without a VM (hibernated, still creating).
pub const NO_VM: &str = "vk-cocoon: pod has no live VM\n";

fn plain(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

fn vmm_start(api: &ApiState, vm: &PodVm) -> Option<DateTime<Utc>> {
    crate::stats::sample::process_start(&api.paths, vm.pid).map(DateTime::<Utc>::from)
}

struct FollowGuard(prometheus::IntGauge);
impl Drop for FollowGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

pub async fn container_logs(
    State(api): State<Arc<ApiState>>,
    Path((namespace, pod_name, container)): Path<(String, String, String)>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let q = match LogQuery::parse(&params) {
        Ok(q) => q,
        Err(e) => return plain(StatusCode::BAD_REQUEST, format!("invalid log query: {e}\n")),
    };
    let Some((pod, vm)) = api.pods.pod(&namespace, &pod_name) else {
        return plain(
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{pod_name} does not exist on node {}\n", api.node_name),
        );
    };
    let containers: Vec<String> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(s.containers.iter()))
        .map(|c| c.name.clone())
        .collect();
    if !containers.contains(&container) {
        return plain(
            StatusCode::NOT_FOUND,
            format!(
                "container {container:?} is not in pod {namespace}/{pod_name} (containers: {})\n",
                containers.join(", ")
            ),
        );
    }
    if q.previous {
        return plain(
            StatusCode::BAD_REQUEST,
            format!(
                "previous terminated container {container:?} in pod {pod_name:?} not found: a VM keeps one log across restarts\n"
            ),
        );
    }
    let Some(vm) = vm else {
        return plain(StatusCode::OK, NO_VM);
    };
    let now = Utc::now();
    let mut emitter = Emitter::new(
        q.since.map(|s| s.resolve(now)),
        q.timestamps,
        q.limit_bytes,
        vmm_start(&api, &vm),
    );
    if q.follow {
        return follow_response(api, namespace, pod_name, vm, q, emitter).await;
    }
    // `cocoon vm logs` stdout is bounded by the runtime client (its last part is kept).
    match api.runtime.logs(&vm.id, q.tail_lines).await {
        Ok(text) => {
            // Rendering is linear but may be megabytes of lines: on the blocking pool, so the
            // async workers go on serving everything else.
            let rendered = tokio::task::spawn_blocking(move || emitter.all(&text, now)).await;
            match rendered {
                Ok(body) => (
                    StatusCode::OK,
                    [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                    body,
                )
                    .into_response(),
                Err(e) => plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("rendering the log of VM {}: {e}\n", vm.id),
                ),
            }
        }
        Err(e) if e.is_vm_not_found() => plain(StatusCode::OK, NO_VM),
        Err(e) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading the log of VM {}: {e}\n", vm.id),
        ),
    }
}

async fn follow_response(
    api: Arc<ApiState>,
    namespace: String,
    pod_name: String,
    vm: PodVm,
    q: LogQuery,
    emitter: Emitter,
) -> Response {
    let path = api.paths.vm_log_file(&vm.hypervisor, &vm.id);
    // Finding the tail reads the file (linearly, backwards): on the blocking pool.
    let (opened, path) = {
        let tail = q.tail_lines;
        match tokio::task::spawn_blocking(move || (follow::open(&path, tail), path)).await {
            Ok(r) => r,
            Err(e) => {
                return plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("opening the log of VM {}: {e}\n", vm.id),
                );
            }
        }
    };
    let start = match opened {
        Ok(start) => start,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return plain(
                StatusCode::BAD_REQUEST,
                format!("open log {}: VM may not have been started yet\n", path.display()),
            );
        }
        Err(e) => {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("open log {}: {e}\n", path.display()),
            );
        }
    };
    api.metrics.log_follows.inc();
    let guard = FollowGuard(api.metrics.log_follows.clone());
    let pods = api.pods.clone();
    let vm_id = vm.id.clone();
    let stream = start(follow::FollowArgs {
        emitter,
        still_running: Box::new(
            move || matches!(pods.pod(&namespace, &pod_name), Some((_, Some(v))) if v.id == vm_id && v.pid > 0),
        ),
        shutdown: api.shutdown.clone(),
        guard: Box::new(guard),
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        Body::from_stream(stream),
    )
        .into_response()
}
