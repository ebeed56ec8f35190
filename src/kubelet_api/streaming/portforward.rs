//! `/portForward/{namespace}/{pod}`: TCP to the guest. The client opens two SPDY streams per
//! forwarded connection — `data` and `error`, tied by their `requestid` and naming the `port` —
//! and may open many over one session; each pair becomes a TCP connection to the guest's IP and
//! port, bytes both ways, half-closes passed on. A connection that fails is reported on its
//! error stream with the kubelet's wording; a pair that is not completed within the stream
//! creation timeout is reset. Over WebSockets the same SPDY session rides the
//! `SPDY/3.1+portforward.k8s.io` tunnel (what kubectl and a 1.36 apiserver use).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::Admission;
use super::spdy::codec::frame::rst;
use super::spdy::{self, Stream};
use super::target::{self, Target};
use super::upgrade::{self, Transport, plain};
use super::websocket::{SPDY_TUNNEL, Tunnel};
use crate::kubelet_api::state::ApiState;

/// The SPDY sub-protocol of port-forward.
pub const PROTOCOL: &str = "portforward.k8s.io";
/// How long a connection to the guest may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

pub async fn port_forward(
    State(api): State<Arc<ApiState>>,
    Path((namespace, pod)): Path<(String, String)>,
    req: Request,
) -> Response {
    let target = match target::resolve(&api, &namespace, &pod, None) {
        Ok(t) => t,
        Err(refusal) => return refusal.into_response(),
    };
    let Some(ip) = target.guest_ip() else {
        return plain(
            StatusCode::CONFLICT,
            format!(
                "pod {namespace}/{pod}: VM {} has no IP address yet (its lease may still be pending)",
                target.vm.id
            ),
        );
    };
    if let Some(scope) = &api.streaming.guests
        && !(scope.contains)(ip)
    {
        return plain(
            StatusCode::FORBIDDEN,
            format!(
                "pod {namespace}/{pod}: its address {ip} is outside {}; vk-cocoon does not connect there",
                scope.description
            ),
        );
    }
    let transport = match upgrade::transport(req.headers(), "port-forward") {
        Ok(t) => t,
        Err(refusal) => return refusal.into_response(),
    };
    let ours: &[&'static str] = match transport {
        Transport::Spdy => &[PROTOCOL],
        Transport::WebSocket => &[SPDY_TUNNEL],
    };
    let protocol = match upgrade::negotiate(req.headers(), transport, ours) {
        Ok(p) => p,
        Err(refusal) => return refusal.into_response(),
    };
    let admission = match api
        .streaming
        .admit(api.metrics.streams.with_label_values(&["portforward"]))
    {
        Ok(a) => a,
        Err(refusal) => return refusal.into_response(),
    };
    tracing::debug!(endpoint = %"portforward", ?transport, %protocol, "streaming: upgrading");
    let forwarder = Forwarder {
        api,
        target,
        ip,
        _admission: admission,
    };
    match transport {
        Transport::Spdy => upgrade::spdy(req, protocol, move |io| forwarder.serve(io)),
        Transport::WebSocket => {
            upgrade::websocket(req, protocol, move |socket| forwarder.serve(Tunnel::new(socket))).await
        }
    }
}

/// The two streams of one forwarded connection, as they arrive.
#[derive(Default)]
struct Pair {
    data: Option<Stream>,
    error: Option<Stream>,
    since: Option<Instant>,
}

struct Forwarder {
    api: Arc<ApiState>,
    target: Target,
    ip: IpAddr,
    _admission: Admission,
}

/// The pair a stream belongs to: its `requestid`, or — for clients too old to send one — the
/// kubelet's guess from the stream ids (an error stream and the data stream 2 after it).
fn request_id(stream: &Stream) -> String {
    match stream.headers.get("requestid") {
        Some(id) if !id.is_empty() => id.to_string(),
        _ if stream.stream_type() == Some("data") => format!("#{}", stream.id.saturating_sub(2)),
        _ => format!("#{}", stream.id),
    }
}

