//! Obtains the serving certificate and keeps it current: operator files are re-read when they
//! change; a cluster-signed certificate is stored, reused across restarts while it is fresh,
//! and renewed through a new CSR at 80 % of its lifetime (the old one keeps serving until the
//! new one is issued); a self-signed one is regenerated at the same point.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::host::fs::write_atomically;

use super::certs::{self, ServingCert};
use super::{CertSlot, TlsError, TlsSource, csr};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertTimings {
    /// How often a pending CSR is logged again.
    pub remind: Duration,
    /// First retry after a failed request; doubles up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// How often operator-provided files are checked for a change.
    pub file_check: Duration,
    pub self_signed_validity: Duration,
}

impl Default for CertTimings {
    fn default() -> Self {
        Self {
            remind: Duration::from_secs(60),
            retry_min: Duration::from_secs(10),
            retry_max: Duration::from_secs(300),
            file_check: Duration::from_secs(30),
            self_signed_validity: Duration::from_secs(365 * 24 * 3600),
        }
    }
}

pub const CERT_FILE: &str = "kubelet-server.crt";
pub const KEY_FILE: &str = "kubelet-server.key";

pub struct CertManager {
    pub source: TlsSource,
    pub node_name: String,
    /// The IP SANs: the node IP and the bind address.
    pub ips: Vec<IpAddr>,
    pub client: kube::Client,
    pub slot: Arc<CertSlot>,
    pub timings: CertTimings,
    /// Where a cluster-signed certificate stands, for the Node's condition and Events.
    pub status: Option<csr::StatusSender>,
}

