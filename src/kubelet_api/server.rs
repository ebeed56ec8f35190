//! The TLS listener: serves the kubelet API through the daemon's listener (connection cap, TLS
//! handshake, header and idle deadlines: [`crate::listener`]) and puts the verified client
//! certificate's identity on each request, over HTTP/1.1 (with upgrades) and HTTP/2.

use std::sync::Arc;

use axum::Router;
use axum::http::Request;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::auth::{PeerCertificate, UserInfo};
use super::tls::certs;
use crate::listener::{ClientCertificates, Limits, Listener, ServerTls};

/// The identity of a verified client certificate: its subject's CN and organisations.
fn identity(chain: &ClientCertificates) -> Option<UserInfo> {
    let (cn, orgs) = certs::subject_of(chain.leaf()?.as_ref())?;
    Some(UserInfo::from_certificate(&cn, &orgs))
}

/// `app` with the client certificate's identity on each request that came with one (rustls
/// has verified the chain against `VK_CLIENT_CA_FILE` before any request is read). The whole
/// router is wrapped, so its fallback and its 405 answers see the identity as well.
fn with_identity(app: Router) -> Router {
    let identified = app.map_request(|mut req: Request<axum::body::Body>| {
        if let Some(user) = req.extensions().get::<ClientCertificates>().and_then(identity) {
            req.extensions_mut().insert(PeerCertificate(user));
        }
        req
    });
    Router::new().fallback_service(identified)
}

/// Serves `app` on `tcp` through `listener` (the kubelet API's TLS configuration and limits)
/// until `shutdown`, then lets open requests finish (bounded).
pub async fn run(tcp: TcpListener, listener: Arc<Listener>, app: Router, shutdown: CancellationToken) {
    listener.serve(tcp, with_identity(app), shutdown).await;
}

