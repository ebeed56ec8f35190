//! A fleet's peer CA for the peer-tier tests: node certificates as the kubelet-serving signer
//! issues them (`CN=system:node:<node>`, `O=system:nodes`, the node's name and 127.0.0.1 as
//! subjectAltNames, server auth only), and each node's [`PeerTls`].

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType,
};
use vk_cocoon::kubelet_api::tls::ca_file::roots_of;
use vk_cocoon::kubelet_api::tls::{CertSlot, ServingCert, provider};
use vk_cocoon::peer::PeerTls;

pub struct FleetCa {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl FleetCa {
    pub fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// `node`'s serving certificate, signed by this CA.
    pub fn node_cert(&self, node: &str) -> Arc<CertSlot> {
        let (cert, key) = self.node_pem(node);
        let serving = ServingCert::from_pem(&cert, &key).unwrap();
        let slot = Arc::new(CertSlot::default());
        slot.set(serving.certified_key(&provider()).unwrap());
        slot
    }

    /// `node`'s serving certificate and its private key, PEM (for a daemon's files).
    pub fn node_pem(&self, node: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("system:node:{node}"));
        params.distinguished_name.push(DnType::OrganizationName, "system:nodes");
        params.subject_alt_names = vec![
            SanType::DnsName(node.try_into().unwrap()),
            SanType::IpAddress("127.0.0.1".parse::<IpAddr>().unwrap()),
        ];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// The peer TLS of a node presenting `identity` and trusting this CA.
    pub fn tls_with(&self, identity: Arc<CertSlot>) -> PeerTls {
        PeerTls::new(identity, roots_of(&self.pem).unwrap()).unwrap()
    }

    /// The peer TLS of `node`, with a certificate of this CA.
    pub fn node_tls(&self, node: &str) -> PeerTls {
        self.tls_with(self.node_cert(node))
    }
}
