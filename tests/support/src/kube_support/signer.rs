//! The cluster operator's part of a `kubernetes.io/kubelet-serving` CSR, and on a control plane
//! without a controller-manager its signer's part too: watch the CertificateSigningRequests of
//! that signer for one node, check them as the `kubelet-serving` rules do (subject
//! `O=system:nodes, CN=system:node:…`, server-auth usages, DNS and IP names only), approve them
//! as an operator would (`kubectl certificate approve`), and — [`Mode::Sign`] only — sign them
//! with the cluster CA (its key is in the cluster's state directory), writing
//! `status.certificate`.
//!
//! With a controller-manager ([`Mode::Approve`]) the real signer signs the approved request
//! (for a year; it gives no certificate shorter than ten minutes whatever the request asks).
//! [`Mode::Sign`] stays for a test that needs a certificate of a few seconds, on a control plane
//! without a controller-manager, whose signer would race this one.
//!
//! Neither is a mock of the daemon: the daemon creates, watches and uses its CSR through the
//! real apiserver.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestCondition};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use rcgen::{CertificateSigningRequestParams, DnType, DnValue, Issuer, KeyPair, SanType};

pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";

/// What the harness does with a node's pending kubelet-serving requests.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// Approve (or deny) only; the controller-manager signs.
    Approve,
    /// Approve and sign with the cluster CA, issued for `lifetime`.
    Sign { lifetime: Duration },
}

/// A running approver (and signer); stops when dropped.
pub struct Signer {
    task: tokio::task::JoinHandle<()>,
    /// The names of the CSRs it approved, in order.
    pub signed: Arc<Mutex<Vec<String>>>,
}

impl Drop for Signer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Why a request is refused (the kubelet-serving signer's checks).
fn check(params: &CertificateSigningRequestParams, usages: &[String]) -> Result<String, String> {
    let dn = &params.params.distinguished_name;
    let text = |t: DnType| {
        dn.get(&t).map(|v| match v {
            DnValue::Utf8String(s) => s.clone(),
            DnValue::PrintableString(s) => s.as_str().to_string(),
            other => format!("{other:?}"),
        })
    };
    if text(DnType::OrganizationName).as_deref() != Some("system:nodes") {
        return Err("the subject's organization must be system:nodes".into());
    }
    let cn = text(DnType::CommonName).unwrap_or_default();
    let Some(node) = cn.strip_prefix("system:node:") else {
        return Err(format!("the common name {cn:?} must be system:node:<name>"));
    };
    for u in usages {
        if !["digital signature", "key encipherment", "server auth"].contains(&u.as_str()) {
            return Err(format!("usage {u:?} is not allowed for kubelet serving certificates"));
        }
    }
    if !usages.iter().any(|u| u == "server auth") {
        return Err("usage server auth is required".into());
    }
    for san in &params.params.subject_alt_names {
        if !matches!(san, SanType::DnsName(_) | SanType::IpAddress(_)) {
            return Err(format!("subjectAltName {san:?} is not allowed"));
        }
    }
    Ok(node.to_string())
}

fn sign(csr_pem: &str, usages: &[String], ca_cert: &str, ca_key: &str, lifetime: Duration) -> Result<String, String> {
    let mut params = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| format!("bad CSR: {e}"))?;
    check(&params, usages)?;
    let now = time::OffsetDateTime::now_utc();
    params.params.not_before = now;
    params.params.not_after = now + lifetime;
    params.params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::from_pem(ca_key).map_err(|e| format!("CA key: {e}"))?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert, key).map_err(|e| format!("CA certificate: {e}"))?;
    let cert = params.signed_by(&issuer).map_err(|e| format!("signing: {e}"))?;
    Ok(cert.pem())
}

