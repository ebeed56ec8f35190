//! The kubelet API on `VK_KUBELET_PORT` (the Go daemon's endpoints; the kubelet's own behaviour
//! where the Go daemon had none): what `kubectl logs`, `kubectl top`, metrics-server and the HPA
//! talk to through the apiserver.
//!
//! Layout:
//! * [`config`]: the environment; [`tls`]: serving certificate (operator files, a
//!   `kubernetes.io/kubelet-serving` CSR, or self-signed) and its renewal, client CA;
//! * [`auth`]: client certificate or TokenReview, then SubjectAccessReview with the kubelet's
//!   attribute mapping, cached; [`server`]: the TLS listener; [`routes`]: the endpoints
//!   behind the auth layer (the seam for more);
//! * endpoints: [`logs`] (`/containerLogs`, incl. `follow`), [`summary`] (`/stats/summary`),
//!   [`resource_metrics`] (`/metrics/resource`), `/pods`, `/healthz`;
//! * [`source`]: the read-only view of the provider's pods it needs.
//!
//! The stats come from [`crate::stats`]: one cached sample serves every surface.

pub mod auth;
pub mod config;
pub mod logs;
pub mod resource_metrics;
pub mod routes;
pub mod server;
pub mod source;
pub mod state;
pub mod streaming;
pub mod summary;
pub mod tls;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::listener::ServerTls;

pub use config::ApiConfig;
pub use state::{ApiMetrics, ApiState};
use tls::manager::{CertManager, CertTimings};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("binding the kubelet API on {addr}: {source}; set VK_KUBELET_ADDRESS / VK_KUBELET_PORT")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// Everything the server is made of.
pub struct KubeletApi {
    pub config: ApiConfig,
    pub node_ip: IpAddr,
    pub client: kube::Client,
    pub state: Arc<ApiState>,
    pub auth: Arc<auth::Auth>,
    pub cert_timings: CertTimings,
    /// Where a cluster-signed serving certificate stands (the Node shows it).
    pub cert_status: Option<tls::csr::StatusSender>,
    /// Connection cap and deadlines of the listener.
    pub limits: crate::listener::Limits,
}

/// A started server: its address, the task serving it, and its serving certificate (kept
/// current by its manager; the peer tier presents it too).
pub struct Serving {
    pub addr: SocketAddr,
    pub task: tokio::task::JoinHandle<()>,
    pub cert: Arc<tls::CertSlot>,
}

impl KubeletApi {
    /// The IP SANs of the serving certificate: the node IP, and the bind address when it is
    /// a specific one.
    fn cert_ips(&self, bound: IpAddr) -> Vec<IpAddr> {
        let mut ips = vec![self.node_ip];
        if !bound.is_unspecified() && !ips.contains(&bound) {
            ips.push(bound);
        }
        ips
    }

    /// Binds now (a taken port is an error at startup), then serves in the background once
    /// the first serving certificate is there (a CSR may take until an operator approves it;
    /// the rest of the daemon does not wait).
    pub async fn start(self, shutdown: CancellationToken) -> Result<Serving, ServeError> {
        let ip = self.config.address.unwrap_or(self.node_ip);
        let addr = SocketAddr::new(ip, self.config.port);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ServeError::Bind { addr, source })?;
        let client_ca = self.config.client_ca.as_deref().map(tls::load_client_ca).transpose()?;
        if client_ca.is_none() {
            tracing::warn!(
                "VK_CLIENT_CA_FILE is not set: the kubelet API accepts bearer tokens only, so the apiserver (which presents a client certificate) cannot reach it"
            );
        }
        let (client_ca_file, client_ca) = client_ca.unzip();
        let slot = Arc::new(tls::CertSlot::default());
        let tls_config = ServerTls::new(tls::server_config(slot.clone(), client_ca)?);
        let client_ca_watch = client_ca_file.map(|file| {
            tls::watch_client_ca(
                file,
                slot.clone(),
                tls_config.clone(),
                self.cert_timings.file_check,
                shutdown.clone(),
            )
        });
        let manager = CertManager {
            source: self.config.tls.clone(),
            node_name: self.state.node_name.clone(),
            ips: self.cert_ips(ip),
            client: self.client.clone(),
            slot: slot.clone(),
            timings: self.cert_timings.clone(),
            status: self.cert_status.clone(),
        };
        let app = routes::router(self.state.clone(), self.auth.clone());
        let server = server::listener(tls_config, self.limits);
        let task = tokio::spawn(async move {
            let cert = match manager.obtain(&shutdown).await {
                Ok(c) => c,
                Err(tls::TlsError::Cancelled) => return,
                Err(error) => {
                    tracing::error!(%error, "the kubelet API cannot start without a serving certificate");
                    return;
                }
            };
            tracing::info!(%addr, serial = %cert.serial, "serving the kubelet API");
            // The certificate is renewed for as long as the listener serves (both end at `shutdown`).
            tokio::join!(
                manager.run(cert, shutdown.clone()),
                server::run(listener, server, app, shutdown),
                async {
                    if let Some(watch) = client_ca_watch {
                        watch.await;
                    }
                }
            );
        });
        Ok(Serving { addr, task, cert: slot })
    }
}
