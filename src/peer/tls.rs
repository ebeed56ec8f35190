//! Mutual TLS of the peer tier. Both ends present their node's certificate (the kubelet-serving
//! one, or `VK_PEER_TLS_CERT`/`VK_PEER_TLS_KEY`) and check the other's against the CA of
//! `VK_PEER_CA_FILE`:
//!
//! * the server accepts a client whose certificate chains to the CA as a *serving* certificate
//!   (the kubelet-serving signer issues node certificates for server auth only, so that is the
//!   use checked; the cluster's client certificates — users, the apiserver — are not serving
//!   certificates and are refused even where the same CA signs them);
//! * the client accepts a server whose certificate chains to the CA and names the node the
//!   registry recorded as the snapshot's `from-node`: a DNS subjectAltName of that name, or the
//!   node identity `CN=system:node:<name>` a kubelet-serving certificate carries. A certificate
//!   of another node of the fleet is refused, so one compromised node cannot stand in for
//!   another.
//!
//! The peer token stays a second factor inside the TLS session. Without TLS material there is
//! no peer tier at all: never plain HTTP.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, Error, RootCertStore, ServerConfig,
    SignatureScheme,
};
use tokio_util::sync::CancellationToken;

use crate::kubelet_api::tls::ca_file::CaFile;
use crate::kubelet_api::tls::{CertSlot, certs};
use crate::listener::ServerTls;

/// The node identity a kubelet-serving certificate's subject carries.
const NODE_CN_PREFIX: &str = "system:node:";

/// The CA of `VK_PEER_CA_FILE`, and the file to follow ([`PeerTls::follow_ca_file`]).
pub fn load_ca(path: &Path) -> Result<(CaFile, RootCertStore), String> {
    CaFile::load(path.to_path_buf(), "VK_PEER_CA_FILE").map_err(|problem| {
        format!(
            "VK_PEER_CA_FILE={}: {problem}; it must hold the PEM CA that signs the nodes' peer certificates (the cluster CA for kubelet-serving certificates)",
            path.display()
        )
    })
}

/// Both ends' TLS configuration of one node, rebuilt when the CA changes ([`Self::trust`]):
/// connections made from then on check peers against the new CA.
#[derive(Clone)]
pub struct PeerTls {
    /// What the peer server's listener hands each connection.
    pub server: ServerTls,
    client: Arc<ArcSwap<ClientConfig>>,
    identity: Arc<CertSlot>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerTls")
    }
}

impl PeerTls {
    /// `identity` holds this node's certificate (kept current by its manager); `roots` is the
    /// CA every peer's certificate must chain to.
    pub fn new(identity: Arc<CertSlot>, roots: RootCertStore) -> Result<Self, String> {
        let (server, client) = configs(&identity, roots)?;
        Ok(Self {
            server: ServerTls::new(server),
            client: Arc::new(ArcSwap::new(client)),
            identity,
        })
    }

    /// Checks peers against `roots` from the next connection on (a rotated `VK_PEER_CA_FILE`).
    pub fn trust(&self, roots: RootCertStore) -> Result<(), String> {
        let (server, client) = configs(&self.identity, roots)?;
        self.server.replace(server);
        self.client.store(client);
        Ok(())
    }

    /// Trusts each new version of `file` (checked every `every`) from the next connection on,
    /// until `shutdown`: a rotated `VK_PEER_CA_FILE` needs no restart.
    pub async fn follow_ca_file(self, file: CaFile, every: Duration, shutdown: CancellationToken) {
        file.watch(every, shutdown, move |roots| self.trust(roots)).await;
    }

    /// The client configuration for a connection made now.
    pub fn client(&self) -> Arc<ClientConfig> {
        self.client.load_full()
    }

    /// The name a client asks for when it dials `node` (what the server's certificate must name).
    pub fn server_name(node: &str) -> Result<ServerName<'static>, String> {
        ServerName::try_from(node.to_string())
            .map_err(|e| format!("node name {node:?} cannot be checked against a certificate: {e}"))
    }
}

/// Both ends' configuration: this node presents `identity`, and checks peers against `roots`.
fn configs(identity: &Arc<CertSlot>, roots: RootCertStore) -> Result<(Arc<ServerConfig>, Arc<ClientConfig>), String> {
    let provider = crate::kubelet_api::tls::provider();
    let roots = Arc::new(roots);
    let client_verifier = Arc::new(PeerClients {
        roots: roots.clone(),
        hints: roots.subjects(),
        provider: provider.clone(),
    });
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("peer TLS server: {e}"))?
        .with_client_cert_verifier(client_verifier)
        .with_cert_resolver(identity.clone());
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    let server_verifier = Arc::new(RecordedNode {
        roots,
        provider: provider.clone(),
    });
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("peer TLS client: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(server_verifier)
        .with_client_cert_resolver(Arc::new(Identity(identity.clone())));
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((Arc::new(server), Arc::new(client)))
}

