//! The HTTP surface: URL routing, list/watch/get/create/update/patch/delete, watch streaming.

use crate::error::ApiError;
use crate::resource::{CORE_EVENTS, EVENTS_V1, ResourceType};
use crate::selector::{FieldSelector, Filter, LabelSelector};
use crate::store::{Broadcast, Change, ChangeKind, DeleteOptions, PatchKind, Store, Target};
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    pub query: String,
    pub status: u16,
}

impl RequestRecord {
    /// Whether this was a watch request.
    pub fn is_watch(&self) -> bool {
        self.query.split('&').any(|p| p == "watch=true" || p == "watch=1")
    }
}

/// An injected failure: the next `times` requests matching `method` and `path_contains` fail with `status`.
#[derive(Debug, Clone)]
pub struct Fault {
    pub method: Option<Method>,
    pub path_contains: String,
    pub status: u16,
    pub times: usize,
}

/// State shared by every incarnation of the server.
pub(crate) struct Shared {
    pub store: Arc<Store>,
    pub requests: Mutex<Vec<RequestRecord>>,
    pub faults: Mutex<Vec<Fault>>,
}

#[derive(Clone)]
pub(crate) struct AppState {
    pub shared: Arc<Shared>,
    /// Cancelled when this incarnation stops: ends every open watch.
    pub shutdown: CancellationToken,
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn error_response(err: &ApiError) -> Response {
    json_response(
        StatusCode::from_u16(err.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &err.to_status(),
    )
}

/// Where a request points.
struct Route {
    rt: ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    target: Target,
}

fn route(path: &str) -> Result<Route, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::no_such_resource()),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, tail @ ..] if !tail.is_empty() => (Some(ns.to_string()), tail),
        other => (None, other),
    };
    let (plural, name, target) = match rest {
        [plural] => (*plural, None, Target::Main),
        [plural, name] => (*plural, Some(name.to_string()), Target::Main),
        [plural, name, "status"] => (*plural, Some(name.to_string()), Target::Status),
        _ => return Err(ApiError::no_such_resource()),
    };
    let rt = ResourceType::lookup(group, version, plural).ok_or_else(ApiError::no_such_resource)?;
    if !rt.namespaced && namespace.is_some() {
        return Err(ApiError::no_such_resource());
    }
    if rt.namespaced && name.is_some() && namespace.is_none() {
        return Err(ApiError::no_such_resource());
    }
    Ok(Route {
        rt,
        namespace,
        name,
        target,
    })
}

fn take_fault(shared: &Shared, method: &Method, path: &str) -> Option<u16> {
    let mut faults = shared.faults.lock().unwrap_or_else(|p| p.into_inner());
    let idx = faults.iter().position(|f| {
        f.times > 0 && f.method.as_ref().is_none_or(|m| m == method) && path.contains(&f.path_contains)
    })?;
    faults[idx].times -= 1;
    let status = faults[idx].status;
    if faults[idx].times == 0 {
        faults.remove(idx);
    }
    Some(status)
}

