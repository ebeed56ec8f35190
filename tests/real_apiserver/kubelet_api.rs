//! The kubelet API through the real apiserver: `kubectl logs` (tail, since, timestamps, and a
//! follow that receives a line written after it started), `/stats/summary` and
//! `/metrics/resource` via the nodes proxy, and the refusals (anonymous → 401, a token without
//! the right → 403, bad queries → 4xx). The serving certificate comes from a CSR that
//! `kube_support::signer` approves and signs with the cluster CA, as a controller-manager would.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::{Api, PostParams};
use serde::Deserialize;

use crate::daemon::*;
use crate::kube_support::{self, KubeCluster};
use crate::provider_support::seed_snapshot_on;
use crate::signer;

/// A node with one running pod, its daemon serving the kubelet API with a cluster-signed
/// certificate.
pub struct Node {
    pub cluster: &'static KubeCluster,
    pub admin: kube::Client,
    pub ns: String,
    // Before `machine`: fields drop in order, and the daemon's log (printed when a test fails)
    // lives in the machine's directory.
    pub daemon: DaemonProcess,
    pub machine: Machine,
    _signer: signer::Signer,
}

async fn node_with_pod(prefix: &str, lifetime: Duration) -> Option<Node> {
    node_with_pod_on(prefix, lifetime, |_| {}, &[]).await
}

/// [`node_with_pod`] with more simulator settings and daemon environment.
pub async fn node_with_pod_on(
    prefix: &str,
    lifetime: Duration,
    settings: impl FnOnce(&mut cocoon_sim::Settings),
    daemon_env: &[(&str, &str)],
) -> Option<Node> {
    let cluster = kube_support::shared().await?;
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace(prefix).await;
    let mut machine = Machine::new(prefix);
    machine.daemon_env = daemon_env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let signer = signer::start(admin.clone(), &cluster.state_dir().join("pki"), lifetime, &machine.node);
    machine
        .sim
        .set_settings(|s| {
            s.vm_rss_bytes = 8 << 20;
            s.vm_net_tx_bytes = 3000;
            settings(s);
        })
        .unwrap();
    seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
    let daemon = machine.start_daemon(cluster);
    let pod = managed_pod(&ns, &machine.node, "web-0", "vm-web", &[(IMAGE, "base")]);
    create_pod(&admin, &pod).await;
    wait_up(&admin, &ns, "web-0").await;
    let n = Node {
        cluster,
        admin,
        ns,
        machine,
        daemon,
        _signer: signer,
    };
    n.wait_serving().await;
    Some(n)
}

impl Node {
    pub fn kubectl(&self, args: &[&str]) -> std::process::Output {
        self.cluster.kubectl(args)
    }

    /// GET `path` on the kubelet port as the apiserver does: with its kubelet-client
    /// certificate (`--kubelet-client-certificate`, CN=kube-apiserver-kubelet-client).
    ///
    /// Not through `/api/v1/nodes/NODE/proxy/…`: the apiserver refuses to proxy to a node
    /// whose address is loopback ("address not allowed"), and every address here is loopback.
    /// `kubectl logs` (pods/log) has no such check and goes through the apiserver below.
    pub async fn as_apiserver(&self, path: &str) -> (u16, String) {
        let mut pem = std::fs::read(self.cluster.kubelet_client_cert_path()).unwrap();
        pem.extend(std::fs::read(self.cluster.kubelet_client_key_path()).unwrap());
        let client = self
            .client_builder()
            .identity(reqwest::Identity::from_pem(&pem).unwrap())
            .build()
            .unwrap();
        let r = client
            .get(self.url(path))
            .send()
            .await
            .expect("the kubelet API answers");
        (r.status().as_u16(), r.text().await.unwrap())
    }