/// This node's certificate, offered as a client certificate.
#[derive(Debug)]
struct Identity(Arc<CertSlot>);

impl ResolvesClientCert for Identity {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<rustls::sign::CertifiedKey>> {
        self.0.current()
    }

    fn has_certs(&self) -> bool {
        self.0.is_loaded()
    }
}

/// Whether `der`'s subject is the node identity of `node` (`CN=system:node:<node>`).
fn is_node_identity(der: &[u8], node: &str) -> bool {
    certs::subject_of(der).is_some_and(|(cn, _)| cn.strip_prefix(NODE_CN_PREFIX) == Some(node))
}

/// The client's check of a peer server: the chain, then the recorded node's name.
#[derive(Debug)]
struct RecordedNode {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for RecordedNode {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        match verify_server_name(&cert, server_name) {
            Ok(()) => Ok(ServerCertVerified::assertion()),
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if matches!(server_name, ServerName::DnsName(n) if is_node_identity(end_entity, n.as_ref())) => {
                Ok(ServerCertVerified::assertion())
            }
            Err(e) => Err(e),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// The server's check of a peer client: a node's serving certificate chaining to the CA.
#[derive(Debug)]
struct PeerClients {
    roots: Arc<RootCertStore>,
    hints: Vec<DistinguishedName>,
    provider: Arc<CryptoProvider>,
}

impl ClientCertVerifier for PeerClients {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        // Checked for server auth: a node's certificate is a serving certificate.
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::time::Duration;

    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        SanType,
    };
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::kubelet_api::tls::ServingCert;
    use crate::kubelet_api::tls::ca_file::roots_of;

    struct Ca {
        pem: String,
        issuer: Issuer<'static, KeyPair>,
    }