/// The single handler behind the router's fallback.
pub(crate) async fn handle(
    State(app): State<AppState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let query = uri.query().unwrap_or("").to_string();
    let response = match take_fault(&app.shared, &method, &path) {
        Some(code) => error_response(&ApiError::injected(code)),
        None => dispatch(&app, &method, &uri, &headers, &body)
            .await
            .unwrap_or_else(|e| error_response(&e)),
    };
    tracing::debug!(%method, %path, %query, status = response.status().as_u16(), "fake apiserver request");
    app.shared
        .requests
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(RequestRecord {
            method: method.to_string(),
            path,
            query,
            status: response.status().as_u16(),
        });
    response
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

async fn dispatch(
    app: &AppState,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, ApiError> {
    if let Some(review) = crate::review::answer(method, uri.path(), body) {
        return Ok(json_response(StatusCode::CREATED, &review?));
    }
    let route = route(uri.path())?;
    let params: HashMap<String, String> = Query::try_from_uri(uri).map(|Query(q)| q).unwrap_or_default();
    let store = &app.shared.store;
    let ns = route.namespace.as_deref();
    let rt = route.rt;
    // core/v1 Events are a read-only view of the stored events.k8s.io/v1 ones.
    let view = View::of(rt);
    if view.converts() && method != Method::GET {
        return Err(ApiError::method_not_allowed(format!(
            "{method} of core/v1 Events: the fake apiserver stores Events as events.k8s.io/v1 and serves core/v1 Events read-only; write events.k8s.io/v1"
        )));
    }
    match (&route.name, method) {
        (None, &Method::GET) => {
            let filter = Filter {
                namespace: route.namespace.clone(),
                fields: FieldSelector::parse(rt, params.get("fieldSelector").map(String::as_str).unwrap_or(""))?,
                labels: LabelSelector::parse(params.get("labelSelector").map(String::as_str).unwrap_or(""))?,
            };
            if matches!(params.get("watch").map(String::as_str), Some("true" | "1")) {
                return watch(app, view, filter, &params);
            }
            // `limit`/`continue` are ignored: the whole list comes in one page, as the real
            // apiserver does when serving resourceVersion=0 from its watch cache.
            let (items, rv) = store.list(view.stored, &filter);
            let items: Vec<Value> = items.iter().map(|o| view.show(o)).collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({
                    "apiVersion": rt.api_version(),
                    "kind": format!("{}List", rt.kind),
                    "metadata": {"resourceVersion": rv.to_string()},
                    "items": items,
                }),
            ))
        }
        (None, &Method::POST) => {
            let created = store.create(rt, ns, parse_json(body)?)?;
            Ok(json_response(StatusCode::CREATED, &created))
        }
        (Some(name), &Method::GET) => {
            let obj = store.get(view.stored, ns, name)?;
            Ok(json_response(StatusCode::OK, &view.show(&obj)))
        }
        (Some(name), &Method::PUT) => {
            let obj = store.update(rt, ns, name, route.target, parse_json(body)?)?;
            Ok(json_response(StatusCode::OK, &obj))
        }
        (Some(name), &Method::PATCH) => {
            let content_type = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            let kind = match content_type.split(';').next().unwrap_or("").trim() {
                "application/json-patch+json" => PatchKind::Json,
                "application/merge-patch+json" => PatchKind::Merge,
                "application/strategic-merge-patch+json" => PatchKind::Strategic,
                other => return Err(ApiError::unsupported_media_type(other)),
            };
            let obj = store.patch(rt, ns, name, route.target, kind, parse_json(body)?)?;
            Ok(json_response(StatusCode::OK, &obj))
        }
        (Some(name), &Method::DELETE) if route.target == Target::Main => {
            let opts = DeleteOptions::from_body(body)?;
            let obj = store.delete(rt, ns, name, &opts)?;
            Ok(json_response(StatusCode::OK, &obj))
        }
        _ => Err(ApiError::method_not_allowed(format!(
            "{method} is not supported on {}",
            uri.path()
        ))),
    }
}

/// What a request for a resource type reads from the store, and how objects are shown.
#[derive(Clone, Copy)]
struct View {
    /// The type the client asked for.
    served: ResourceType,
    /// The type stored.
    stored: ResourceType,
}

impl View {
    fn of(rt: ResourceType) -> View {
        let stored = if rt == CORE_EVENTS { EVENTS_V1 } else { rt };
        View { served: rt, stored }
    }

    fn converts(&self) -> bool {
        self.served != self.stored
    }

    fn show(&self, obj: &Value) -> Value {
        if self.converts() {
            crate::events::to_core(obj)
        } else {
            obj.clone()
        }
    }
}

struct WatchStream {
    view: View,
    filter: Filter,
    initial: VecDeque<Arc<Change>>,
    live: broadcast::Receiver<Broadcast>,
    last_rv: u64,
    bookmarks: bool,
    initial_events_end: Option<u64>,
    error: Option<ApiError>,
    deadline: tokio::time::Instant,
    shutdown: CancellationToken,
    done: bool,
}

