//! A node machine with one running pod (`web-0`, VM `vm-web`) whose daemon serves the kubelet
//! API with a certificate the cluster signed — through a kubelet-serving CSR that [`signer`]
//! approves as a cluster operator would (and, on a control plane without a controller-manager,
//! signs). The kubelet API tests, the streaming tests and the streaming benchmark start from
//! it; [`exec_node_with`] makes the simulator run exec'd commands for real and serve a web
//! server on the guest's address.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::{Api, PostParams};

use crate::daemon::{DaemonProcess, IMAGE, Machine, create_pod, managed_pod, wait_up};
use crate::kube_support::{self, KubeCluster, signer};
use crate::provider_support::seed_snapshot_on;

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

/// A node with `web-0` up on it in the shared cluster.
pub async fn node_with_pod(prefix: &str) -> Option<Node> {
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
pub async fn node_with_short_lived_certificates(prefix: &str, lifetime: Duration) -> Option<Node> {
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

    /// `kubectl logs web-0 EXTRA` as admin; fails the test (with the daemon's log) when kubectl does.
    pub fn logs(&self, extra: &[&str]) -> String {
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

    /// kubectl as admin, for a streaming command (no request timeout: streams last).
    pub fn kubectl_stream(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig")
            .arg(self.cluster.admin_kubeconfig_path())
            .args(["-n", &self.ns])
            .args(args)
            .env_remove("KUBECONFIG");
        c
    }

    /// `kubectl exec web-0 ARGS`, stdin from `input`: (exit code, stdout, stderr).
    pub fn exec(&self, flags: &[&str], argv: &[&str], input: Option<Vec<u8>>) -> (i32, Vec<u8>, String) {
        let mut args = vec!["exec"];
        args.extend_from_slice(flags);
        args.extend(["web-0", "--"]);
        args.extend_from_slice(argv);
        let mut child = self
            .kubectl_stream(&args)
            .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let feeder = input.map(|data| {
            let mut stdin = child.stdin.take().unwrap();
            std::thread::spawn(move || {
                let _ = stdin.write_all(&data);
            })
        });
        let out = child.wait_with_output().unwrap();
        if let Some(f) = feeder {
            f.join().unwrap();
        }
        (
            out.status.code().unwrap_or(-1),
            out.stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
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

/// A port nothing on 127.0.0.1 listens on now, for a guest's web server. Guests of tests
/// running at once no longer share addresses (each simulator root has a loopback subnet of its
/// own, `Sim::subnet`); a port of its own as well is a second fence that costs nothing.
fn guest_web_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// The port the node's guest serves its web server on.
pub fn web_port(node: &Node) -> u16 {
    node.machine.sim.settings().unwrap().guest_http_ports[0]
}

/// A node whose exec'd commands run for real and whose guest serves a web server (on
/// [`web_port`]), its daemon with `env` too.
pub async fn exec_node_with(prefix: &str, env: &[(&str, &str)]) -> Option<Node> {
    let port = guest_web_port();
    let node = node_with_pod_on(prefix, |s| s.guest_http_ports = vec![port], env).await?;
    node.machine
        .sim
        .on_exec(cocoon_sim::ExecRule {
            run: true,
            ..Default::default()
        })
        .unwrap();
    Some(node)
}

/// The daemon's log without its colours.
pub fn plain_log(node: &Node) -> String {
    let log = node.daemon.log();
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Pids of processes whose argv is exactly `argv`.
pub fn processes(argv: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}
