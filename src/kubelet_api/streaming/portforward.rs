//! `/portForward/{namespace}/{pod}`: TCP to the guest. The client opens two SPDY streams per
//! forwarded connection — `data` and `error`, tied by their `requestid` and naming the `port` —
//! and may open many over one session; each pair becomes a TCP connection to the guest's IP and
//! port, bytes both ways, half-closes passed on. A connection that fails is reported on its
//! error stream with the kubelet's wording; a pair that is not completed within the stream
//! creation timeout is reset. Over WebSockets the same SPDY session rides the
//! `SPDY/3.1+portforward.k8s.io` tunnel (what kubectl and a 1.36 apiserver use) — or the
//! client speaks the kubelet's channel protocol (`v4.channel.k8s.io`, `v4.base64.channel.k8s.io`
//! or no sub-protocol, as the official Python, Java and JavaScript clients do): the ports come
//! in the `port` query (the apiserver's `?ports=` becomes `?port=` on its way to the node),
//! one connection to the guest per port, and the WebSocket closes once every one has ended.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use super::pairing::Pairing;
use super::spdy::{self, Stream};
use super::target::{self, Target};
use super::upgrade::{self, Transport, plain};
use super::websocket::{Framing, PortChannels, PortStreams, SPDY_TUNNEL, Tunnel, V4, V4_BASE64};
use super::{Admission, Requester, supervise};
use crate::kubelet_api::source::GuestAddress;
use crate::kubelet_api::state::ApiState;

/// The SPDY sub-protocol of port-forward.
pub const PROTOCOL: &str = "portforward.k8s.io";
/// How long a connection to the guest may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How a WebSocket client forwards: the channel protocol (with its framing and the ports it
/// asked for) or a SPDY session (over SPDY itself, or tunnelled in the WebSocket).
enum WsMode {
    Channels(Framing, Vec<u16>),
    Tunnel,
}

/// The ports of a channel-protocol request: the `port` query, repeated or comma-separated
/// (the kubelet's rule: each 1 to 65535, at least one), at most [`PortChannels::MAX_PORTS`].
pub fn query_ports(query: &[(String, String)]) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for (key, value) in query.iter().filter(|(k, _)| k == "port") {
        if value.is_empty() {
            return Err(format!("query parameter {key:?} cannot be empty"));
        }
        for p in value.split(',') {
            match p.parse::<u16>() {
                Ok(port) if port > 0 => ports.push(port),
                _ => return Err(format!("unable to parse {p:?} as a port: a port must be 1 to 65535")),
            }
        }
    }
    if ports.is_empty() {
        return Err("query parameter \"port\" is required (the ports to forward, e.g. ?port=8080,9090)".into());
    }
    if ports.len() > PortChannels::MAX_PORTS {
        return Err(format!(
            "{} ports asked for; one connection forwards at most {}",
            ports.len(),
            PortChannels::MAX_PORTS
        ));
    }
    Ok(ports)
}