    fn ca(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let pem = params.self_signed(&key).unwrap().pem();
        Ca {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate as the kubelet-serving signer issues it (`CN=system:node:<node>`,
    /// server auth only), with `dns` as its DNS names and 127.0.0.1.
    fn issue(ca: &Ca, cn: &str, dns: &[&str], usage: ExtendedKeyUsagePurpose) -> Arc<CertSlot> {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.distinguished_name.push(DnType::OrganizationName, "system:nodes");
        params.subject_alt_names = dns
            .iter()
            .map(|d| SanType::DnsName((*d).try_into().unwrap()))
            .chain([SanType::IpAddress("127.0.0.1".parse::<IpAddr>().unwrap())])
            .collect();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &ca.issuer).unwrap();
        let serving = ServingCert::from_pem(&cert.pem(), &key.serialize_pem()).unwrap();
        let slot = Arc::new(CertSlot::default());
        slot.set(serving.certified_key(&crate::kubelet_api::tls::provider()).unwrap());
        slot
    }

    fn node(ca: &Ca, name: &str) -> Arc<CertSlot> {
        issue(
            ca,
            &format!("system:node:{name}"),
            &[name],
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    fn tls(ca: &Ca, identity: Arc<CertSlot>) -> PeerTls {
        PeerTls::new(identity, roots_of(&ca.pem).unwrap()).unwrap()
    }

    /// One handshake over an in-memory pipe: the client dials `node`; the outcome of each end.
    async fn handshake(server: &PeerTls, client: &PeerTls, node: &str) -> (Result<(), String>, Result<(), String>) {
        let (c, s) = tokio::io::duplex(64 << 10);
        let acceptor = tokio_rustls::TlsAcceptor::from(server.server.current());
        let connector = tokio_rustls::TlsConnector::from(client.client());
        let name = PeerTls::server_name(node).unwrap();
        let serve = async move {
            let mut tls = acceptor.accept(s).await.map_err(|e| e.to_string())?;
            let mut byte = [0u8; 1];
            // TLS 1.3 sends the client's certificate with its Finished: the server's verdict
            // on it shows when the first byte is read.
            tls.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
            tls.write_all(b"k").await.map_err(|e| e.to_string())?;
            Ok::<_, String>(())
        };
        let dial = async move {
            let mut tls = connector.connect(name, c).await.map_err(|e| e.to_string())?;
            tls.write_all(b"p").await.map_err(|e| e.to_string())?;
            let mut byte = [0u8; 1];
            tls.read_exact(&mut byte).await.map_err(|e| e.to_string())?;
            Ok::<_, String>(())
        };
        let bound = Duration::from_secs(10);
        let (s, c) = tokio::join!(tokio::time::timeout(bound, serve), tokio::time::timeout(bound, dial));
        (s.expect("server side in time"), c.expect("client side in time"))
    }

    #[tokio::test]
    async fn two_nodes_of_the_fleet_authenticate_each_other() {
        let fleet = ca("fleet CA");
        let a = tls(&fleet, node(&fleet, "node-a"));
        let b = tls(&fleet, node(&fleet, "node-b"));
        assert_eq!(handshake(&a, &b, "node-a").await, (Ok(()), Ok(())));
        // A kubelet-serving certificate may name only addresses: its node identity counts.
        let ip_only = tls(
            &fleet,
            issue(&fleet, "system:node:node-d", &[], ExtendedKeyUsagePurpose::ServerAuth),
        );
        assert_eq!(handshake(&ip_only, &b, "node-d").await, (Ok(()), Ok(())));
    }

    #[tokio::test]
    async fn a_client_refuses_a_server_that_is_not_the_recorded_node() {
        let fleet = ca("fleet CA");
        let b = tls(&fleet, node(&fleet, "node-b"));
        // Another node of the fleet (its certificate is genuine) standing in for node-a.
        let c = tls(&fleet, node(&fleet, "node-c"));
        let (_, client) = handshake(&c, &b, "node-a").await;
        assert!(
            client.as_ref().unwrap_err().contains("not valid for name"),
            "{client:?}"
        );
        // A certificate naming node-a from a CA the fleet does not trust.
        let other = ca("someone's CA");
        let forged = tls(&other, node(&other, "node-a"));
        let (_, client) = handshake(&forged, &b, "node-a").await;
        assert!(client.as_ref().unwrap_err().contains("UnknownIssuer"), "{client:?}");
    }

    #[tokio::test]
    async fn a_server_refuses_clients_without_a_fleet_nodes_certificate() {
        let fleet = ca("fleet CA");
        let a = tls(&fleet, node(&fleet, "node-a"));
        // No certificate at all (nothing loaded yet).
        let anonymous = tls(&fleet, Arc::new(CertSlot::default()));
        let (server, client) = handshake(&a, &anonymous, "node-a").await;
        assert!(
            server.as_ref().unwrap_err().contains("peer sent no certificates"),
            "{server:?}"
        );
        assert!(client.is_err());
        // A node certificate of a CA the fleet does not trust.
        let other = ca("someone's CA");
        let stranger = tls(&fleet, node(&other, "node-b"));
        let (server, _) = handshake(&a, &stranger, "node-a").await;
        assert!(server.as_ref().unwrap_err().contains("UnknownIssuer"), "{server:?}");
        // A user's client certificate from the fleet's own CA is no node's serving certificate.
        let user = tls(&fleet, issue(&fleet, "jane", &[], ExtendedKeyUsagePurpose::ClientAuth));
        let (server, _) = handshake(&a, &user, "node-a").await;
        assert!(
            server
                .as_ref()
                .unwrap_err()
                .contains("extended key usage for server authentication"),
            "{server:?}"
        );
    }

    #[tokio::test]
    async fn a_rotated_ca_file_is_trusted_both_ways_from_the_next_handshake() {
        let old = ca("fleet CA");
        let new = ca("rotated fleet CA");
        let both = roots_of(&format!("{}{}", old.pem, new.pem)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.crt");
        std::fs::write(&ca_file, &old.pem).unwrap();
        let (followed, roots) = load_ca(&ca_file).unwrap();
        let a = PeerTls::new(node(&old, "node-a"), roots).unwrap();
        let stop = CancellationToken::new();
        let following = a
            .clone()
            .follow_ca_file(followed, Duration::from_millis(20), stop.clone());
        tokio::spawn(following);
        // A node that already has its certificate from the rotated CA, and trusts both.
        let b = PeerTls::new(node(&new, "node-b"), both.clone()).unwrap();
        let (server, _) = handshake(&a, &b, "node-a").await;
        assert!(server.as_ref().unwrap_err().contains("UnknownIssuer"), "{server:?}");
        let (_, client) = handshake(&b, &a, "node-b").await;
        assert!(client.as_ref().unwrap_err().contains("UnknownIssuer"), "{client:?}");

        // The operator rotates a's CA file; a follows it without a restart.
        let next = dir.path().join("ca.next");
        std::fs::write(&next, format!("{}{}", old.pem, new.pem)).unwrap();
        std::fs::rename(&next, &ca_file).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while handshake(&a, &b, "node-a").await.0.is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the rotated CA file was never followed"
            );
        }
        stop.cancel();
        assert_eq!(handshake(&a, &b, "node-a").await, (Ok(()), Ok(())), "a serving b");
        assert_eq!(handshake(&b, &a, "node-b").await, (Ok(()), Ok(())), "a dialing b");
        // The recorded-node check holds under the new CA as well.
        let (_, client) = handshake(&b, &a, "node-c").await;
        assert!(client.unwrap_err().contains("not valid for name"));
    }

    #[test]
    fn a_ca_file_that_is_not_pem_names_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, "not a certificate").unwrap();
        let e = load_ca(&path).unwrap_err();
        assert!(e.contains("VK_PEER_CA_FILE"), "{e}");
        assert!(
            load_ca(&dir.path().join("missing"))
                .unwrap_err()
                .contains("VK_PEER_CA_FILE")
        );
    }
}
