//! The routes of the kubelet API and the layers every one of them sits behind
//! (authentication and authorization, request counting).
//!
//! Adding an endpoint: add its route to `endpoints` — the [`auth::guard`] layer and the
//! attribute mapping ([`auth::attributes`]: `/exec`, `/attach`, `/portForward` are
//! `nodes/proxy`) cover it with no further change. The streaming endpoints take GET (WebSocket)
//! and POST (SPDY), as the kubelet's do; the server serves their HTTP/1.1 upgrades.

use std::sync::Arc;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tower_http::catch_panic::CatchPanicLayer;

use super::auth::{self, Auth};
use super::state::{ApiMetrics, ApiState};
use super::streaming::{attach, exec, portforward, supervise};
use super::{logs, resource_metrics, summary};
use crate::stats::families;

async fn healthz() -> &'static str {
    "ok"
}

async fn pods(State(api): State<Arc<ApiState>>) -> Response {
    let list = k8s_openapi::List {
        items: api.pods.pods(),
        metadata: Default::default(),
    };
    axum::Json(list).into_response()
}

async fn stats_summary(State(api): State<Arc<ApiState>>) -> Response {
    let sample = api.sampler.sample().await;
    axum::Json(summary::build(&sample, &api.node_name)).into_response()
}

async fn metrics_resource(State(api): State<Arc<ApiState>>) -> Response {
    let sample = api.sampler.sample().await;
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        families::encode(&resource_metrics::families(&sample)),
    )
        .into_response()
}

async fn not_found(req: Request) -> Response {
    (
        StatusCode::NOT_FOUND,
        format!("404 page not found: {} is not served by vk-cocoon\n", req.uri().path()),
    )
        .into_response()
}

/// The endpoints, without their layers.
fn endpoints() -> Router<Arc<ApiState>> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(pods))
        .route("/stats/summary", get(stats_summary))
        .route("/metrics/resource", get(metrics_resource))
        .route(
            "/containerLogs/{namespace}/{pod}/{container}",
            get(logs::container_logs),
        )
        .route(
            "/exec/{namespace}/{pod}/{container}",
            get(exec::exec).merge(post(exec::exec)),
        )
        .route(
            "/attach/{namespace}/{pod}/{container}",
            get(attach::attach).merge(post(attach::attach)),
        )
        .route(
            "/portForward/{namespace}/{pod}",
            get(portforward::port_forward).merge(post(portforward::port_forward)),
        )
}

async fn count(State(api): State<Arc<ApiState>>, req: Request, next: Next) -> Response {
    let endpoint = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let response = next.run(req).await;
    api.metrics
        .requests
        .with_label_values(&[&endpoint, response.status().as_str()])
        .inc();
    response
}

/// Answers a handler's panic with 500 and counts it: without this layer the panic would end the
/// connection's task, and the client would see its connection reset with no answer.
fn catch_panics(
    metrics: &ApiMetrics,
) -> CatchPanicLayer<impl Fn(Box<dyn std::any::Any + Send + 'static>) -> Response + Clone + use<>> {
    let panics = metrics.panics.with_label_values(&["handler"]);
    CatchPanicLayer::custom(move |panic: Box<dyn std::any::Any + Send + 'static>| {
        panics.inc();
        tracing::error!(
            panic = supervise::panic_message(panic.as_ref()),
            "kubelet API: a handler panicked; answered 500"
        );
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "vk-cocoon: internal error while serving this request (the daemon's log has the details)\n",
        )
            .into_response()
    })
}

/// The whole API: every request — an unknown path too — is authenticated and authorized
/// first, so nothing answers an anonymous caller but 401. A panic anywhere below the count is
/// answered 500 (and counted as a request with that status).
pub fn router(api: Arc<ApiState>, authn: Arc<Auth>) -> Router {
    endpoints()
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(authn, auth::guard))
        .layer(catch_panics(&api.metrics))
        .layer(middleware::from_fn_with_state(api.clone(), count))
        .with_state(api)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use tower::ServiceExt;

    async fn boom() -> &'static str {
        panic!("a handler bug")
    }

    #[tokio::test]
    async fn a_panicking_handler_is_answered_500_and_counted() {
        let metrics = ApiMetrics::unregistered();
        let app: Router = Router::new()
            .route("/boom", get(boom))
            .route("/fine", get(|| async { "ok" }))
            .layer(catch_panics(&metrics));
        let request = |path: &str| Request::builder().uri(path).body(Body::empty()).unwrap();
        let r = app.clone().oneshot(request("/boom")).await.unwrap();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(r.into_body(), 1024).await.unwrap();
        assert!(String::from_utf8_lossy(&body).contains("internal error"));
        assert_eq!(metrics.panics.with_label_values(&["handler"]).get(), 1);
        assert_eq!(app.oneshot(request("/fine")).await.unwrap().status(), StatusCode::OK);
    }
}