fn line(kind: &str, object: &Value) -> Bytes {
    let mut s = json!({"type": kind, "object": object}).to_string();
    s.push('\n');
    Bytes::from(s)
}

impl WatchStream {
    /// The watch event a change becomes for this watcher, honouring selector transitions
    /// (an object leaving the selection is a DELETED, one entering it an ADDED).
    fn render(&self, change: &Change) -> Option<Bytes> {
        if change.resource != self.view.stored {
            return None;
        }
        let now = self.filter.matches(&change.object);
        let before = change.previous.as_ref().is_some_and(|p| self.filter.matches(p));
        let kind = match change.kind {
            ChangeKind::Added => now.then_some("ADDED"),
            ChangeKind::Deleted => (now || before).then_some("DELETED"),
            ChangeKind::Modified => match (before, now) {
                (true, true) => Some("MODIFIED"),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            },
        }?;
        Some(line(kind, &self.view.show(&change.object)))
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        line(
            "BOOKMARK",
            &json!({"kind": self.view.served.kind, "apiVersion": self.view.served.api_version(), "metadata": meta}),
        )
    }

    async fn next_line(&mut self) -> Option<Bytes> {
        loop {
            if self.done {
                return None;
            }
            if let Some(err) = self.error.take() {
                self.done = true;
                return Some(line("ERROR", &err.to_status()));
            }
            if let Some(change) = self.initial.pop_front() {
                match self.render(&change) {
                    Some(l) => return Some(l),
                    None => continue,
                }
            }
            if let Some(rv) = self.initial_events_end.take() {
                return Some(self.bookmark(rv, true));
            }
            let msg = tokio::select! {
                _ = self.shutdown.cancelled() => return None,
                _ = tokio::time::sleep_until(self.deadline) => return None,
                msg = self.live.recv() => msg,
            };
            match msg {
                Ok(Broadcast::Change(change)) => {
                    if change.rv <= self.last_rv {
                        continue;
                    }
                    self.last_rv = change.rv;
                    if let Some(l) = self.render(&change) {
                        return Some(l);
                    }
                }
                Ok(Broadcast::Bookmark(rv)) => {
                    if self.bookmarks && rv >= self.last_rv {
                        self.last_rv = rv;
                        return Some(self.bookmark(rv, false));
                    }
                }
                // A watcher too slow for the channel is closed; it resumes from its last resourceVersion.
                Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

fn watch(app: &AppState, view: View, filter: Filter, params: &HashMap<String, String>) -> Result<Response, ApiError> {
    let since = match params.get("resourceVersion").map(String::as_str) {
        None | Some("") => None,
        Some(s) => Some(
            s.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {s:?}: must be an integer")))?,
        ),
    };
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(1800);
    let bookmarks = params.get("allowWatchBookmarks").is_some_and(|v| v == "true");
    let send_initial = params.get("sendInitialEvents").is_some_and(|v| v == "true");
    // sendInitialEvents=true: the initial state as ADDED events, then a bookmark marking its end.
    let since_for_store = if send_initial { None } else { since };
    let (initial, initial_rv, live, error) = match app.shared.store.watch(view.stored, &filter, since_for_store) {
        Ok(start) => (start.initial.into(), start.initial_rv, start.live, None),
        Err(err) => (VecDeque::new(), 0, app.shared.store_subscribe(), Some(err)),
    };
    let stream = WatchStream {
        view,
        filter,
        initial,
        live,
        last_rv: initial_rv,
        bookmarks,
        initial_events_end: send_initial.then_some(initial_rv),
        error,
        deadline: tokio::time::Instant::now() + Duration::from_secs(timeout),
        shutdown: app.shutdown.clone(),
        done: false,
    };
    let body = futures::stream::unfold(stream, |mut s| async move {
        s.next_line().await.map(|l| (Ok::<_, std::io::Error>(l), s))
    });
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(body),
    )
        .into_response())
}

impl Shared {
    fn store_subscribe(&self) -> broadcast::Receiver<Broadcast> {
        self.store.subscribe()
    }
}
