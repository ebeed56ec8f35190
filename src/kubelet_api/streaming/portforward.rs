//! `/portForward/{namespace}/{pod}`: TCP to the guest. The client opens two SPDY streams per
//! forwarded connection — `data` and `error`, tied by their `requestid` and naming the `port` —
//! and may open many over one session; each pair becomes a TCP connection to the guest's IP and
//! port, bytes both ways, half-closes passed on. A connection that fails is reported on its
//! error stream with the kubelet's wording; a pair that is not completed within the stream
//! creation timeout is reset. Over WebSockets the same SPDY session rides the
//! `SPDY/3.1+portforward.k8s.io` tunnel (what kubectl and a 1.36 apiserver use).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use prometheus::IntCounter;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

use super::pairing::Pairing;
use super::spdy::{self, Stream};
use super::target::{self, Target};
use super::upgrade::{self, Transport, plain};
use super::websocket::{SPDY_TUNNEL, Tunnel};
use super::{Admission, Requester, supervise};
use crate::kubelet_api::source::GuestAddress;
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
        Transport::WebSocket => &[SPDY_TUNNEL],
    };
    let protocol = match upgrade::negotiate(req.headers(), transport, ours) {
        Ok(p) => p,
        Err(refusal) => return refusal.into_response(),
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
            upgrade::websocket(req, protocol, panics, move |socket| {
                forwarder.serve(Tunnel::new(socket))
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
