//! A real Kubernetes control plane for tests: kube-apiserver, kube-scheduler and
//! kube-controller-manager v1.36 + etcd 3.6 from the project's tools folder
//! (`../shared/tools/kubernetes` beside the repository, or `$VK_KUBE_TOOLS_DIR`), started by the
//! folder's own `start.sh` on free loopback ports with its state in a temporary directory, and
//! the daemon's identity made from `deploy/rbac.yaml`.
//!
//! ```ignore
//! let Some(cluster) = kube_support::shared().await else { return }; // skipped: tools missing
//! let admin = cluster.admin_client().await;         // system:masters
//! let daemon = cluster.daemon_client().await;       // ServiceAccount cocoon-system/vk-cocoon, deploy/rbac.yaml
//! let ns = cluster.namespace("my-test").await;      // a fresh namespace with its `default` ServiceAccount
//! cluster.kubectl(&["get", "pods", "-n", &ns]);      // kubectl as admin
//! // `vk-cocoon run` as a process: KUBECONFIG=cluster.daemon_kubeconfig_path()
//! ```
//!
//! * [`shared`] gives the one cluster of a test binary (started on first use, ~6 s, ~500 MB):
//!   tests share it and keep apart by namespace, node name ([`unique`]) and node pool. It is a
//!   whole control plane ([`ControlPlane::Full`]): pods without a node are placed by the
//!   scheduler, approved kubelet-serving CSRs are signed by the controller-manager, namespaces
//!   get their `default` ServiceAccount from it, ownerReferences are garbage-collected, and a
//!   node whose Lease stops being renewed is marked `Unknown` and tainted `unreachable`.
//! * [`shared_apiserver_only`] and [`KubeCluster::start`] with [`ControlPlane::ApiserverOnly`]
//!   give one with nothing but the apiserver and etcd, for tests that need no controller acting
//!   behind their back (the fake apiserver's semantics tests compare API behaviour alone; a
//!   test that signs its own short-lived certificates). [`KubeCluster::start`] gives a private
//!   cluster, stopped when dropped.
//! * [`operator::Operator`]: the real cocoon-operator as a process against a cluster.
//! * Without the tools folder the tests are skipped with one line on stderr, except with
//!   `CI=true`, where a missing folder is a failure.
//! * Exactly the processes `start.sh` started are stopped — by its `stop.sh`, run by a small
//!   watchdog child that waits for this process to close a pipe. So they also stop when a test
//!   panics, when the shared cluster (a static, never dropped) outlives the last test, and when
//!   the test binary is killed.
//! * Certificates: [`KubeCluster::ca_cert_path`] (the cluster CA, which also signs the client
//!   certificate the apiserver presents to kubelets, [`KubeCluster::kubelet_client_cert_path`]),
//!   [`KubeCluster::node_kubeconfig`] (a `system:node:NAME` identity, the Node authorizer's).
//!
//! Blocking calls (`start`, `kubectl`, minting identities) run external commands; they take tens of
//! milliseconds except `start`. This module builds without the crate's `daemon` feature (on kube,
//! k8s-openapi, tokio and tempfile), so the fake apiserver's semantics tests run against it too.

pub mod operator;
pub mod signer;
pub mod tools;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};

pub use tools::Watchdog;

use crate::repo_root;

/// Overrides where the tools folder is (default: `<repo>/../shared/tools/kubernetes`).
pub const TOOLS_ENV: &str = tools::KUBE_TOOLS_ENV;
/// The namespace and ServiceAccount `deploy/rbac.yaml` binds its ClusterRole to.
pub const DAEMON_NAMESPACE: &str = "cocoon-system";
pub const DAEMON_SERVICE_ACCOUNT: &str = "vk-cocoon";
/// The node identity `start.sh` makes a kubeconfig for (others are minted on demand).
pub const DEFAULT_NODE: &str = "cocoon-node-1";

/// Which processes a cluster runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlPlane {
    /// etcd and kube-apiserver: nothing schedules pods, signs certificates, collects garbage,
    /// creates a namespace's `default` ServiceAccount or watches node Leases.
    ApiserverOnly,
    /// Also kube-scheduler and kube-controller-manager (every default controller, the CSR
    /// signer with the cluster CA), as in a real cluster.
    Full,
}

impl ControlPlane {
    /// The archives `start.sh` unpacks for it.
    fn binaries(self) -> &'static [&'static str] {
        match self {
            ControlPlane::ApiserverOnly => &["etcd", "kube-apiserver"],
            ControlPlane::Full => &["etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"],
        }
    }
}