/// The kubelet API's listener: TLS with `tls` (as it is when each connection comes), within
/// `limits`.
pub fn listener(tls: ServerTls, limits: Limits) -> Arc<Listener> {
    Listener::new("kubelet API", limits, Some(tls))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use rustls::{DigitallySignedStruct, SignatureScheme};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::time::Instant;

    use super::super::tls::{self, CertSlot};
    use super::*;

    /// A client that takes any server certificate: the flood is about what the listener holds,
    /// not about who it is.
    #[derive(Debug)]
    struct AnyServer;

    impl ServerCertVerifier for AnyServer {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: UnixTime,
        ) -> Result<ServerCertVerified, rustls::Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }

        fn verify_tls13_signature(
            &self,
            _: &[u8],
            _: &CertificateDer<'_>,
            _: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            Ok(HandshakeSignatureValid::assertion())
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            tls::provider().signature_verification_algorithms.supported_schemes()
        }
    }

    /// A TLS half-request: the handshake, then `GET / HTTP/1.1\r\n` and nothing more; returns
    /// whether the handshake was answered (a connection refused at the cap is closed before)
    /// and how long until the server closed the connection, counted from the connect.
    async fn tls_half_request(addr: std::net::SocketAddr, bound: Duration) -> (bool, Duration) {
        let config = rustls::ClientConfig::builder_with_provider(tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer))
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let opened = Instant::now();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("node-a").unwrap();
        let closed = async {
            // A connection refused at the cap ends in the handshake: that is a close too.
            let Ok(mut c) = connector.connect(name, tcp).await else {
                return (false, opened.elapsed());
            };
            let _ = c.write_all(b"GET / HTTP/1.1\r\n").await;
            let mut buf = [0u8; 1024];
            loop {
                match c.read(&mut buf).await {
                    Ok(0) | Err(_) => return (true, opened.elapsed()),
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(bound, closed)
            .await
            .unwrap_or_else(|_| panic!("a TLS half-request is still open after {bound:?}"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tls_half_requests_are_closed_at_the_header_deadline_and_capped() {
        let slot = Arc::new(CertSlot::default());
        let ip = "127.0.0.1".parse().unwrap();
        let cert = tls::certs::self_signed("node-a", &[ip], Duration::from_secs(3600)).unwrap();
        slot.set(cert.certified_key(&tls::provider()).unwrap());
        let config = tls::server_config(slot, None).unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let app = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let limits = Limits {
            header_timeout: Duration::from_secs(1),
            ..Limits::with_cap(50)
        };
        let server = Listener::new("kubelet API", limits, Some(config.into()));
        let stop = CancellationToken::new();
        tokio::spawn(run(tcp, server.clone(), app, stop.clone()));
        let flood: Vec<_> = (0..300)
            .map(|_| tokio::spawn(tls_half_request(addr, Duration::from_secs(15))))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.open_connections() < 50 {
            assert!(Instant::now() < deadline, "the listener never held 50 connections");
            tokio::task::yield_now().await;
        }
        let mut held = Vec::new();
        for c in flood {
            let (answered, closed) = c.await.unwrap();
            if answered {
                held.push(closed);
            }
        }
        // Every connection past the cap was closed before its handshake; every other one was
        // held until the header deadline, and closed then.
        assert_eq!(held.len() + server.refused_connections() as usize, 300);
        assert!(held.len() >= 50, "{} connections were held", held.len());
        assert!(
            held.iter()
                .all(|d| *d >= limits.header_timeout && *d < limits.header_timeout * 3),
            "a held connection is closed at about the header deadline: {held:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.open_connections() > 0 {
            assert!(Instant::now() < deadline, "slots still taken");
            tokio::task::yield_now().await;
        }
        stop.cancel();
    }

    /// A new CA (PEM), a client certificate it signed (`CN=cn`) and that certificate's key.
    fn client_of(
        ca_name: &str,
        cn: &str,
    ) -> (
        String,
        CertificateDer<'static>,
        rustls::pki_types::PrivateKeyDer<'static>,
    ) {
        use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::default();
        ca.distinguished_name.push(DnType::CommonName, ca_name);
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::default();
        leaf.distinguished_name.push(DnType::CommonName, cn);
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = leaf.signed_by(&key, &issuer).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        (ca_pem, cert.der().clone(), key)
    }

    /// `GET /whoami` with the client certificate `cert`: the user the listener identified, or
    /// the TLS or HTTP failure.
    async fn whoami(
        addr: std::net::SocketAddr,
        cert: &CertificateDer<'static>,
        key: &rustls::pki_types::PrivateKeyDer<'static>,
    ) -> Result<String, String> {
        let config = rustls::ClientConfig::builder_with_provider(tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer))
            .with_client_auth_cert(vec![cert.clone()], key.clone_key())
            .unwrap();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("node-a").unwrap();
        let mut c = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        c.write_all(b"GET /whoami HTTP/1.1\r\nHost: node-a\r\nConnection: close\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut answer = String::new();
        c.read_to_string(&mut answer).await.map_err(|e| e.to_string())?;
        Ok(answer.rsplit("\r\n\r\n").next().unwrap_or_default().to_string())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rotated_client_ca_file_is_trusted_from_the_next_connection_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let ca_path = dir.path().join("client-ca.crt");
        let (old_ca, _, _) = client_of("cluster CA", "unused");
        let (new_ca, apiserver, apiserver_key) = client_of("rotated cluster CA", "kube-apiserver-kubelet-client");
        std::fs::write(&ca_path, &old_ca).unwrap();

        let slot = Arc::new(CertSlot::default());
        let ip = "127.0.0.1".parse().unwrap();
        let cert = tls::certs::self_signed("node-a", &[ip], Duration::from_secs(3600)).unwrap();
        slot.set(cert.certified_key(&tls::provider()).unwrap());
        let (followed, roots) = tls::load_client_ca(&ca_path).unwrap();
        let config = ServerTls::new(tls::server_config(slot.clone(), Some(roots)).unwrap());
        let stop = CancellationToken::new();
        tokio::spawn(tls::watch_client_ca(
            followed,
            slot,
            config.clone(),
            Duration::from_millis(20),
            stop.clone(),
        ));
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let app = Router::new().route(
            "/whoami",
            axum::routing::get(|req: Request<axum::body::Body>| async move {
                req.extensions()
                    .get::<PeerCertificate>()
                    .map_or("anonymous".to_string(), |p| p.0.name.clone())
            }),
        );
        tokio::spawn(run(tcp, listener(config, Limits::with_cap(16)), app, stop.clone()));

        // The new CA's client is refused while the file names only the old CA.
        let refused = whoami(addr, &apiserver, &apiserver_key).await;
        assert!(refused.as_ref().is_err_and(|e| e.contains("UnknownCA")), "{refused:?}");

        // The rotation writes both CAs, as an operator does while clients move over.
        let next = dir.path().join("client-ca.next");
        std::fs::write(&next, format!("{old_ca}{new_ca}")).unwrap();
        std::fs::rename(&next, &ca_path).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match whoami(addr, &apiserver, &apiserver_key).await {
                Ok(user) => {
                    assert_eq!(user, "kube-apiserver-kubelet-client");
                    break;
                }
                Err(e) => assert!(Instant::now() < deadline, "still refused after the rotation: {e}"),
            }
        }
        stop.cancel();
    }
}
