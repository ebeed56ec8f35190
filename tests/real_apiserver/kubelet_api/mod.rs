//! The kubelet API through the real apiserver: `kubectl logs` (tail, since, timestamps, and a
//! follow that receives a line written after it started), `/stats/summary` and
//! `/metrics/resource` via the nodes proxy, and the refusals (anonymous → 401, a token without
//! the right → 403, bad queries → 4xx). The serving certificate comes from a CSR that
//! `kube_support::signer` approves as a cluster operator would and the controller-manager signs
//! with the cluster CA.

mod auth;
mod certificate;
mod csr_pending;
mod hostname;
mod stats;

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
    pub admin: kube::Client,
    pub ns: String,
    // Before `machine`: fields drop in order, and the daemon's log (printed when a test fails)
    // lives in the machine's directory.
    pub daemon: DaemonProcess,
    pub machine: Machine,
    _signer: signer::Signer,
    // Last: a private cluster stops when everything on it has.
    pub cluster: Cluster,
}

/// The control plane a [`Node`] lives in: the test binary's shared one, or its own.
pub enum Cluster {
    Shared(&'static KubeCluster),
    Private(Box<KubeCluster>),
}

impl std::ops::Deref for Cluster {
    type Target = KubeCluster;
    fn deref(&self) -> &KubeCluster {
        match self {
            Cluster::Shared(c) => c,
            Cluster::Private(c) => c,
        }
    }
}

async fn node_with_pod(prefix: &str) -> Option<Node> {
    node_with_pod_on(prefix, |_| {}, &[]).await
}

/// [`node_with_pod`] with more simulator settings and daemon environment.
pub async fn node_with_pod_on(
    prefix: &str,
    settings: impl FnOnce(&mut cocoon_sim::Settings),
    daemon_env: &[(&str, &str)],
) -> Option<Node> {
    let cluster = kube_support::shared().await?;
    node_in(Cluster::Shared(cluster), prefix, settings, daemon_env).await
}

/// A node in a private control plane without a controller-manager, whose serving certificates
/// the harness signs for `lifetime` (the controller-manager's signer gives nothing under ten
/// minutes, and every node of the shared cluster would renew too if its signing duration were
/// shortened).
async fn node_with_short_lived_certificates(prefix: &str, lifetime: Duration) -> Option<Node> {
    kube_support::tools_or_skip()?;
    let cluster = tokio::task::spawn_blocking(|| KubeCluster::start(kube_support::ControlPlane::ApiserverOnly))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}"));
    let mode = signer::Mode::Sign { lifetime };
    node_with_signer(Cluster::Private(Box::new(cluster)), mode, prefix, |_| {}, &[]).await
}

/// The node in `cluster`: its kubelet-serving CSRs approved, signed by the controller-manager.
async fn node_in(
    cluster: Cluster,
    prefix: &str,
    settings: impl FnOnce(&mut cocoon_sim::Settings),
    daemon_env: &[(&str, &str)],
) -> Option<Node> {
    assert!(
        cluster.has_controllers(),
        "without a controller-manager nothing signs an approved CSR"
    );
    node_with_signer(cluster, signer::Mode::Approve, prefix, settings, daemon_env).await
}

async fn node_with_signer(
    cluster: Cluster,
    mode: signer::Mode,
    prefix: &str,
    settings: impl FnOnce(&mut cocoon_sim::Settings),
    daemon_env: &[(&str, &str)],
) -> Option<Node> {
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace(prefix).await;
    let mut machine = Machine::new(prefix);
    machine.daemon_env = daemon_env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let signer = signer::start(admin.clone(), &cluster.state_dir().join("pki"), mode, &machine.node);
    machine
        .sim
        .set_settings(|s| {
            s.vm_rss_bytes = 8 << 20;
            s.vm_net_tx_bytes = 3000;
            settings(s);
        })
        .unwrap();
    seed_snapshot_on(&machine.runtime, "base", "ghcr.io/x/base:1").await;
    let daemon = machine.start_daemon(&cluster);
    let pod = managed_pod(&ns, &machine.node, "web-0", "vm-web", &[(IMAGE, "base")]);
    create_pod(&admin, &pod).await;
    wait_up(&admin, &ns, "web-0").await;
    let n = Node {
        admin,
        ns,
        machine,
        daemon,
        _signer: signer,
        cluster,
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
    let Some(node) = node_with_pod("logs").await else {
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