/// Stores a cluster-signed certificate and its key (0600) in `dir`.
pub fn store(dir: &Path, cert: &ServingCert) -> Result<(), TlsError> {
    let io = |source: std::io::Error| TlsError::Io {
        path: dir.display().to_string(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    write_atomically(&dir.join(KEY_FILE), cert.key_pem.as_bytes(), 0o600).map_err(io)?;
    write_atomically(&dir.join(CERT_FILE), cert.chain_pem.as_bytes(), 0o644).map_err(io)?;
    Ok(())
}

/// The stored certificate, when it is still fresh and names this node.
pub fn load_stored(dir: &Path, names: &[String], ips: &[IpAddr], now: SystemTime) -> Option<ServingCert> {
    let cert = ServingCert::from_files(&dir.join(CERT_FILE), &dir.join(KEY_FILE)).ok()?;
    (cert.fresh_at(now) && cert.covers(names, ips)).then_some(cert)
}

fn mtimes(cert: &Path, key: &Path) -> Option<(SystemTime, SystemTime)> {
    let m = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    Some((m(cert)?, m(key)?))
}

impl CertManager {
    fn names(&self) -> Vec<String> {
        vec![self.node_name.clone()]
    }

    fn install(&self, cert: &ServingCert) -> Result<(), TlsError> {
        self.slot.set(cert.certified_key(&super::provider())?);
        Ok(())
    }

    fn report(&self, status: csr::ServingCertStatus) {
        if let Some(tx) = &self.status {
            tx.send_replace(Some(status));
        }
    }

    /// A new certificate from the cluster; `serving` = an earlier one serves meanwhile.
    async fn signed_by_cluster(
        &self,
        dir: &Path,
        serving: bool,
        shutdown: &CancellationToken,
    ) -> Result<ServingCert, TlsError> {
        let mut requested = None;
        let result = csr::request(
            self.client.clone(),
            &self.node_name,
            &self.ips,
            self.timings.remind,
            shutdown,
            |name| {
                requested = Some(name.to_string());
                self.report(csr::ServingCertStatus::Pending {
                    csr: name.to_string(),
                    serving,
                });
            },
        )
        .await;
        match &result {
            Ok(_) => self.report(csr::ServingCertStatus::Issued { csr: requested }),
            Err(TlsError::CsrRefused {
                name,
                verdict,
                reason,
                message,
            }) => self.report(csr::ServingCertStatus::Refused {
                csr: name.clone(),
                verdict: verdict.clone(),
                reason: reason.clone(),
                message: message.clone(),
                serving,
            }),
            Err(_) => {}
        }
        let cert = result?;
        if let Err(error) = store(dir, &cert) {
            tracing::warn!(%error, "cannot store the serving certificate; a restart will request a new one");
        }
        Ok(cert)
    }

    /// Retries `f` with backoff until it succeeds or `shutdown`.
    async fn until_ok<F, Fut>(
        &self,
        what: &str,
        shutdown: &CancellationToken,
        mut f: F,
    ) -> Result<ServingCert, TlsError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<ServingCert, TlsError>>,
    {
        let mut delay = self.timings.retry_min;
        loop {
            match f().await {
                Ok(c) => return Ok(c),
                Err(TlsError::Cancelled) => return Err(TlsError::Cancelled),
                Err(error) => {
                    tracing::error!(%error, retry_in = ?delay, "{what}");
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = shutdown.cancelled() => return Err(TlsError::Cancelled),
                    }
                    delay = (delay * 2).min(self.timings.retry_max);
                }
            }
        }
    }

    /// The first certificate, installed. Operator files must be valid (an error is final);
    /// a CSR is retried until the cluster signs one.
    pub async fn obtain(&self, shutdown: &CancellationToken) -> Result<ServingCert, TlsError> {
        let cert = match &self.source {
            TlsSource::Files { cert, key } => ServingCert::from_files(cert, key)?,
            TlsSource::SelfSigned => {
                tracing::warn!(
                    "VK_TLS_SELF_SIGNED=true: the kubelet API serves a self-signed certificate that no client can verify; use a cluster-signed one (unset it) or VK_TLS_CERT/VK_TLS_KEY"
                );
                certs::self_signed(&self.node_name, &self.ips, self.timings.self_signed_validity)?
            }
            TlsSource::Csr { dir } => match load_stored(dir, &self.names(), &self.ips, SystemTime::now()) {
                Some(c) => {
                    tracing::info!(serial = %c.serial, dir = %dir.display(), "reusing the stored serving certificate");
                    self.report(csr::ServingCertStatus::Issued { csr: None });
                    c
                }
                None => {
                    self.until_ok("requesting the serving certificate failed", shutdown, || {
                        self.signed_by_cluster(dir, false, shutdown)
                    })
                    .await?
                }
            },
        };
        self.install(&cert)?;
        Ok(cert)
    }

    /// Keeps the certificate current until `shutdown`.
    pub async fn run(self, mut cert: ServingCert, shutdown: CancellationToken) {
        match self.source.clone() {
            TlsSource::Files { cert: c, key: k } => self.watch_files(c, k, shutdown).await,
            source => loop {
                let wait = cert.renew_at().duration_since(SystemTime::now()).unwrap_or_default();
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.cancelled() => return,
                }
                tracing::info!(serial = %cert.serial, not_after = ?cert.not_after, "renewing the serving certificate");
                let next = match &source {
                    TlsSource::Csr { dir } => {
                        self.until_ok("renewing the serving certificate failed", &shutdown, || {
                            self.signed_by_cluster(dir, true, &shutdown)
                        })
                        .await
                    }
                    _ => certs::self_signed(&self.node_name, &self.ips, self.timings.self_signed_validity),
                };
                match next.and_then(|n| self.install(&n).map(|()| n)) {
                    Ok(n) => cert = n,
                    Err(TlsError::Cancelled) => return,
                    Err(error) => {
                        tracing::error!(%error, "renewal failed; the current certificate keeps serving");
                        tokio::select! {
                            _ = tokio::time::sleep(self.timings.retry_max) => {}
                            _ = shutdown.cancelled() => return,
                        }
                    }
                }
            },
        }
    }

    async fn watch_files(&self, cert: PathBuf, key: PathBuf, shutdown: CancellationToken) {
        let mut seen = mtimes(&cert, &key);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.timings.file_check) => {}
                _ = shutdown.cancelled() => return,
            }
            let now = mtimes(&cert, &key);
            if now == seen {
                continue;
            }
            match ServingCert::from_files(&cert, &key).and_then(|c| self.install(&c).map(|()| c)) {
                Ok(c) => {
                    tracing::info!(serial = %c.serial, "reloaded the serving certificate from VK_TLS_CERT/VK_TLS_KEY");
                    seen = now;
                }
                // A half-written pair: the next check tries again.
                Err(error) => tracing::warn!(%error, "the changed serving certificate files do not load yet"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_certificate_is_reused_only_while_fresh_and_for_this_node() {
        let dir = tempfile::tempdir().unwrap();
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let c = certs::self_signed("node-a", &[ip], Duration::from_secs(3600)).unwrap();
        store(dir.path(), &c).unwrap();
        let names = ["node-a".to_string()];
        let now = SystemTime::now();
        assert_eq!(load_stored(dir.path(), &names, &[ip], now).unwrap().serial, c.serial);
        assert!(load_stored(dir.path(), &["node-b".into()], &[ip], now).is_none());
        assert!(load_stored(dir.path(), &names, &["10.0.0.1".parse().unwrap()], now).is_none());
        assert!(
            load_stored(dir.path(), &names, &[ip], c.renew_at()).is_none(),
            "due for renewal"
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