impl Forwarder {
    async fn serve<IO>(self, io: IO)
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        let config = self.api.streaming.config.clone();
        let (session, mut incoming) = spdy::serve(
            io,
            spdy::SessionConfig {
                idle_timeout: config.idle_timeout,
                max_streams: 2 * config.max_forwarded_connections,
                ..Default::default()
            },
        );
        let me = Arc::new(self);
        let mut pending: HashMap<String, Pair> = HashMap::new();
        let mut connections = JoinSet::new();
        loop {
            let expiry = pending
                .values()
                .filter_map(|p| p.since)
                .min()
                .map(|t| t + config.creation_timeout);
            tokio::select! {
                stream = incoming.recv() => {
                    let Some(stream) = stream else { break };
                    if let Some((data, error)) = me.pair_up(&session, &mut pending, stream) {
                        connections.spawn(me.clone().forward(data, error));
                    }
                }
                _ = async { tokio::time::sleep_until(expiry.unwrap_or_else(Instant::now)).await }, if expiry.is_some() => {
                    let now = Instant::now();
                    pending.retain(|id, p| {
                        let expired = p.since.is_some_and(|t| t + config.creation_timeout <= now);
                        if expired {
                            tracing::warn!(requestid = %id, "port-forward: the client did not open both streams of a connection in time; resetting it");
                            for s in [&p.data, &p.error].into_iter().flatten() {
                                session.reset(s.id, rst::CANCEL);
                            }
                        }
                        !expired
                    });
                }
                Some(_) = connections.join_next() => {}
                _ = me.api.shutdown.cancelled() => break,
            }
        }
        // The session is over: no forwarded connection outlives it.
        connections.abort_all();
        session.shutdown(Duration::from_secs(5)).await;
    }

    fn pair_up(
        &self,
        session: &spdy::Session,
        pending: &mut HashMap<String, Pair>,
        stream: Stream,
    ) -> Option<(Stream, Stream)> {
        let id = request_id(&stream);
        let pair = pending.entry(id.clone()).or_default();
        pair.since.get_or_insert_with(Instant::now);
        let slot = match stream.stream_type() {
            Some("data") => &mut pair.data,
            Some("error") => &mut pair.error,
            other => {
                tracing::warn!(stream = stream.id, streamtype = ?other, "port-forward: a stream that is neither data nor error; resetting it");
                session.reset(stream.id, rst::PROTOCOL_ERROR);
                return None;
            }
        };
        if slot.is_some() {
            tracing::warn!(stream = stream.id, requestid = %id, "port-forward: a second stream of the same type for one connection; resetting it");
            session.reset(stream.id, rst::PROTOCOL_ERROR);
            return None;
        }
        *slot = Some(stream);
        if pair.data.is_some() && pair.error.is_some() {
            let pair = pending.remove(&id)?;
            return Some((pair.data?, pair.error?));
        }
        None
    }

    async fn forward(self: Arc<Self>, data: Stream, mut error: Stream) {
        let port_header = data.headers.get("port").unwrap_or_default().to_string();
        let port = match port_header.parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                let msg = format!("error parsing port {port_header:?}: a port must be 1 to 65535");
                return self.fail(data, error, msg).await;
            }
        };
        let addr = SocketAddr::new(self.ip, port);
        let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(e)) => {
                let msg = self.error_text(port, &format!("failed to connect to {addr} inside the VM: {e}"));
                return self.fail(data, error, msg).await;
            }
            Err(_) => {
                let msg = self.error_text(
                    port,
                    &format!("failed to connect to {addr} inside the VM: no answer in {CONNECT_TIMEOUT:?}"),
                );
                return self.fail(data, error, msg).await;
            }
        };
        let _ = tcp.set_nodelay(true);
        tracing::debug!(%addr, "port-forward: connected");
        let (mut from_guest, mut to_guest) = tcp.into_split();
        let Stream {
            reader: mut from_client,
            writer: mut to_client,
            ..
        } = data;
        let up = async {
            let r = tokio::io::copy(&mut from_client, &mut to_guest).await;
            let _ = to_guest.shutdown().await;
            r
        };
        let down = async {
            let r = tokio::io::copy(&mut from_guest, &mut to_client).await;
            let _ = to_client.shutdown().await;
            r
        };
        tokio::pin!(up, down);
        // Half-closes travel on; a broken direction (a reset, an error) ends both.
        tokio::select! {
            r = &mut up => if r.is_ok() { let _ = down.await; },
            r = &mut down => if r.is_ok() { let _ = up.await; },
        }
        let _ = error.writer.shutdown().await;
    }

    /// The kubelet's wording, so kubectl's message reads the same.
    fn error_text(&self, port: u16, problem: &str) -> String {
        format!(
            "error forwarding port {port} to pod {}/{}, uid {}: {problem}",
            self.target.namespace, self.target.pod, self.target.uid
        )
    }

    async fn fail(&self, data: Stream, mut error: Stream, message: String) {
        tracing::info!(%message, "port-forward: connection failed");
        let _ = error.writer.write_all(message.as_bytes()).await;
        let _ = error.writer.shutdown().await;
        let mut data = data;
        let _ = data.writer.shutdown().await;
    }
}