    async fn wait_serving(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let client = self.direct();
            if let Ok(r) = client.get(self.url("/healthz")).send().await {
                // Up: the TLS handshake worked with a certificate the cluster CA signed.
                assert_eq!(r.status(), 401, "an anonymous /healthz");
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the kubelet API does not serve a cluster-signed certificate\n--- daemon log ---\n{}",
                self.daemon.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn logs(&self, extra: &[&str]) -> String {
        let mut args = vec!["logs", "-n", &self.ns, "web-0"];
        args.extend_from_slice(extra);
        let out = self.kubectl(&args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.daemon.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn metric(&self, name: &str) -> Option<f64> {
        let text = self.daemon.scrape_metrics()?;
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
    }

    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        let ca = std::fs::read(self.cluster.ca_cert_path()).unwrap();
        reqwest::Client::builder().tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
    }

    /// An HTTPS client of the kubelet port that verifies it against the cluster CA.
    pub fn direct(&self) -> reqwest::Client {
        self.client_builder().build().unwrap()
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.daemon.kubelet_port)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_logs_tails_filters_timestamps_and_follows() {
    let Some(node) = node_with_pod("logs", Duration::from_secs(3600)).await else {
        return;
    };
    for i in 0..5 {
        node.machine
            .sim
            .append_vm_log("vm-web", &format!("guest line {i}"))
            .unwrap();
    }
    let all = node.logs(&[]);
    assert!(all.contains("VM vm-web booted: running"), "{all}");
    assert!(all.contains("guest line 4"), "{all}");

    let tail = node.logs(&["--tail=2"]);
    assert_eq!(tail.lines().count(), 2, "{tail}");
    assert!(tail.lines().last().unwrap().ends_with("guest line 4"), "{tail}");

    // Timestamps: RFC 3339, from each line's own (cloud-hypervisor elapsed-time) prefix.
    let stamped = node.logs(&["--timestamps", "--tail=1"]);
    let (stamp, line) = stamped.trim_end().split_once(' ').unwrap();
    let t = chrono::DateTime::parse_from_rfc3339(stamp).unwrap_or_else(|e| panic!("{stamp}: {e}"));
    let age = chrono::Utc::now().signed_duration_since(t);
    assert!(age.num_seconds().abs() < 60, "a fresh line's time: {stamped}");
    assert!(line.ends_with("guest line 4"), "{stamped}");

    // --since: the boot lines are older than the lines written from now on.
    let vm_age_start = std::time::Instant::now();
    eventually(30, "the VM is 3 s old", || async {
        vm_age_start.elapsed() > Duration::from_secs(3)
    })
    .await;
    node.machine.sim.append_vm_log("vm-web", "fresh line").unwrap();
    let recent = node.logs(&["--since=2s"]);
    assert!(recent.contains("fresh line"), "{recent}");
    assert!(!recent.contains("booted"), "older lines are left out: {recent}");

    // -f: a line written after kubectl started arrives; kubectl leaving ends the stream.
    let mut follow = Command::new("kubectl")
        .args(["--kubeconfig"])
        .arg(node.cluster.admin_kubeconfig_path())
        .args(["logs", "-f", "--tail=1", "-n", &node.ns, "web-0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = follow.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(30)).expect("the tail line");
    assert!(first.ends_with("fresh line"), "{first}");
    node.machine
        .sim
        .append_vm_log("vm-web", "written while following")
        .unwrap();
    let next = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the new line, streamed");
    assert!(next.ends_with("written while following"), "{next}");
    assert_eq!(
        node.metric("cocoon_vk_vm_kubelet_api_log_follows")
            .or(node.metric("cocoon_vk_kubelet_api_log_follows")),
        Some(1.0)
    );
    follow.kill().unwrap();
    follow.wait().unwrap();
    eventually(30, "the follow ends when the client leaves", || async {
        node.metric("cocoon_vk_kubelet_api_log_follows") == Some(0.0)
    })
    .await;

    // A follow ends when the VM goes.
    let mut follow = Command::new("kubectl")
        .args(["--kubeconfig"])
        .arg(node.cluster.admin_kubeconfig_path())
        .args(["logs", "-f", "--tail=1", "-n", &node.ns, "web-0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually(30, "the second follow is served", || async {
        node.metric("cocoon_vk_kubelet_api_log_follows") == Some(1.0)
    })
    .await;
    node.machine.sim.flip_vm("vm-web", cocoon_sim::Flip::Deleted).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = follow.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kubectl logs -f still running after the VM went"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "the stream ended cleanly: {status:?}");
}

// The kubelet's stats types, as metrics-server decodes them (the fields it reads).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Summary {
    node: NodeStats,
    pods: Vec<PodStats>,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeStats {
    node_name: String,
    cpu: CpuStats,
    memory: MemoryStats,
    fs: FsStats,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PodStats {
    pod_ref: PodRef,
    containers: Vec<ContainerStats>,
    cpu: CpuStats,
    memory: MemoryStats,
    network: Option<NetworkStats>,
    #[serde(rename = "ephemeral-storage")]
    ephemeral_storage: FsStats,
}
#[derive(Deserialize)]
struct PodRef {
    name: String,
    namespace: String,
    uid: String,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerStats {
    name: String,
    cpu: CpuStats,
    memory: MemoryStats,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CpuStats {
    time: String,
    usage_core_nano_seconds: u64,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MemoryStats {
    working_set_bytes: u64,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkStats {
    name: String,
    rx_bytes: u64,
    tx_bytes: u64,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct FsStats {
    used_bytes: Option<u64>,
    capacity_bytes: Option<u64>,
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_summary_and_resource_metrics_through_the_nodes_proxy() {
    let Some(node) = node_with_pod("stats", Duration::from_secs(3600)).await else {
        return;
    };
    node.machine.sim.set_cpu_stat("vm-web", 2_500_000, 300_000, 4).unwrap();
    let pod = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(node.admin.clone(), &node.ns)
        .get("web-0")
        .await
        .unwrap();
    // The sample is cached for 2 s: wait for one taken after the write.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let s = loop {
        let (status, body) = node.as_apiserver("/stats/summary").await;
        assert_eq!(status, 200, "{body}");
        let s: Summary = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        if s.pods.iter().any(|p| p.cpu.usage_core_nano_seconds == 2_500_000_000) {
            break s;
        }
        assert!(std::time::Instant::now() < deadline, "the VM's CPU never shows: {body}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(s.node.node_name, node.machine.node);
    assert!(s.node.cpu.usage_core_nano_seconds > 0 && s.node.memory.working_set_bytes > 0);
    assert!(s.node.fs.capacity_bytes.unwrap_or(0) > 0);
    assert_eq!(s.pods.len(), 1, "one pod on the node");
    let p = &s.pods[0];
    assert_eq!(
        (
            p.pod_ref.namespace.as_str(),
            p.pod_ref.name.as_str(),
            p.pod_ref.uid.as_str()
        ),
        (node.ns.as_str(), "web-0", pod.metadata.uid.as_deref().unwrap())
    );
    assert_eq!(p.containers[0].name, "agent");
    assert_eq!(p.containers[0].cpu.usage_core_nano_seconds, 2_500_000_000);
    assert!(!p.cpu.time.is_empty());
    assert!(
        p.memory.working_set_bytes >= 8 << 20 && p.containers[0].memory.working_set_bytes == p.memory.working_set_bytes,
        "the VMM's RSS holds the 8 MiB it touched: {}",
        p.memory.working_set_bytes
    );
    assert!(
        p.ephemeral_storage.used_bytes.unwrap_or(0) >= 64 * 1024,
        "the COW disk's allocation"
    );
    let vm = node.machine.vms_named("vm-web").await.remove(0);
    if unsafe { libc::geteuid() } == 0 {
        let net = p.network.as_ref().expect("the TAP's traffic");
        assert_eq!(net.name, vm.network_configs[0].tap);
        assert_eq!(
            (net.tx_bytes, net.rx_bytes),
            (3000, 0),
            "what the guest sent on its TAP"
        );
    }

    let (status, text) = node.as_apiserver("/metrics/resource").await;
    assert_eq!(status, 200, "{text}");
    let series = |name: &str| -> Vec<(String, f64, i64)> {
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .map(|l| {
                let mut parts = l.rsplitn(3, ' ');
                let ts = parts.next().unwrap().parse().unwrap();
                let v = parts.next().unwrap().parse().unwrap();
                (parts.next().unwrap().to_string(), v, ts)
            })
            .collect()
    };
    let labels = format!(r#"{{namespace="{}",pod="web-0"}}"#, node.ns);
    let pod_cpu = series("pod_cpu_usage_seconds_total");
    assert_eq!(pod_cpu.len(), 1, "{text}");
    assert_eq!(pod_cpu[0].0, format!("pod_cpu_usage_seconds_total{labels}"));
    assert_eq!(pod_cpu[0].1, 2.5);
    let now_ms = chrono::Utc::now().timestamp_millis();
    assert!(
        (now_ms - pod_cpu[0].2).abs() < 60_000,
        "a sample timestamp: {}",
        pod_cpu[0].2
    );
    let c = series("container_cpu_cfs_throttled_periods_total");
    assert_eq!(c[0].1, 4.0, "{text}");
    assert!(series("container_memory_working_set_bytes")[0].1 >= (8 << 20) as f64);
    assert_eq!(series("node_cpu_usage_seconds_total").len(), 1);
    assert!(text.contains("resource_scrape_error 0"), "{text}");

    // The same sample on :9091.
    let m = node.daemon.scrape_metrics().unwrap();
    assert!(m.contains(&format!(
        r#"cocoon_vk_vm_cpu_seconds_total{{backend="cloud-hypervisor",namespace="{}",pod="web-0",vm="vm-web"}} 2.5"#,
        node.ns
    )), "{m}");
}

/// A ServiceAccount in `ns` bound to a ClusterRole of `rules`; its token.
pub async fn token_with(node: &Node, name: &str, rules: Vec<PolicyRule>) -> String {
    let role_name = format!("{}-{name}", node.ns);
    Api::<ClusterRole>::all(node.admin.clone())
        .create(
            &PostParams::default(),
            &ClusterRole {
                metadata: kube::api::ObjectMeta {
                    name: Some(role_name.clone()),
                    ..Default::default()
                },
                rules: Some(rules),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let sa = k8s_openapi::api::core::v1::ServiceAccount {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(node.admin.clone(), &node.ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(node.admin.clone())
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: kube::api::ObjectMeta {
                    name: Some(role_name.clone()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "ClusterRole".into(),
                    name: role_name,
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: name.into(),
                    namespace: Some(node.ns.clone()),
                    ..Default::default()
                }]),
            },
        )
        .await
        .unwrap();
    node.cluster
        .kubectl_checked(&["create", "token", name, "-n", &node.ns])
        .unwrap()
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn anonymous_and_unauthorized_callers_are_refused_and_bad_queries_get_a_clear_4xx() {
    let Some(node) = node_with_pod("refuse", Duration::from_secs(3600)).await else {
        return;
    };
    let client = node.direct();
    // The serving certificate verifies against the cluster CA for 127.0.0.1 (reqwest checks).
    let anon = client
        .get(node.url("/stats/summary"))
        .send()
        .await
        .expect("TLS with the cluster-signed certificate");
    assert_eq!(anon.status(), 401);
    for path in ["/healthz", "/pods", "/containerLogs/x/y/z", "/nothing-here"] {
        assert_eq!(client.get(node.url(path)).send().await.unwrap().status(), 401, "{path}");
    }
    let bad = client
        .get(node.url("/pods"))
        .bearer_auth("not-a-token")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 401);

    let nobody = token_with(&node, "nobody", vec![]).await;
    let r = client
        .get(node.url("/stats/summary"))
        .bearer_auth(&nobody)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let body = r.text().await.unwrap();
    assert!(
        body.contains(&format!("user=system:serviceaccount:{}:nobody", node.ns))
            && body.contains("resource=nodes")
            && body.contains("subresource(s)=[stats]"),
        "{body}"
    );

    // nodes/proxy but not nodes/stats: /pods is allowed (its fallback), /stats is not.
    let proxy_only = token_with(
        &node,
        "proxy-only",
        vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["nodes/proxy".into()]),
            verbs: vec!["get".into()],
            ..Default::default()
        }],
    )
    .await;
    // RBAC reaches the authorizer through an informer: wait for the binding to count.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let pods = loop {
        let r = client
            .get(node.url("/pods"))
            .bearer_auth(&proxy_only)
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            break r.text().await.unwrap();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "proxy-only still refused /pods: {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let pods: serde_json::Value = serde_json::from_str(&pods).unwrap();
    assert_eq!(pods["kind"], "PodList");
    assert_eq!(pods["items"][0]["metadata"]["name"], "web-0");
    let r = client
        .get(node.url("/stats/summary"))
        .bearer_auth(&proxy_only)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // Bad queries get a 4xx that says what is wrong (and the daemon goes on serving).
    for (path, status, fragment) in [
        (
            format!("/containerLogs/{}/web-0/agent?tailLines=-1", node.ns),
            400,
            "tailLines",
        ),
        (
            format!("/containerLogs/{}/web-0/agent?limitBytes=0", node.ns),
            400,
            "limitBytes",
        ),
        (
            format!(
                "/containerLogs/{}/web-0/agent?sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z",
                node.ns
            ),
            400,
            "at most one of sinceTime or sinceSeconds",
        ),
        (format!("/containerLogs/{}/nope/agent", node.ns), 404, "does not exist"),
        (
            format!("/containerLogs/{}/web-0/other", node.ns),
            404,
            "containers: agent",
        ),
        ("/no/such/endpoint".to_string(), 404, "not served"),
    ] {
        let (got, body) = node.as_apiserver(&path).await;
        assert_eq!(got, status, "{path}: {body}");
        assert!(body.contains(fragment), "{path}: {body}");
    }
    assert_eq!(node.as_apiserver("/healthz").await, (200, "ok".to_string()));
}

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

#[tokio::test(flavor = "multi_thread")]
async fn the_serving_certificate_comes_from_a_csr_and_is_renewed_at_80_percent_of_its_life() {
    // A 10 s certificate: renewed about 8 s after it was issued.
    let Some(node) = node_with_pod("csr", Duration::from_secs(10)).await else {
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
