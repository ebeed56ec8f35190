//! Serving certificates as PEM: loading, inspecting (validity, names, key match), generating
//! a self-signed one, and building the kubelet-serving CSR. All pure apart from file reads.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose, SanType};
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use super::TlsError;

/// A certificate chain (leaf first) with its private key, and the leaf's validity.
#[derive(Clone)]
pub struct ServingCert {
    pub chain_pem: String,
    pub key_pem: String,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// DNS names and IP addresses of the leaf's subjectAltName.
    pub dns_names: Vec<String>,
    pub ips: Vec<IpAddr>,
    /// The leaf's serial number (hex), for logs and tests.
    pub serial: String,
    /// The leaf's raw public key (to check the private key belongs to it).
    leaf_key: Vec<u8>,
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert")
            .field("serial", &self.serial)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("dns_names", &self.dns_names)
            .field("ips", &self.ips)
            .finish_non_exhaustive()
    }
}

fn bad(what: impl Into<String>) -> TlsError {
    TlsError::Certificate(what.into())
}

fn system_time(ts: i64) -> SystemTime {
    if ts >= 0 {
        UNIX_EPOCH + Duration::from_secs(ts as u64)
    } else {
        UNIX_EPOCH
    }
}

/// The DER certificates of a PEM bundle.
pub fn parse_chain(pem: &str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| bad(format!("not a PEM certificate bundle: {e}")))?;
    if certs.is_empty() {
        return Err(bad("no certificate in the PEM bundle"));
    }
    Ok(certs)
}

/// The (CN, O…) of a DER certificate's subject.
pub fn subject_of(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let subject = cert.subject();
    let cn = subject.iter_common_name().next()?.as_str().ok()?.to_string();
    let orgs = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some((cn, orgs))
}

impl ServingCert {
    /// Parses a PEM chain and key; the key must belong to the leaf.
    pub fn from_pem(chain_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        let chain = parse_chain(chain_pem)?;
        let (_, leaf) = X509Certificate::from_der(chain[0].as_ref())
            .map_err(|e| bad(format!("the leaf certificate does not parse: {e}")))?;
        let mut dns_names = Vec::new();
        let mut ips = Vec::new();
        if let Ok(Some(san)) = leaf.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(d) => dns_names.push(d.to_string()),
                    GeneralName::IPAddress(b) => match b.len() {
                        4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*b).expect("length checked"))),
                        16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*b).expect("length checked"))),
                        _ => {}
                    },
                    _ => {}
                }
            }
        }
        let cert = Self {
            chain_pem: chain_pem.to_string(),
            key_pem: key_pem.to_string(),
            not_before: system_time(leaf.validity().not_before.timestamp()),
            not_after: system_time(leaf.validity().not_after.timestamp()),
            dns_names,
            ips,
            serial: leaf.raw_serial_as_string(),
            leaf_key: leaf.public_key().subject_public_key.data.to_vec(),
        };
        let key = KeyPair::from_pem(key_pem).map_err(|e| bad(format!("the private key does not parse: {e}")))?;
        if key.public_key_raw() != cert.leaf_key.as_slice() {
            return Err(bad("the private key does not belong to the certificate"));
        }
        Ok(cert)
    }

    /// Reads `cert` and `key` files.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|e| TlsError::Io {
                path: p.display().to_string(),
                source: e,
            })
        };
        Self::from_pem(&read(cert)?, &read(key)?)
            .map_err(|e| bad(format!("{} / {}: {e}", cert.display(), key.display())))
    }

    /// When to renew: 80 % of the way through the validity.
    pub fn renew_at(&self) -> SystemTime {
        let life = self.not_after.duration_since(self.not_before).unwrap_or_default();
        self.not_before + life.mul_f64(0.8)
    }

    /// Still usable at `now` and not yet due for renewal.
    pub fn fresh_at(&self, now: SystemTime) -> bool {
        now >= self.not_before && now < self.renew_at()
    }

    /// Names every one of `names` and `ips`.
    pub fn covers(&self, names: &[String], ips: &[IpAddr]) -> bool {
        names.iter().all(|n| self.dns_names.iter().any(|d| d == n)) && ips.iter().all(|ip| self.ips.contains(ip))
    }

    /// The rustls form.
    pub fn certified_key(&self, provider: &CryptoProvider) -> Result<Arc<CertifiedKey>, TlsError> {
        let chain = parse_chain(&self.chain_pem)?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| bad(format!("the private key does not parse: {e}")))?;
        let signing = provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| bad(format!("unsupported private key: {e}")))?;
        Ok(Arc::new(CertifiedKey::new(chain, signing)))
    }
}