/// `deploy/rbac.yaml`: the daemon's RBAC, applied as an operator would.
pub fn rbac_yaml() -> PathBuf {
    repo_root().join("deploy/rbac.yaml")
}

/// The tools folder, or why there is none.
pub fn tools_dir() -> Result<PathBuf, String> {
    let (dir, from) = tools::kube_tools_dir();
    let archives = ControlPlane::Full.binaries().iter().map(|b| format!("{b}.xz"));
    let missing: Vec<String> = ["start.sh".to_string(), "stop.sh".to_string()]
        .into_iter()
        .chain(archives)
        .filter(|f| !dir.join(f).is_file())
        .collect();
    if missing.is_empty() {
        Ok(dir.canonicalize().unwrap_or(dir))
    } else {
        Err(format!(
            "no Kubernetes tools at {} ({from}; missing {}): set {TOOLS_ENV} to the folder with start.sh",
            dir.display(),
            missing.join(", ")
        ))
    }
}

/// Whether CI asked for the real-server tests to be mandatory.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// `Some(tools)`, or `None` after saying once per test binary why the real-server tests are
/// skipped. Under `CI=true` a missing folder panics instead.
pub fn tools_or_skip() -> Option<PathBuf> {
    match tools_dir() {
        Ok(dir) => Some(dir),
        Err(why) => {
            skip(&why);
            None
        }
    }
}

/// Says once per test binary (per reason) why some real-server tests are skipped; under
/// `CI=true`, where they must run, panics with the reason instead.
pub fn skip(why: &str) {
    if in_ci() {
        panic!("CI=true, so the real-apiserver tests must run, but: {why}");
    }
    static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if said.iter().any(|s| s == why) {
        return;
    }
    said.push(why.to_string());
    // Straight to stderr: libtest captures print!/eprint! of passing tests.
    use std::io::Write;
    let exe = std::env::current_exe().ok();
    let stem = exe.as_deref().and_then(Path::file_stem).map(|s| s.to_string_lossy());
    // Cargo names test binaries `<target>-<hash>`.
    let name = stem
        .as_deref()
        .map_or("?", |s| s.rsplit_once('-').map_or(s, |(name, _)| name));
    let _ = writeln!(std::io::stderr(), "real-apiserver tests skipped in {name}: {why}");
}

static SHARED: OnceLock<KubeCluster> = OnceLock::new();
static SHARED_APISERVER_ONLY: OnceLock<KubeCluster> = OnceLock::new();

/// The test binary's shared cluster, a whole control plane ([`ControlPlane::Full`]), started on
/// first use; `None` when skipped (see [`tools_or_skip`]). Build clients per test
/// ([`KubeCluster::admin_client`]): a `kube::Client` belongs to the tokio runtime it was made
/// on, and every `#[tokio::test]` has its own.
pub async fn shared() -> Option<&'static KubeCluster> {
    shared_from(&SHARED, ControlPlane::Full).await
}

/// The test binary's shared apiserver and etcd, without scheduler or controller-manager.
pub async fn shared_apiserver_only() -> Option<&'static KubeCluster> {
    shared_from(&SHARED_APISERVER_ONLY, ControlPlane::ApiserverOnly).await
}

