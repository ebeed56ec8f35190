//! The HTTP/1.1 upgrade of a streaming request: which transport the client asks for, the
//! sub-protocol both sides speak (the kubelet's negotiation: the client's first choice this side
//! has), the `101 Switching Protocols` answer, and the upgraded connection handed to a task.

use std::future::Future;

use axum::extract::FromRequestParts;
use axum::extract::Request;
use axum::extract::ws::{WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use hyper_util::rt::TokioIo;
use prometheus::IntCounter;

use super::supervise;
use crate::listener::headers::header_list;

/// The header SPDY clients offer their sub-protocols in (once per protocol).
pub const STREAM_PROTOCOL: &str = "x-stream-protocol-version";

/// Most bytes in one WebSocket message from a client (stdin chunks and tunnelled SPDY frames
/// are far smaller).
const MAX_WS_MESSAGE: usize = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Spdy,
    WebSocket,
}

pub fn plain(status: StatusCode, body: impl Into<String>) -> Response {
    Refusal::new(status, body).into_response()
}

/// A request refused before any upgrade: its status and the reason the client shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
    /// SPDY: the sub-protocols this side speaks (`X-Accepted-Stream-Protocol-Versions`).
    accepted: Vec<&'static str>,
}

impl Refusal {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            accepted: Vec::new(),
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut body = self.message;
        if !body.ends_with('\n') {
            body.push('\n');
        }
        let mut response = (self.status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response();
        for p in self.accepted {
            response
                .headers_mut()
                .append("x-accepted-stream-protocol-versions", HeaderValue::from_static(p));
        }
        response
    }
}

/// The transport the request upgrades to, or the 400 that explains what is missing.
pub fn transport(headers: &HeaderMap, what: &str) -> Result<Transport, Refusal> {
    let upgrade = header_list(headers, "upgrade");
    if upgrade.iter().any(|u| u.eq_ignore_ascii_case("websocket")) {
        return Ok(Transport::WebSocket);
    }
    if upgrade.iter().any(|u| u.eq_ignore_ascii_case("SPDY/3.1")) {
        return Ok(Transport::Spdy);
    }
    Err(Refusal::new(
        StatusCode::BAD_REQUEST,
        format!(
            "{what} streams over an upgraded connection: send `Upgrade: SPDY/3.1` with X-Stream-Protocol-Version, or a WebSocket upgrade (got Upgrade: {upgrade:?})"
        ),
    ))
}

/// The client's first protocol that `ours` has (`Sec-WebSocket-Protocol` or
/// `X-Stream-Protocol-Version`), or the refusal naming both lists.
pub fn negotiate(headers: &HeaderMap, transport: Transport, ours: &[&'static str]) -> Result<String, Refusal> {
    let name = match transport {
        Transport::Spdy => STREAM_PROTOCOL,
        Transport::WebSocket => "sec-websocket-protocol",
    };
    let offered = header_list(headers, name);
    if let Some(p) = offered.iter().find(|p| ours.contains(&p.as_str())) {
        return Ok(p.clone());
    }
    let mut refusal = Refusal::new(
        StatusCode::FORBIDDEN,
        format!(
            "unable to upgrade: unable to negotiate protocol: client supports {offered:?}, server accepts {ours:?}"
        ),
    );
    if transport == Transport::Spdy {
        refusal.accepted = ours.to_vec();
    }
    Err(refusal)
}

/// Answers `101` with `protocol` and runs `serve` on the upgraded connection (a panic in it is
/// caught and counted on `panics`: the connection closes, nothing else goes).
pub fn spdy<F, Fut>(mut req: Request, protocol: String, panics: IntCounter, serve: F) -> Response
where
    F: FnOnce(TokioIo<hyper::upgrade::Upgraded>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let Some(on_upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return plain(
            StatusCode::BAD_REQUEST,
            "this connection cannot be upgraded (HTTP/1.1 is needed for SPDY)",
        );
    };
    let session = async move {
        match on_upgrade.await {
            Ok(upgraded) => serve(TokioIo::new(upgraded)).await,
            Err(error) => tracing::debug!(%error, "kubelet API: the SPDY upgrade did not complete"),
        }
    };
    // What the session held (its connection, its admission) went with the unwinding.
    supervise::spawn("SPDY session", Some(panics), session, || {});
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    let h = response.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
    if let Ok(v) = HeaderValue::from_str(&protocol) {
        h.insert(STREAM_PROTOCOL, v);
    }
    response
}

/// Accepts the WebSocket with `protocol` and runs `serve` on it (a panic in it is caught and
/// counted on `panics`: the connection closes, nothing else goes).
pub async fn websocket<F, Fut>(req: Request, protocol: String, panics: IntCounter, serve: F) -> Response
where
    F: FnOnce(WebSocket) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (mut parts, _body) = req.into_parts();
    let ws = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(ws) => ws,
        Err(rejection) => return rejection.into_response(),
    };
    ws.protocols([protocol])
        .max_message_size(MAX_WS_MESSAGE)
        .max_frame_size(MAX_WS_MESSAGE)
        .on_failed_upgrade(|error| tracing::debug!(%error, "kubelet API: the WebSocket upgrade did not complete"))
        .on_upgrade(move |socket| async move {
            // Unwind safety: the socket and whatever `serve` held are dropped by the unwinding.
            if let Err(panic) = std::panic::AssertUnwindSafe(serve(socket)).catch_unwind().await {
                supervise::report_panic("WebSocket session", &Some(panics), panic.as_ref());
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_clients_first_choice_that_this_side_speaks() {
        let h = headers(&[
            ("upgrade", "SPDY/3.1"),
            (STREAM_PROTOCOL, "v5.channel.k8s.io"),
            (STREAM_PROTOCOL, "v4.channel.k8s.io"),
            (STREAM_PROTOCOL, "v3.channel.k8s.io"),
        ]);
        assert_eq!(transport(&h, "exec").unwrap(), Transport::Spdy);
        assert_eq!(
            negotiate(&h, Transport::Spdy, &["v4.channel.k8s.io", "v5.channel.k8s.io"]).unwrap(),
            "v5.channel.k8s.io"
        );
        let h = headers(&[
            ("upgrade", "websocket"),
            ("sec-websocket-protocol", "base64.channel.k8s.io, v4.channel.k8s.io"),
        ]);
        assert_eq!(transport(&h, "exec").unwrap(), Transport::WebSocket);
        assert_eq!(
            negotiate(&h, Transport::WebSocket, &["v5.channel.k8s.io", "v4.channel.k8s.io"]).unwrap(),
            "v4.channel.k8s.io"
        );
    }

    #[test]
    fn refusals_say_what_was_offered_and_what_is_spoken() {
        let h = headers(&[("upgrade", "SPDY/3.1"), (STREAM_PROTOCOL, "v2.channel.k8s.io")]);
        let r = negotiate(&h, Transport::Spdy, &["v5.channel.k8s.io"])
            .unwrap_err()
            .into_response();
        assert_eq!(r.status(), StatusCode::FORBIDDEN);
        assert_eq!(r.headers()["x-accepted-stream-protocol-versions"], "v5.channel.k8s.io");
        let r = transport(&headers(&[]), "exec").unwrap_err();
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
    }
}