/// Subject and names of the node's serving certificate (the kubelet's): `O=system:nodes,
/// CN=system:node:<node>`, the node name as DNS SAN and every IP as IP SAN.
fn node_params(node_name: &str, ips: &[IpAddr]) -> Result<CertificateParams, TlsError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "system:nodes");
    dn.push(DnType::CommonName, format!("system:node:{node_name}"));
    params.distinguished_name = dn;
    params.subject_alt_names =
        vec![SanType::DnsName(node_name.to_string().try_into().map_err(|e| {
            bad(format!("node name {node_name:?} is not a DNS name: {e}"))
        })?)];
    params
        .subject_alt_names
        .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    Ok(params)
}

/// A fresh ECDSA P-256 key and the CSR for the node's serving certificate (PEM).
pub fn new_csr(node_name: &str, ips: &[IpAddr]) -> Result<(String, String), TlsError> {
    let key = KeyPair::generate().map_err(|e| bad(format!("generating a key: {e}")))?;
    let params = node_params(node_name, ips)?;
    let csr = params
        .serialize_request(&key)
        .and_then(|c| c.pem())
        .map_err(|e| bad(format!("building the CSR: {e}")))?;
    Ok((key.serialize_pem(), csr))
}

/// A self-signed serving certificate valid from now for `validity`.
pub fn self_signed(node_name: &str, ips: &[IpAddr], validity: Duration) -> Result<ServingCert, TlsError> {
    let key = KeyPair::generate().map_err(|e| bad(format!("generating a key: {e}")))?;
    let mut params = node_params(node_name, ips)?;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(1);
    params.not_after = now + validity;
    let cert = params
        .self_signed(&key)
        .map_err(|e| bad(format!("self-signing: {e}")))?;
    ServingCert::from_pem(&cert.pem(), &key.serialize_pem())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips() -> Vec<IpAddr> {
        vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()]
    }

    #[test]
    fn a_self_signed_certificate_names_the_node_and_renews_at_80_percent() {
        let c = self_signed("node-a", &ips(), Duration::from_secs(1000)).unwrap();
        assert_eq!(c.dns_names, vec!["node-a".to_string()]);
        assert_eq!(c.ips, ips());
        assert!(c.covers(&["node-a".into()], &ips()));
        assert!(!c.covers(&["node-b".into()], &[]));
        let life = c.not_after.duration_since(c.not_before).unwrap();
        assert_eq!(life, Duration::from_secs(1060), "1 min of clock skew before now");
        assert_eq!(c.renew_at(), c.not_before + Duration::from_secs(848));
        assert!(c.fresh_at(SystemTime::now()));
        assert!(!c.fresh_at(c.renew_at()));
        let chain = parse_chain(&c.chain_pem).unwrap();
        assert_eq!(
            subject_of(chain[0].as_ref()),
            Some(("system:node:node-a".into(), vec!["system:nodes".into()]))
        );
        c.certified_key(&rustls::crypto::ring::default_provider()).unwrap();
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let a = self_signed("a", &[], Duration::from_secs(60)).unwrap();
        let b = self_signed("b", &[], Duration::from_secs(60)).unwrap();
        let err = ServingCert::from_pem(&a.chain_pem, &b.key_pem).unwrap_err();
        assert!(err.to_string().contains("does not belong"), "{err}");
        assert!(ServingCert::from_pem("junk", &a.key_pem).is_err());
    }

    #[test]
    fn the_csr_carries_the_kubelet_serving_subject() {
        let (key, csr) = new_csr("node-a", &ips()).unwrap();
        assert!(key.contains("PRIVATE KEY"));
        let params = rcgen::CertificateSigningRequestParams::from_pem(&csr).unwrap();
        let dn: Vec<String> = params
            .params
            .distinguished_name
            .iter()
            .map(|(t, v)| format!("{t:?}={v:?}"))
            .collect();
        assert!(dn.iter().any(|d| d.contains("system:nodes")), "{dn:?}");
        assert!(dn.iter().any(|d| d.contains("system:node:node-a")), "{dn:?}");
        assert_eq!(params.params.subject_alt_names.len(), 3);
    }
}
