//! The TLS listener: accepts connections, completes the handshake, puts the verified client
//! certificate's identity on each request, and serves HTTP/1.1 (with upgrades) and HTTP/2.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::auth::{PeerCertificate, UserInfo};
use super::tls::certs;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

fn peer_identity(conn: &rustls::ServerConnection) -> Option<UserInfo> {
    let leaf = conn.peer_certificates()?.first()?;
    let (cn, orgs) = certs::subject_of(leaf.as_ref())?;
    Some(UserInfo::from_certificate(&cn, &orgs))
}

/// Serves `app` on `listener` until `shutdown`, then lets open requests finish (bounded).
pub async fn run(listener: TcpListener, tls: Arc<ServerConfig>, app: Router, shutdown: CancellationToken) {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(error) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "kubelet API: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "kubelet API: TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "kubelet API: TLS handshake timed out");
                    return;
                }
            };
            let identity = peer_identity(tls.get_ref().1);
            serve_connection(tls, peer, identity, app, watcher).await;
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await.is_err() {
        tracing::warn!("kubelet API: connections still open after {DRAIN_TIMEOUT:?}; dropping them");
    }
}

async fn serve_connection(
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    peer: SocketAddr,
    identity: Option<UserInfo>,
    app: Router,
    watcher: hyper_util::server::graceful::Watcher,
) {
    let svc = app.map_request(move |mut req: axum::http::Request<Incoming>| {
        if let Some(user) = &identity {
            req.extensions_mut().insert(PeerCertificate(user.clone()));
        }
        req
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), TowerToHyperService::new(svc));
    if let Err(error) = watcher.watch(conn.into_owned()).await {
        tracing::debug!(%peer, %error, "kubelet API: connection ended with an error");
    }
}
