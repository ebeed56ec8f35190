//! TLS of the kubelet API: where the serving certificate comes from ([`TlsSource`]), the
//! rustls configuration (a hot-swappable certificate, client certificates verified against
//! `VK_CLIENT_CA_FILE` but not required — token clients have none), [`manager`], which
//! obtains and renews the certificate, and [`ca_file`], which follows a trusted CA file as it
//! changes (this one and the peer tier's).

pub mod ca_file;
pub mod certs;
pub mod csr;
pub mod manager;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, ServerConfig};
use tokio_util::sync::CancellationToken;

use crate::listener::ServerTls;

pub use certs::ServingCert;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("serving certificate: {0}")]
    Certificate(String),
    #[error(
        "VK_CLIENT_CA_FILE={path}: {problem}; it must hold the PEM CA that signs the apiserver's kubelet-client certificate"
    )]
    ClientCa { path: String, problem: String },
    #[error("CertificateSigningRequest: {0}")]
    Csr(String),
    #[error(
        "CertificateSigningRequest {name} was {verdict}: {reason} {message}; approve a new one (kubectl certificate approve) or set VK_TLS_CERT/VK_TLS_KEY"
    )]
    CsrRefused {
        name: String,
        verdict: String,
        reason: String,
        message: String,
    },
    #[error("rustls: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("stopped while waiting for the serving certificate")]
    Cancelled,
}

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSource {
    /// `VK_TLS_CERT` / `VK_TLS_KEY`: the operator's files (re-read when they change).
    Files { cert: PathBuf, key: PathBuf },
    /// The cluster signs it (`kubernetes.io/kubelet-serving`); kept in `dir` across restarts.
    Csr { dir: PathBuf },
    /// `VK_TLS_SELF_SIGNED=true`: generated in memory (clients cannot verify it).
    SelfSigned,
}

/// The certificate the server presents; swapped in place on renewal.
#[derive(Default)]
pub struct CertSlot {
    current: ArcSwapOption<CertifiedKey>,
}

impl std::fmt::Debug for CertSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertSlot")
            .field("loaded", &self.current.load().is_some())
            .finish()
    }
}

impl CertSlot {
    pub fn set(&self, key: Arc<CertifiedKey>) {
        self.current.store(Some(key));
    }

    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }

    /// The certificate now (the peer tier presents it as a client certificate too).
    pub fn current(&self) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }
}

/// The daemon's rustls provider (ring, as for the Kubernetes client).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The roots of `VK_CLIENT_CA_FILE`, and the file to follow ([`watch_client_ca`]).
pub fn load_client_ca(path: &Path) -> Result<(ca_file::CaFile, RootCertStore), TlsError> {
    ca_file::CaFile::load(path.to_path_buf(), "VK_CLIENT_CA_FILE").map_err(|problem| TlsError::ClientCa {
        path: path.display().to_string(),
        problem,
    })
}

/// The server configuration: certificates from `slot`; client certificates verified against
/// `client_ca` when given (optional: bearer-token clients present none).
pub fn server_config(slot: Arc<CertSlot>, client_ca: Option<RootCertStore>) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        Some(roots) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsError::Certificate(format!("client certificate verifier: {e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(slot);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Keeps `tls` (the configuration [`server_config`] built with `slot`) checking client
/// certificates against `file` as it changes, until `shutdown`: a rotated client CA is trusted
/// from the next connection on, without a restart.
pub async fn watch_client_ca(
    file: ca_file::CaFile,
    slot: Arc<CertSlot>,
    tls: ServerTls,
    every: Duration,
    shutdown: CancellationToken,
) {
    let rebuild = move |roots| {
        let config = server_config(slot.clone(), Some(roots)).map_err(|e| e.to_string())?;
        tls.replace(config);
        Ok(())
    };
    file.watch(every, shutdown, rebuild).await;
}
