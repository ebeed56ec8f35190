//! Serving HTTP with limits: the one accept loop of every listener of the daemon (the kubelet
//! API, `/metrics`, the peer tier). Each of them is reachable before any authentication, so
//! whatever a client holds without authenticating is bounded here:
//!
//! - a cap on open connections ([`Limits::max_connections`]); past it a new connection is
//!   accepted and closed at once (the daemon never holds more sockets than the cap, and the
//!   client sees the refusal instead of waiting in the kernel's backlog);
//! - a TLS handshake deadline;
//! - a header deadline ([`Limits::header_timeout`]): from the accept to the first request's
//!   complete headers, and (HTTP/1.1) from the end of one request to the next one's headers;
//! - an idle deadline ([`Limits::idle_timeout`]): a connection without a request in flight
//!   that long is closed (HTTP/2: GOAWAY). A request streaming a long response is in flight
//!   throughout;
//! - HTTP/2 keep-alive pings, so a peer that vanished is noticed.
//!
//! Requests carry the connection's remote address (`ConnectInfo<SocketAddr>`) and, on TLS,
//! the client's certificate chain ([`ClientCertificates`]) for the listener's own
//! authentication.

mod activity;
pub mod headers;
mod server_tls;
pub mod settings;
mod slot;
pub mod throttle;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

pub use server_tls::ServerTls;
pub use settings::{ListenerArgs, Which};

use activity::{Activity, Tracked};
use slot::Slotted;
use throttle::Throttled;

/// What one listener allows a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once (TLS handshakes and upgraded sessions included).
    pub max_connections: usize,
    /// From the accept to the first request's headers; between two requests on HTTP/1.1.
    pub header_timeout: Duration,
    /// A connection without a request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// The TLS handshake.
    pub handshake_timeout: Duration,
    /// HTTP/2 pings this often; a ping not answered within `h2_keepalive_timeout` ends the
    /// connection.
    pub h2_keepalive_interval: Duration,
    pub h2_keepalive_timeout: Duration,
    /// How long open requests may take to finish once the connection is closing (idle,
    /// shutdown) before the socket is dropped.
    pub drain_timeout: Duration,
}

impl Limits {
    /// The defaults of every listener, with `max_connections`.
    pub fn with_cap(max_connections: usize) -> Self {
        Self {
            max_connections,
            header_timeout: settings::DEFAULT_HEADER_TIMEOUT,
            idle_timeout: settings::DEFAULT_IDLE_TIMEOUT,
            handshake_timeout: Duration::from_secs(10),
            h2_keepalive_interval: Duration::from_secs(30),
            h2_keepalive_timeout: Duration::from_secs(20),
            drain_timeout: Duration::from_secs(10),
        }
    }
}

/// The certificate chain (leaf first) the TLS client presented, on each of its requests.
#[derive(Debug, Clone)]
pub struct ClientCertificates(pub Arc<Vec<CertificateDer<'static>>>);

impl ClientCertificates {
    pub fn leaf(&self) -> Option<&CertificateDer<'static>> {
        self.0.first()
    }
}

/// One listener: its name (for logs), limits, transport and open connections.
pub struct Listener {
    name: &'static str,
    limits: Limits,
    tls: Option<ServerTls>,
    slots: Arc<Semaphore>,
    refusals: Throttled,
}

