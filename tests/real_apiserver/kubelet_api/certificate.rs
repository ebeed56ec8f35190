//! The kubelet port's serving certificate: requested by a CSR, signed by the cluster CA, and
//! renewed at 80 % of its life.

use super::*;

/// The certificate the kubelet port presents: (serial, notAfter).
async fn served_certificate(node: &Node) -> (String, i64) {
    use rustls_pki_types::pem::PemObject;
    let ca = std::fs::read(node.cluster.ca_cert_path()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", node.daemon.kubelet_port))
        .await
        .unwrap();
    let tls = connector
        .connect(rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .expect("the certificate verifies against the cluster CA for 127.0.0.1");
    let leaf = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).unwrap();
    (cert.raw_serial_as_string(), cert.validity().not_after.timestamp())
}

/// On its own apiserver without a controller-manager: a renewal needs a certificate of seconds,
/// which only the harness's signer issues (see `node_with_short_lived_certificates`). The
/// other kubelet API tests get theirs from the controller-manager's signer.
#[tokio::test(flavor = "multi_thread")]
async fn the_serving_certificate_comes_from_a_csr_and_is_renewed_at_80_percent_of_its_life() {
    // A 10 s certificate: renewed about 8 s after it was issued.
    let Some(node) = node_with_short_lived_certificates("csr", Duration::from_secs(10)).await else {
        return;
    };
    let (first, _) = served_certificate(&node).await;
    let csrs = Api::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>::all(node.admin.clone());
    let mine = |list: Vec<k8s_openapi::api::certificates::v1::CertificateSigningRequest>| {
        list.into_iter()
            .filter(|c| {
                let pem = String::from_utf8_lossy(&c.spec.request.0).to_string();
                rcgen::CertificateSigningRequestParams::from_pem(&pem).is_ok_and(|p| {
                    p.params
                        .distinguished_name
                        .iter()
                        .any(|(_, v)| format!("{v:?}").contains(&format!("system:node:{}", node.machine.node)))
                })
            })
            .count()
    };
    assert!(mine(csrs.list(&Default::default()).await.unwrap().items) >= 1);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while served_certificate(&node).await.0 == first {
        assert!(
            std::time::Instant::now() < deadline,
            "no renewed certificate is served\n{}",
            node.daemon.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        mine(csrs.list(&Default::default()).await.unwrap().items) >= 2,
        "a new CSR per renewal"
    );
    // Still serving, with the new one.
    assert_eq!(node.as_apiserver("/healthz").await, (200, "ok".to_string()));
    assert!(node.daemon.log().contains("renewing the serving certificate"));
}