/// A kubelet-serving request nobody has decided on yet (the watch also brings back the
/// requests this approved, until the signer's certificate lands).
fn pending(csr: &CertificateSigningRequest) -> bool {
    let status = csr.status.as_ref();
    csr.spec.signer_name == KUBELET_SERVING
        && status
            .and_then(|s| s.certificate.as_ref())
            .is_none_or(|c| c.0.is_empty())
        && !status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
            c.iter()
                .any(|c| ["Approved", "Denied", "Failed"].contains(&c.type_.as_str()))
        })
}

/// The cluster CA's certificate and key (PEM), for [`Mode::Sign`].
struct Ca {
    cert: String,
    key: String,
}

async fn approve_and_sign(
    api: &Api<CertificateSigningRequest>,
    csr: &CertificateSigningRequest,
    ca: &Ca,
    mode: Mode,
) -> Result<String, String> {
    let name = csr.metadata.name.clone().unwrap_or_default();
    let usages = csr.spec.usages.clone().unwrap_or_default();
    let pem = String::from_utf8(csr.spec.request.0.clone()).map_err(|_| "the request is not PEM".to_string())?;
    let approved = |type_: &str, reason: &str, message: String| CertificateSigningRequestCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message),
        ..Default::default()
    };
    let verdict = match mode {
        Mode::Sign { lifetime } => sign(&pem, &usages, &ca.cert, &ca.key, lifetime).map(Some),
        Mode::Approve => CertificateSigningRequestParams::from_pem(&pem)
            .map_err(|e| format!("bad CSR: {e}"))
            .and_then(|params| check(&params, &usages))
            .map(|_| None),
    };
    let (condition, certificate) = match verdict {
        Ok(cert) => (
            approved("Approved", "TestApprove", "approved by the test harness".into()),
            cert,
        ),
        Err(why) => (approved("Denied", "TestDeny", why), None),
    };
    api.patch_approval(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"conditions": [condition]}})),
    )
    .await
    .map_err(|e| format!("approving {name}: {e}"))?;
    if let Some(cert) = certificate {
        let body = k8s_openapi::ByteString(cert.into_bytes());
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"certificate": body}})),
        )
        .await
        .map_err(|e| format!("writing the certificate of {name}: {e}"))?;
    }
    Ok(name)
}

/// The node a CSR asks a certificate for (its subject's `system:node:<name>`).
fn node_of(csr: &CertificateSigningRequest) -> Option<String> {
    let pem = String::from_utf8(csr.spec.request.0.clone()).ok()?;
    let params = CertificateSigningRequestParams::from_pem(&pem).ok()?;
    params.params.distinguished_name.iter().find_map(|(t, v)| match (t, v) {
        (DnType::CommonName, DnValue::Utf8String(s)) => s.strip_prefix("system:node:").map(str::to_string),
        _ => None,
    })
}

/// Starts approving (per `mode`, also signing) the pending kubelet-serving CSRs of node `node`
/// as `admin`. Tests share one cluster: each approves only its own node's requests.
pub fn start(admin: kube::Client, ca_dir: &Path, mode: Mode, node: &str) -> Signer {
    let node = node.to_string();
    let ca = Ca {
        cert: std::fs::read_to_string(ca_dir.join("ca.crt")).expect("the cluster CA certificate"),
        key: std::fs::read_to_string(ca_dir.join("ca.key")).expect("the cluster CA key"),
    };
    let signed = Arc::new(Mutex::new(Vec::new()));
    let out = signed.clone();
    let task = tokio::spawn(async move {
        let api: Api<CertificateSigningRequest> = Api::all(admin);
        let mut events = watcher::watcher(api.clone(), watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let csr = match event {
                Ok(watcher::Event::Apply(c)) | Ok(watcher::Event::InitApply(c)) => c,
                _ => continue,
            };
            if !pending(&csr) || node_of(&csr).as_deref() != Some(node.as_str()) {
                continue;
            }
            match approve_and_sign(&api, &csr, &ca, mode).await {
                Ok(name) => out.lock().unwrap().push(name),
                Err(e) => eprintln!("test CSR signer: {e}"),
            }
        }
    });
    Signer { task, signed }
}