impl Listener {
    /// A plain-HTTP listener (`tls: None`) or a TLS one, each connection taking the
    /// configuration current when it is accepted.
    pub fn new(name: &'static str, limits: Limits, tls: Option<ServerTls>) -> Arc<Self> {
        Arc::new(Self {
            name,
            limits,
            tls,
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            refusals: Throttled::new(REFUSAL_WARNING_EVERY),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Whether connections are TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.limits.max_connections - self.slots.available_permits()
    }

    /// Connections refused at the cap so far.
    pub fn refused_connections(&self) -> u64 {
        self.refusals.count()
    }

    /// Serves `app` on `listener` until `shutdown`, then lets open requests finish (within
    /// the drain timeout).
    pub async fn serve(self: Arc<Self>, listener: TcpListener, app: Router, shutdown: CancellationToken) {
        let connections = TaskTracker::new();
        loop {
            let (tcp, remote) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(error) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(listener = self.name, %error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                _ = shutdown.cancelled() => break,
            };
            let Ok(slot) = self.slots.clone().try_acquire_owned() else {
                self.refused(remote);
                drop(tcp);
                continue;
            };
            let io = Slotted::new(tcp, slot);
            connections.spawn(self.clone().connection(io, remote, app.clone(), shutdown.clone()));
        }
        drop(listener);
        connections.close();
        // Each connection bounds its own drain; this bounds the wait for all of them.
        let bound = self.limits.drain_timeout + Duration::from_secs(1);
        if tokio::time::timeout(bound, connections.wait()).await.is_err() {
            tracing::warn!(
                listener = self.name,
                "connections still open after {bound:?}; dropping them"
            );
        }
    }

    async fn connection(
        self: Arc<Self>,
        io: Slotted<TcpStream>,
        remote: SocketAddr,
        app: Router,
        shutdown: CancellationToken,
    ) {
        let activity = Activity::new();
        let Some(tls) = &self.tls else {
            return self.http(io, remote, None, app, activity, shutdown).await;
        };
        let acceptor = TlsAcceptor::from(tls.current());
        let tls = match tokio::time::timeout(self.limits.handshake_timeout, acceptor.accept(io)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(error)) => {
                tracing::debug!(listener = self.name, %remote, %error, "TLS handshake failed");
                return;
            }
            Err(_) => {
                tracing::debug!(listener = self.name, %remote, "TLS handshake timed out");
                return;
            }
        };
        let certificates = tls
            .get_ref()
            .1
            .peer_certificates()
            .filter(|chain| !chain.is_empty())
            .map(|chain| ClientCertificates(Arc::new(chain.to_vec())));
        self.http(tls, remote, certificates, app, activity, shutdown).await
    }

    async fn http<I>(
        &self,
        io: I,
        remote: SocketAddr,
        certificates: Option<ClientCertificates>,
        app: Router,
        activity: Activity,
        shutdown: CancellationToken,
    ) where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let tracking = activity.clone();
        let service = tower::service_fn(move |mut req: axum::http::Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(remote));
            if let Some(chain) = &certificates {
                req.extensions_mut().insert(chain.clone());
            }
            let request = tracking.begin();
            let app = app.clone();
            async move {
                let response = app.oneshot(req).await?;
                Ok::<_, std::convert::Infallible>(
                    response.map(|body| axum::body::Body::new(Tracked::new(body, request))),
                )
            }
        });
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(self.limits.h2_keepalive_interval)
            .keep_alive_timeout(self.limits.h2_keepalive_timeout);
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(service));
        tokio::pin!(conn);
        let why = tokio::select! {
            ended = conn.as_mut() => {
                if let Err(error) = ended {
                    tracing::debug!(listener = self.name, %remote, %error, "connection ended with an error");
                }
                return;
            }
            _ = activity.idle(self.limits.header_timeout, self.limits.idle_timeout) => "idle",
            _ = shutdown.cancelled() => "shutting down",
        };
        tracing::debug!(listener = self.name, %remote, why, "closing the connection");
        conn.as_mut().graceful_shutdown();
        match tokio::time::timeout(self.limits.drain_timeout, conn).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::debug!(listener = self.name, %remote, %error, "connection ended with an error"),
            Err(_) => {
                tracing::debug!(listener = self.name, %remote, "requests still open at the drain timeout; dropped")
            }
        }
    }
}

/// A refused connection is logged at debug; the warning comes at most this often, so a flood
/// cannot flood the log too.
const REFUSAL_WARNING_EVERY: Duration = Duration::from_secs(60);

impl Listener {
    fn refused(&self, remote: SocketAddr) {
        let (listener, cap) = (self.name, self.limits.max_connections);
        tracing::debug!(listener, %remote, cap, "connection refused: the listener is at its connection cap");
        if let Some(refused_total) = self.refusals.note() {
            tracing::warn!(
                listener,
                cap,
                refused_total,
                "connection cap reached: new connections are closed at once until open ones end (raise the listener's MAX_CONNECTIONS setting if this is legitimate load)"
            );
        }
    }
}

#[cfg(test)]
mod tests;
