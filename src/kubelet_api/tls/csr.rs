//! A serving certificate signed by the cluster: a CertificateSigningRequest with signer
//! `kubernetes.io/kubelet-serving` (what the kubelet's `serverTLSBootstrap` sends), waited for
//! until it is approved and signed — or refused.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

use super::TlsError;
use super::certs::{self, ServingCert};

pub const SIGNER: &str = "kubernetes.io/kubelet-serving";

/// The outcome a CSR's status shows (pure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsrState {
    Pending,
    Issued(Vec<u8>),
    Refused {
        verdict: String,
        reason: String,
        message: String,
    },
}

pub fn state_of(csr: &CertificateSigningRequest) -> CsrState {
    let Some(status) = &csr.status else {
        return CsrState::Pending;
    };
    for c in status.conditions.iter().flatten() {
        if (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True" {
            return CsrState::Refused {
                verdict: c.type_.to_ascii_lowercase(),
                reason: c.reason.clone().unwrap_or_default(),
                message: c.message.clone().unwrap_or_default(),
            };
        }
    }
    match &status.certificate {
        Some(cert) if !cert.0.is_empty() => CsrState::Issued(cert.0.clone()),
        _ => CsrState::Pending,
    }
}

/// Where the serving certificate stands: the Node reports it (`crate::kubelet::serving_cert`).
pub use crate::kubelet::serving_cert::ServingCertStatus;

/// Receives the [`ServingCertStatus`] changes (the Node publishes the latest).
pub type StatusSender = tokio::sync::watch::Sender<Option<ServingCertStatus>>;

/// The CSR object for `csr_pem` (pure).
pub fn request_object(csr_pem: &str) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("csr-".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(csr_pem.as_bytes().to_vec()),
            signer_name: SIGNER.into(),
            // ECDSA keys sign; they do not encipher.
            usages: Some(vec!["digital signature".into(), "server auth".into()]),
            ..Default::default()
        },
        status: None,
    }
}

/// Requests a certificate for `node_name` and `ips`; waits (logging every `remind`) until
/// the cluster signs or refuses it, or `shutdown`. `created_hook` is told the CSR's name
/// once it exists.
pub async fn request(
    client: kube::Client,
    node_name: &str,
    ips: &[IpAddr],
    remind: Duration,
    shutdown: &CancellationToken,
    created_hook: impl FnOnce(&str),
) -> Result<ServingCert, TlsError> {
    let (key_pem, csr_pem) = certs::new_csr(node_name, ips)?;
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let created = api
        .create(&PostParams::default(), &request_object(&csr_pem))
        .await
        .map_err(|e| {
            TlsError::Csr(format!(
                "creating it failed: {e}; the daemon's identity needs create/get/list/watch on certificatesigningrequests (deploy/rbac.yaml)"
            ))
        })?;
    let name = created.metadata.name.clone().unwrap_or_default();
    created_hook(&name);
    tracing::info!(csr = %name, signer = SIGNER, node = node_name,
        "serving certificate requested; waiting for approval and signing (kubectl certificate approve {name})");
    let watched = name.clone();
    let wait = kube::runtime::wait::await_condition(api, &watched, |csr: Option<&CertificateSigningRequest>| {
        csr.is_none_or(|c| state_of(c) != CsrState::Pending)
    });
    tokio::pin!(wait);
    let mut reminder = tokio::time::interval(remind);
    reminder.tick().await;
    let csr = loop {
        tokio::select! {
            r = &mut wait => break r.map_err(|e| TlsError::Csr(format!("watching {name}: {e}")))?,
            _ = reminder.tick() => tracing::warn!(csr = %name,
                "the serving certificate is still not signed: approve it with `kubectl certificate approve {name}`"),
            _ = shutdown.cancelled() => return Err(TlsError::Cancelled),
        }
    };
    let Some(csr) = csr else {
        return Err(TlsError::Csr(format!("{name} was deleted before it was signed")));
    };
    match state_of(&csr) {
        CsrState::Issued(pem) => {
            let chain =
                String::from_utf8(pem).map_err(|_| TlsError::Csr(format!("{name}: the certificate is not PEM")))?;
            let cert = ServingCert::from_pem(&chain, &key_pem)
                .map_err(|e| TlsError::Csr(format!("{name}: the issued certificate is unusable: {e}")))?;
            tracing::info!(csr = %name, serial = %cert.serial, not_after = ?cert.not_after, "serving certificate issued");
            Ok(cert)
        }
        CsrState::Refused {
            verdict,
            reason,
            message,
        } => Err(TlsError::CsrRefused {
            name,
            verdict,
            reason,
            message,
        }),
        CsrState::Pending => Err(TlsError::Csr(format!("{name}: the wait ended while still pending"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{CertificateSigningRequestCondition, CertificateSigningRequestStatus};

    fn with_status(status: CertificateSigningRequestStatus) -> CertificateSigningRequest {
        CertificateSigningRequest {
            status: Some(status),
            ..request_object("x")
        }
    }

    #[test]
    fn states() {
        assert_eq!(state_of(&request_object("x")), CsrState::Pending);
        let approved = CertificateSigningRequestCondition {
            type_: "Approved".into(),
            status: "True".into(),
            ..Default::default()
        };
        assert_eq!(
            state_of(&with_status(CertificateSigningRequestStatus {
                conditions: Some(vec![approved.clone()]),
                certificate: None
            })),
            CsrState::Pending,
            "approved but not signed yet"
        );
        assert_eq!(
            state_of(&with_status(CertificateSigningRequestStatus {
                conditions: Some(vec![approved]),
                certificate: Some(ByteString(b"PEM".to_vec()))
            })),
            CsrState::Issued(b"PEM".to_vec())
        );
        let denied = CertificateSigningRequestCondition {
            type_: "Denied".into(),
            status: "True".into(),
            reason: Some("NotMyNode".into()),
            message: Some("no".into()),
            ..Default::default()
        };
        assert!(matches!(
            state_of(&with_status(CertificateSigningRequestStatus {
                conditions: Some(vec![denied]),
                certificate: None
            })),
            CsrState::Refused { verdict, reason, .. } if verdict == "denied" && reason == "NotMyNode"
        ));
    }

    #[test]
    fn the_request_names_the_kubelet_serving_signer() {
        let o = request_object("PEM");
        assert_eq!(o.spec.signer_name, "kubernetes.io/kubelet-serving");
        assert_eq!(o.metadata.generate_name.as_deref(), Some("csr-"));
        assert_eq!(
            o.spec.usages.unwrap(),
            vec!["digital signature".to_string(), "server auth".to_string()]
        );
    }
}