async fn shared_from(cell: &'static OnceLock<KubeCluster>, plane: ControlPlane) -> Option<&'static KubeCluster> {
    tools_or_skip()?;
    let cluster = tokio::task::spawn_blocking(move || {
        cell.get_or_init(|| KubeCluster::start(plane).unwrap_or_else(|e| panic!("{e}")))
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    Some(cluster)
}

/// A name unique within this test binary (`prefix-N`), for namespaces and nodes on a shared cluster.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::SeqCst))
}

/// A running control plane (see the module docs).
pub struct KubeCluster {
    plane: ControlPlane,
    state: PathBuf,
    port: u16,
    etcd_port: u16,
    daemon_kubeconfig: PathBuf,
    /// Dropping it (or this process ending) runs `stop.sh`.
    watchdog: Mutex<Option<Watchdog>>,
    /// Serialises minting of identities (files with fixed names).
    mint: Mutex<()>,
}

impl KubeCluster {
    /// Starts a private control plane (stopped on drop). Prefer [`shared`] in tests.
    pub fn start(plane: ControlPlane) -> Result<KubeCluster, String> {
        let tools = tools_dir()?;
        let began = Instant::now();
        let state = tempfile::Builder::new()
            .prefix("vk-kube-")
            .tempdir()
            .map_err(|e| format!("creating the cluster's state directory: {e}"))?
            .keep();
        // The watchdog first: whatever start.sh manages to start is stopped, whatever happens next.
        let watchdog = spawn_watchdog(&tools, &state)?;
        let mut cluster = KubeCluster {
            plane,
            state: state.clone(),
            port: 0,
            etcd_port: 0,
            daemon_kubeconfig: state.join("daemon.kubeconfig"),
            watchdog: Mutex::new(Some(watchdog)),
            mint: Mutex::new(()),
        };
        // Pre-seed start.sh's bin/ with links to binaries unpacked once per build tree (saves
        // ~1.5 s of xz per cluster).
        std::fs::create_dir_all(state.join("bin")).map_err(|e| format!("creating {}/bin: {e}", state.display()))?;
        for binary in plane.binaries() {
            let unpacked = tools::unpacked(&tools.join(format!("{binary}.xz")))?;
            std::os::unix::fs::symlink(&unpacked, state.join("bin").join(binary))
                .map_err(|e| format!("linking {}: {e}", unpacked.display()))?;
        }
        let mut last_error = String::new();
        for _attempt in 0..3 {
            // Free ports now; another process may take one before etcd or the apiserver binds it,
            // in which case start.sh fails and we try again with new ones.
            let ports = free_ports(5)?;
            let full = if plane == ControlPlane::Full { "1" } else { "" };
            // Through bash: a copied tools folder may have lost its execute bits.
            let out = Command::new("bash")
                .arg(tools.join("start.sh"))
                .arg(&state)
                .env("APISERVER_PORT", ports[0].to_string())
                .env("ETCD_PORT", ports[1].to_string())
                .env("ETCD_PEER_PORT", ports[2].to_string())
                .env("SCHEDULER", full)
                .env("CONTROLLER_MANAGER", full)
                .env("SCHEDULER_PORT", ports[3].to_string())
                .env("CONTROLLER_MANAGER_PORT", ports[4].to_string())
                .env("NODES", DEFAULT_NODE)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("running {}/start.sh: {e}", tools.display()))?;
            if out.status.success() {
                cluster.port = ports[0];
                cluster.etcd_port = ports[1];
                last_error.clear();
                break;
            }
            last_error = format!(
                "{}/start.sh failed ({}):\n{}\n--- kube-apiserver.log (tail) ---\n{}",
                tools.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr),
                tail(&state.join("logs/kube-apiserver.log"), 30)
            );
        }
        if !last_error.is_empty() {
            return Err(last_error);
        }
        cluster.install_daemon_identity()?;
        let _ = writeln_stderr(&format!(
            "kube_support: control plane ({plane:?}) up at {} in {:.1} s (state {})",
            cluster.url(),
            began.elapsed().as_secs_f64(),
            state.display()
        ));
        Ok(cluster)
    }

    /// `kubectl apply -f deploy/rbac.yaml` (after creating its namespace), then a token for its
    /// ServiceAccount through the TokenRequest API, in a kubeconfig.
    fn install_daemon_identity(&self) -> Result<(), String> {
        self.kubectl_checked(&["create", "namespace", DAEMON_NAMESPACE])?;
        let rbac = rbac_yaml();
        self.kubectl_checked(&["apply", "-f", &rbac.display().to_string()])?;
        let path = self.service_account_kubeconfig(DAEMON_NAMESPACE, DAEMON_SERVICE_ACCOUNT)?;
        debug_assert_eq!(path, self.daemon_kubeconfig);
        // RBAC reaches the authorizer through an informer: wait until it grants the new binding
        // (one of its verbs), so the first test does not race it.
        self.wait_until_allowed(&path, &["patch", "pods", "--all-namespaces"])
    }

    /// Polls `kubectl auth can-i` as `kubeconfig` until it answers yes (or 60 s pass: on a
    /// loaded machine one answer alone has taken longer than 20 s, the earlier limit).
    pub fn wait_until_allowed(&self, kubeconfig: &Path, can_i: &[&str]) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut args = vec!["auth", "can-i"];
            args.extend_from_slice(can_i);
            let out = self.kubectl_as(kubeconfig, &args);
            if out.status.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} is still not allowed to {}: {} {}",
                    kubeconfig.display(),
                    can_i.join(" "),
                    String::from_utf8_lossy(&out.stdout).trim(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Which processes it runs.
    pub fn control_plane(&self) -> ControlPlane {
        self.plane
    }

    /// Whether kube-scheduler and kube-controller-manager run.
    pub fn has_controllers(&self) -> bool {
        self.plane == ControlPlane::Full
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// etcd's client URL (plain HTTP on loopback).
    pub fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.etcd_port)
    }

    /// The state directory (`start.sh`'s layout: pki/, logs/, run/, *.kubeconfig).
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// The cluster CA (signs the apiserver, the admin, node and kubelet-client certificates).
    pub fn ca_cert_path(&self) -> PathBuf {
        self.state.join("pki/ca.crt")
    }

    pub fn ca_key_path(&self) -> PathBuf {
        self.state.join("pki/ca.key")
    }

    /// The client certificate the apiserver presents to kubelets (`--kubelet-client-certificate`;
    /// CN=kube-apiserver-kubelet-client, O=system:masters), and its key.
    pub fn kubelet_client_cert_path(&self) -> PathBuf {
        self.state.join("pki/apiserver-kubelet-client.crt")
    }

    pub fn kubelet_client_key_path(&self) -> PathBuf {
        self.state.join("pki/apiserver-kubelet-client.key")
    }

    /// CN=admin, O=system:masters.
    pub fn admin_kubeconfig_path(&self) -> PathBuf {
        self.state.join("admin.kubeconfig")
    }

    /// The daemon's identity: ServiceAccount `cocoon-system/vk-cocoon` bound by `deploy/rbac.yaml`.
    pub fn daemon_kubeconfig_path(&self) -> PathBuf {
        self.daemon_kubeconfig.clone()
    }

    /// The apiserver's log (for failure messages).
    pub fn apiserver_log_tail(&self, lines: usize) -> String {
        tail(&self.state.join("logs/kube-apiserver.log"), lines)
    }

    pub async fn admin_client(&self) -> kube::Client {
        client_for(&self.admin_kubeconfig_path()).await
    }

    pub async fn daemon_client(&self) -> kube::Client {
        client_for(&self.daemon_kubeconfig).await
    }

    /// A fresh namespace `unique(prefix)` with the `default` ServiceAccount pods need: the
    /// controller-manager's service-account controller creates it (ServiceAccount admission
    /// refuses pods until then); without one, this creates it as that controller would.
    pub async fn namespace(&self, prefix: &str) -> String {
        let name = unique(prefix);
        let client = self.admin_client().await;
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.clone());
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        let accounts = Api::<ServiceAccount>::namespaced(client, &name);
        if self.has_controllers() {
            let made =
                kube::runtime::wait::await_condition(accounts, "default", |sa: Option<&ServiceAccount>| sa.is_some());
            match tokio::time::timeout(Duration::from_secs(60), made).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => panic!("watching {name}/default ServiceAccount: {e}"),
                Err(_) => panic!(
                    "the controller-manager made no {name}/default ServiceAccount within 60 s\n--- kube-controller-manager.log (tail) ---\n{}",
                    tail(&self.state.join("logs/kube-controller-manager.log"), 20)
                ),
            }
        } else {
            let mut sa = ServiceAccount::default();
            sa.metadata.name = Some("default".into());
            accounts
                .create(&PostParams::default(), &sa)
                .await
                .unwrap_or_else(|e| panic!("creating {name}/default ServiceAccount: {e}"));
        }
        name
    }

    /// `kubectl --kubeconfig <admin> ARGS…` (not checked: look at the status).
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_as(&self.admin_kubeconfig_path(), args)
    }

    /// `kubectl` as `kubeconfig`.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--cache-dir")
            .arg(self.state.join("kubectl-cache"))
            .arg("--request-timeout=30s")
            .args(args)
            .env_remove("KUBECONFIG")
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running kubectl (the real-apiserver tests need it on PATH): {e}"))
    }

    /// `kubectl` as admin; its stdout, or an error with its stderr.
    pub fn kubectl_checked(&self, args: &[&str]) -> Result<String, String> {
        checked(self.kubectl(args), args)
    }

    /// A kubeconfig for ServiceAccount `namespace/name` with a token minted through the
    /// TokenRequest API (`kubectl create token`, valid 24 h). The account must exist.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> Result<PathBuf, String> {
        let token = self.kubectl_checked(&["create", "token", name, "-n", namespace, "--duration=24h"])?;
        let user = format!("system:serviceaccount:{namespace}:{name}");
        let path = if (namespace, name) == (DAEMON_NAMESPACE, DAEMON_SERVICE_ACCOUNT) {
            self.daemon_kubeconfig.clone()
        } else {
            self.state.join(format!("sa-{namespace}-{name}.kubeconfig"))
        };
        self.write_kubeconfig(&path, &user, &format!("    token: {}\n", token.trim()))?;
        Ok(path)
    }

    /// A kubeconfig for the node identity `system:node:NAME` (group `system:nodes`): `start.sh`'s
    /// own for [`DEFAULT_NODE`], otherwise a client certificate signed here with the cluster CA.
    pub fn node_kubeconfig(&self, node: &str) -> Result<PathBuf, String> {
        let _one_at_a_time = self.mint.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.state.join(format!("node-{node}.kubeconfig"));
        if path.is_file() {
            return Ok(path);
        }
        let pki = self.state.join("pki");
        let (key, cert) = (
            pki.join(format!("node-{node}.key")),
            pki.join(format!("node-{node}.crt")),
        );
        let csr = pki.join(format!("node-{node}.csr"));
        let ext = pki.join(format!("node-{node}.ext"));
        std::fs::write(
            &ext,
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
        )
        .map_err(|e| format!("writing {}: {e}", ext.display()))?;
        let subject = format!("/O=system:nodes/CN=system:node:{node}");
        let (ca_cert, ca_key) = (pki.join("ca.crt"), pki.join("ca.key"));
        let os = |parts: &[&dyn AsRef<std::ffi::OsStr>]| -> Vec<std::ffi::OsString> {
            parts.iter().map(|p| p.as_ref().to_os_string()).collect()
        };
        let steps = [
            os(&[&"genrsa", &"-out", &key, &"2048"]),
            os(&[&"req", &"-new", &"-key", &key, &"-subj", &subject, &"-out", &csr]),
            os(&[
                &"x509",
                &"-req",
                &"-in",
                &csr,
                &"-CA",
                &ca_cert,
                &"-CAkey",
                &ca_key,
                &"-CAcreateserial",
                &"-days",
                &"30",
                &"-sha256",
                &"-extfile",
                &ext,
                &"-out",
                &cert,
            ]),
        ];
        for step in &steps {
            let out = Command::new("openssl")
                .args(step)
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("running openssl: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "openssl {step:?} failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        let user = format!(
            "    client-certificate: {}\n    client-key: {}\n",
            cert.display(),
            key.display()
        );
        self.write_kubeconfig(&path, &format!("system:node:{node}"), &user)?;
        Ok(path)
    }

    /// Writes a kubeconfig for this cluster with `user_fields` (indented YAML under `user:`).
    fn write_kubeconfig(&self, path: &Path, user: &str, user_fields: &str) -> Result<(), String> {
        let mut text = String::new();
        let _ = write!(
            text,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test-cluster\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: {user}\n  user:\n{user_fields}contexts:\n- name: {user}@test-cluster\n  context:\n    cluster: test-cluster\n    user: {user}\n    namespace: default\ncurrent-context: {user}@test-cluster\n",
            self.url(),
            self.ca_cert_path().display()
        );
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| format!("writing {}: {e}", path.display()))
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        // The watchdog runs stop.sh and removes the state directory, and is waited for.
        drop(self.watchdog.get_mut().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// A kube client from a kubeconfig file, as `vk-cocoon run` builds its own (`KUBECONFIG`).
pub async fn client_for(kubeconfig: &Path) -> kube::Client {
    // kube needs a rustls provider chosen when the build enables more than one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let file = kube::config::Kubeconfig::read_from(kubeconfig)
        .unwrap_or_else(|e| panic!("reading {}: {e}", kubeconfig.display()));
    let config = kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("loading {}: {e}", kubeconfig.display()));
    kube::Client::try_from(config).unwrap_or_else(|e| panic!("a client for {}: {e}", kubeconfig.display()))
}

/// Runs `stop.sh STATE` — which stops exactly the pids start.sh recorded — and removes STATE
/// when this process closes the watchdog's pipe (drop, exit, crash, SIGKILL).
fn spawn_watchdog(tools: &Path, state: &Path) -> Result<Watchdog, String> {
    let stop = tools.join("stop.sh");
    Watchdog::run_on_close(
        r#"bash "$0" "$1" >/dev/null 2>&1; rm -rf "$1""#,
        &[stop.as_os_str(), state.as_os_str()],
    )
}

/// `n` distinct free loopback ports (held together while choosing, so they differ).
fn free_ports(n: usize) -> Result<Vec<u16>, String> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("finding a free loopback port: {e}"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("reading a listener's port: {e}"))
}

fn checked(out: Output, args: &[&str]) -> Result<String, String> {
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "kubectl {} failed ({}): {}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

/// The last `lines` lines of a file ("" when unreadable).
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn writeln_stderr(line: &str) -> std::io::Result<()> {
    use std::io::Write;
    writeln!(std::io::stderr(), "{line}")
}
