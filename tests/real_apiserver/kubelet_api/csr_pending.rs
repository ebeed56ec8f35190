//! A cluster where nothing approves kubelet-serving CSRs (no approver runs by default): the
//! kubelet API cannot start until an operator approves the node's request. The wait is shown
//! where an operator looks — a Node condition and a Warning Event naming the CSR and the
//! `kubectl certificate approve` to run — and clears once the certificate is issued.

use k8s_openapi::api::core::v1::{Node as KubeNode, NodeCondition};

use super::*;

const CONDITION: &str = "KubeletServingCertificate";

/// Polls `probe` until it gives a value (at most `secs`).
async fn until<T, F, Fut>(secs: u64, what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {secs} s waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn serving_condition(admin: &kube::Client, node: &str) -> Option<NodeCondition> {
    let node = Api::<KubeNode>::all(admin.clone()).get_opt(node).await.ok()??;
    node.status?.conditions?.into_iter().find(|c| c.type_ == CONDITION)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pending_serving_csr_shows_on_the_node_until_it_is_approved() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let admin = cluster.admin_client().await;
    // No signer: nothing approves or signs this node's CSR until the test does.
    let machine = Machine::new("csr-wait");
    let daemon = machine.start_daemon(cluster);

    let waiting = until(
        60,
        "the Node says its serving certificate waits for approval",
        || async {
            serving_condition(&admin, &machine.node)
                .await
                .filter(|c| c.status == "False" && c.reason.as_deref() == Some("CSRPending"))
        },
    )
    .await;
    let message = waiting.message.unwrap_or_default();
    let csr = message
        .split("kubectl certificate approve ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).next())
        .unwrap_or_else(|| panic!("the condition names the command to run: {message}"))
        .to_string();
    assert!(csr.starts_with("csr-"), "{message}");
    let csrs = Api::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>::all(admin.clone());
    let request = csrs.get(&csr).await.expect("the named CSR exists");
    assert_eq!(request.spec.signer_name, "kubernetes.io/kubelet-serving");

    eventually(30, "a Warning Event on the Node names the CSR", || async {
        events_about(&admin, "default", &machine.node)
            .await
            .iter()
            .any(|(t, reason, note)| {
                t == "Warning" && reason == "CSRPending" && note.contains(&format!("kubectl certificate approve {csr}"))
            })
    })
    .await;
    // Nothing serves yet.
    let port = daemon.kubelet_port;
    assert!(
        tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok(),
        "the port is bound while the certificate is awaited"
    );

    // The operator approves, as the condition says; the cluster's controller-manager signs the
    // approved request.
    cluster
        .kubectl_checked(&["certificate", "approve", &csr])
        .expect("kubectl certificate approve");

    let issued = until(60, "the condition clears once the certificate is issued", || async {
        serving_condition(&admin, &machine.node)
            .await
            .filter(|c| c.status == "True")
    })
    .await;
    assert_eq!(issued.reason.as_deref(), Some("CertificateIssued"), "{issued:?}");
    assert!(issued.message.unwrap_or_default().contains(&csr));
    eventually(30, "a Normal Event says the certificate was issued", || async {
        events_about(&admin, "default", &machine.node)
            .await
            .iter()
            .any(|(t, reason, note)| t == "Normal" && reason == "CertificateIssued" && note.contains(&csr))
    })
    .await;

    // And the kubelet API serves, with the cluster-signed certificate.
    let ca = std::fs::read(cluster.ca_cert_path()).unwrap();
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
        .build()
        .unwrap();
    let answered = until(30, "the kubelet API answers over TLS", || async {
        client
            .get(format!("https://127.0.0.1:{port}/healthz"))
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    })
    .await;
    assert_eq!(answered, 401, "an anonymous /healthz, over a verified TLS connection");
    drop(daemon);
}