pub async fn port_forward(
    State(api): State<Arc<ApiState>>,
    Path((namespace, pod)): Path<(String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    req: Request,
) -> Response {
    let target = match target::resolve(&api, &namespace, &pod, None) {
        Ok(t) => t,
        Err(refusal) => return refusal.into_response(),
    };
    // The provider hands out only an address the node may connect to: the pod's own guest's,
    // inside the guest networks.
    let ip = match &target.vm.address {
        GuestAddress::Ip(ip) => *ip,
        GuestAddress::Pending(why) => {
            return plain(
                StatusCode::CONFLICT,
                format!(
                    "pod {namespace}/{pod}: VM {} has no IP address yet ({why})",
                    target.vm.id
                ),
            );
        }
        GuestAddress::Refused(why) => {
            return plain(
                StatusCode::FORBIDDEN,
                format!("pod {namespace}/{pod}: {why}; vk-cocoon does not connect there"),
            );
        }
    };
    let transport = match upgrade::transport(req.headers(), "port-forward") {
        Ok(t) => t,
        Err(refusal) => return refusal.into_response(),
    };
    let ours: &[&'static str] = match transport {
        Transport::Spdy => &[PROTOCOL],
        Transport::WebSocket => &[V4, V4_BASE64, SPDY_TUNNEL],
    };
    // A WebSocket client that names no sub-protocol gets the binary channel protocol, as on
    // a kubelet.
    let unnamed = transport == Transport::WebSocket && !req.headers().contains_key(header::SEC_WEBSOCKET_PROTOCOL);
    let protocol = if unnamed {
        String::new()
    } else {
        match upgrade::negotiate(req.headers(), transport, ours) {
            Ok(p) => p,
            Err(refusal) => return refusal.into_response(),
        }
    };
    // Only a channel-protocol client names its ports in the query; a SPDY session (direct or
    // tunnelled) names them per stream.
    let mode = match (transport, protocol.as_str()) {
        (Transport::Spdy, _) | (_, SPDY_TUNNEL) => WsMode::Tunnel,
        (Transport::WebSocket, p) => match query_ports(&query) {
            Ok(ports) => WsMode::Channels(
                if p == V4_BASE64 {
                    Framing::Base64
                } else {
                    Framing::Binary
                },
                ports,
            ),
            Err(e) => return plain(StatusCode::BAD_REQUEST, format!("invalid port-forward request: {e}")),
        },
    };
    let who = Requester::of(&req, &namespace, &pod);
    let admission = match api
        .streaming
        .admit(api.metrics.streams.with_label_values(&["portforward"]), &who)
    {
        Ok(a) => a,
        Err(refusal) => return refusal.into_response(),
    };
    tracing::debug!(endpoint = %"portforward", ?transport, %protocol, "streaming: upgrading");
    let panics = api.metrics.session_panics();
    let forwarder = Forwarder {
        api,
        target,
        ip,
        panics: Some(panics.clone()),
        _admission: admission,
    };
    match transport {
        Transport::Spdy => upgrade::spdy(req, protocol, panics, move |io| forwarder.serve(io)),
        Transport::WebSocket => {
            upgrade::websocket(req, protocol, panics, move |socket| async move {
                match mode {
                    WsMode::Tunnel => forwarder.serve(Tunnel::new(socket)).await,
                    WsMode::Channels(framing, ports) => forwarder.serve_channels(socket, framing, ports).await,
                }
            })
            .await
        }
    }
}

struct Forwarder {
    api: Arc<ApiState>,
    target: Target,
    ip: IpAddr,
    /// Counts a panic of the session's tasks or of one connection's.
    panics: Option<IntCounter>,
    _admission: Admission,
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
                panics: self.panics.clone(),
                ..Default::default()
            },
        );
        let me = Arc::new(self);
        let mut pairing = Pairing::new(config.max_forwarded_connections, config.creation_timeout);
        let mut connections = JoinSet::new();
        loop {
            tokio::select! {
                stream = incoming.recv() => {
                    let Some(stream) = stream else { break };
                    if let Some((data, error)) = pairing.place(&session, stream) {
                        connections.spawn(me.clone().forward(data, error));
                    }
                }
                _ = pairing.expire_next(&session) => {}
                Some(joined) = connections.join_next() => {
                    if let Err(e) = joined && e.is_panic() {
                        supervise::report_panic("port-forward connection", &me.panics, e.into_panic().as_ref());
                    }
                }
                _ = me.api.shutdown.cancelled() => break,
            }
        }
        // The session is over: no forwarded connection outlives it.
        connections.abort_all();
        session.shutdown(Duration::from_secs(5)).await;
    }

    /// The channel protocol: one connection to the guest per port asked for, all at once; the
    /// WebSocket closes once every one has ended (or the client has gone).
    async fn serve_channels(self, socket: axum::extract::ws::WebSocket, framing: Framing, ports: Vec<u16>) {
        let config = self.api.streaming.config.clone();
        let mut channels = PortChannels::start(socket, framing, &ports, config.idle_timeout, self.panics.clone()).await;
        let closed = channels.closed.clone();
        let me = Arc::new(self);
        let mut forwards = JoinSet::new();
        for port in channels.ports.drain(..) {
            forwards.spawn(me.clone().forward_port(port));
        }
        loop {
            tokio::select! {
                joined = forwards.join_next() => match joined {
                    None => break,
                    Some(Err(e)) if e.is_panic() => {
                        supervise::report_panic("port-forward connection", &me.panics, e.into_panic().as_ref());
                    }
                    Some(_) => {}
                },
                _ = closed.cancelled() => break,
                _ = me.api.shutdown.cancelled() => break,
            }
        }
        // The connection is over: no forwarded connection outlives it.
        forwards.abort_all();
        channels.close(Duration::from_secs(5)).await;
    }

    /// One port of a channel-protocol connection: bytes both ways until the guest is done
    /// (the client cannot half-close a channel; its end is the connection's).
    async fn forward_port(self: Arc<Self>, streams: PortStreams) {
        let PortStreams {
            port,
            mut from_client,
            mut to_client,
            mut error,
        } = streams;
        let tcp = match self.connect(port).await {
            Ok(tcp) => tcp,
            Err(message) => {
                tracing::info!(%message, "port-forward: connection failed");
                let _ = error.write_all(message.as_bytes()).await;
                return;
            }
        };
        let (mut from_guest, mut to_guest) = tcp.into_split();
        let up = async {
            let r = tokio::io::copy(&mut from_client, &mut to_guest).await;
            let _ = to_guest.shutdown().await;
            r
        };
        let down = tokio::io::copy(&mut from_guest, &mut to_client);
        tokio::pin!(up, down);
        tokio::select! {
            _ = &mut down => {}
            r = &mut up => if r.is_ok() { let _ = down.await; },
        }
    }

    /// A connection to the guest's `port`, or the message that says why there is none.
    async fn connect(&self, port: u16) -> Result<TcpStream, String> {
        let addr = SocketAddr::new(self.ip, port);
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
            Ok(Ok(tcp)) => {
                let _ = tcp.set_nodelay(true);
                tracing::debug!(%addr, "port-forward: connected");
                Ok(tcp)
            }
            Ok(Err(e)) => Err(self.error_text(port, &format!("failed to connect to {addr} inside the VM: {e}"))),
            Err(_) => Err(self.error_text(
                port,
                &format!("failed to connect to {addr} inside the VM: no answer in {CONNECT_TIMEOUT:?}"),
            )),
        }
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
        let tcp = match self.connect(port).await {
            Ok(tcp) => tcp,
            Err(msg) => return self.fail(data, error, msg).await,
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn ports_as_the_kubelet_reads_them() {
        assert_eq!(query_ports(&q(&[("port", "80")])).unwrap(), [80]);
        assert_eq!(
            query_ports(&q(&[("port", "80,443"), ("port", "8080")])).unwrap(),
            [80, 443, 8080]
        );
        for bad in ["", "0", "65536", "80,", "http", "-1"] {
            assert!(query_ports(&q(&[("port", bad)])).is_err(), "{bad:?}");
        }
        assert!(
            query_ports(&q(&[("ports", "80")]))
                .unwrap_err()
                .contains("\"port\" is required")
        );
        let many = (1..=129).map(|p| p.to_string()).collect::<Vec<_>>().join(",");
        assert!(query_ports(&q(&[("port", &many)])).unwrap_err().contains("at most 128"));
    }
}
