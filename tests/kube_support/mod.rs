//! A real Kubernetes control plane for tests: kube-apiserver v1.36 + etcd 3.6 from the project's
//! tools folder (`../shared/tools/kubernetes` beside the repository, or `$VK_KUBE_TOOLS_DIR`),
//! started by the folder's own `start.sh` on free loopback ports with its state in a temporary
//! directory, and the daemon's identity made from `deploy/rbac.yaml`.
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
//! * [`shared`] gives the one cluster of a test binary (started on first use, ~4 s, ~330 MB):
//!   tests share it and keep apart by namespace and node name ([`unique`]). [`KubeCluster::start`]
//!   gives a private one, stopped when dropped.
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
//! milliseconds except `start`. This module depends on kube, k8s-openapi, tokio and tempfile only,
//! so the fake apiserver's semantics tests can run against it too.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};

/// Overrides where the tools folder is (default: `<repo>/../shared/tools/kubernetes`).
pub const TOOLS_ENV: &str = "VK_KUBE_TOOLS_DIR";
/// The namespace and ServiceAccount `deploy/rbac.yaml` binds its ClusterRole to.
pub const DAEMON_NAMESPACE: &str = "cocoon-system";
pub const DAEMON_SERVICE_ACCOUNT: &str = "vk-cocoon";
/// The node identity `start.sh` makes a kubeconfig for (others are minted on demand).
pub const DEFAULT_NODE: &str = "cocoon-node-1";

/// The repository root: the first ancestor of the test crate holding `deploy/rbac.yaml`.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| dir.join("deploy/rbac.yaml").is_file())
        .expect("the test crate lives inside the vk-cocoon repository (deploy/rbac.yaml)")
        .to_path_buf()
}

/// `deploy/rbac.yaml`: the daemon's RBAC, applied as an operator would.
pub fn rbac_yaml() -> PathBuf {
    repo_root().join("deploy/rbac.yaml")
}

/// The tools folder, or why there is none.
pub fn tools_dir() -> Result<PathBuf, String> {
    let (dir, from) = match std::env::var_os(TOOLS_ENV).filter(|v| !v.is_empty()) {
        Some(dir) => (PathBuf::from(dir), format!("${TOOLS_ENV}")),
        None => (
            repo_root().join("../shared/tools/kubernetes"),
            "../shared/tools/kubernetes beside the repository".to_string(),
        ),
    };
    let missing: Vec<&str> = ["start.sh", "stop.sh", "etcd.xz", "kube-apiserver.xz"]
        .into_iter()
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
        Err(why) if in_ci() => panic!("CI=true, so the real-apiserver tests must run, but: {why}"),
        Err(why) => {
            static SAID: OnceLock<()> = OnceLock::new();
            SAID.get_or_init(|| {
                // Straight to stderr: libtest captures print!/eprint! of passing tests.
                use std::io::Write;
                let exe = std::env::current_exe().ok();
                let stem = exe.as_deref().and_then(Path::file_stem).map(|s| s.to_string_lossy());
                // Cargo names test binaries `<target>-<hash>`.
                let name = stem
                    .as_deref()
                    .map_or("?", |s| s.rsplit_once('-').map_or(s, |(name, _)| name));
                let _ = writeln!(std::io::stderr(), "real-apiserver tests skipped in {name}: {why}");
            });
            None
        }
    }
}

static SHARED: OnceLock<KubeCluster> = OnceLock::new();

/// The test binary's shared cluster, started on first use; `None` when skipped (see
/// [`tools_or_skip`]). Build clients per test ([`KubeCluster::admin_client`]): a `kube::Client`
/// belongs to the tokio runtime it was made on, and every `#[tokio::test]` has its own.
pub async fn shared() -> Option<&'static KubeCluster> {
    tools_or_skip()?;
    let cluster =
        tokio::task::spawn_blocking(|| SHARED.get_or_init(|| KubeCluster::start().unwrap_or_else(|e| panic!("{e}"))))
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
    state: PathBuf,
    tools: PathBuf,
    port: u16,
    etcd_port: u16,
    daemon_kubeconfig: PathBuf,
    /// The watchdog's stdin: closing it (drop, or this process ending) runs `stop.sh`.
    watchdog: Mutex<Option<(Child, ChildStdin)>>,
    /// Serialises minting of identities (files with fixed names).
    mint: Mutex<()>,
}

impl KubeCluster {
    /// Starts a private control plane (stopped on drop). Prefer [`shared`] in tests.
    pub fn start() -> Result<KubeCluster, String> {
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
            state: state.clone(),
            tools: tools.clone(),
            port: 0,
            etcd_port: 0,
            daemon_kubeconfig: state.join("daemon.kubeconfig"),
            watchdog: Mutex::new(Some(watchdog)),
            mint: Mutex::new(()),
        };
        // Pre-seed start.sh's bin/ with links to binaries unpacked once per build tree (saves
        // ~1.5 s of xz per cluster).
        std::fs::create_dir_all(state.join("bin")).map_err(|e| format!("creating {}/bin: {e}", state.display()))?;
        for binary in ["etcd", "kube-apiserver"] {
            let unpacked = unpacked_binary(&tools, binary)?;
            std::os::unix::fs::symlink(&unpacked, state.join("bin").join(binary))
                .map_err(|e| format!("linking {}: {e}", unpacked.display()))?;
        }
        let mut last_error = String::new();
        for _attempt in 0..3 {
            // Free ports now; another process may take one before etcd or the apiserver binds it,
            // in which case start.sh fails and we try again with new ones.
            let ports = free_ports(3)?;
            // Through bash: a copied tools folder may have lost its execute bits.
            let out = Command::new("bash")
                .arg(tools.join("start.sh"))
                .arg(&state)
                .env("APISERVER_PORT", ports[0].to_string())
                .env("ETCD_PORT", ports[1].to_string())
                .env("ETCD_PEER_PORT", ports[2].to_string())
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
            "kube_support: control plane up at {} in {:.1} s (state {})",
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

    /// Polls `kubectl auth can-i` as `kubeconfig` until it answers yes (or 20 s pass).
    pub fn wait_until_allowed(&self, kubeconfig: &Path, can_i: &[&str]) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut args = vec!["auth", "can-i"];
            args.extend_from_slice(can_i);
            let out = self.kubectl_as(kubeconfig, &args);
            if out.status.success() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} is still not allowed to {}: {}",
                    kubeconfig.display(),
                    can_i.join(" "),
                    String::from_utf8_lossy(&out.stdout)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
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

    /// A fresh namespace `unique(prefix)` with the `default` ServiceAccount pods need (nothing
    /// else creates it: there is no controller-manager).
    pub async fn namespace(&self, prefix: &str) -> String {
        let name = unique(prefix);
        let client = self.admin_client().await;
        let mut ns = Namespace::default();
        ns.metadata.name = Some(name.clone());
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .unwrap_or_else(|e| panic!("creating namespace {name}: {e}"));
        let mut sa = ServiceAccount::default();
        sa.metadata.name = Some("default".into());
        Api::<ServiceAccount>::namespaced(client, &name)
            .create(&PostParams::default(), &sa)
            .await
            .unwrap_or_else(|e| panic!("creating {name}/default ServiceAccount: {e}"));
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
        // Closing the watchdog's stdin makes it run stop.sh and remove the state directory.
        let taken = self.watchdog.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((mut child, stdin)) = taken {
            drop(stdin);
            let _ = child.wait();
        }
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

/// `sh` waiting on a pipe from this process; when the pipe closes (drop, exit, crash, SIGKILL)
/// it runs `stop.sh STATE` — which stops exactly the pids start.sh recorded — and removes STATE.
fn spawn_watchdog(tools: &Path, state: &Path) -> Result<(Child, ChildStdin), String> {
    let mut child = Command::new("/bin/sh")
        .arg("-c")
        .arg(r#"trap '' INT TERM HUP; read _ignored; bash "$0" "$1" >/dev/null 2>&1; rm -rf "$1""#)
        .arg(tools.join("stop.sh"))
        .arg(state)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the cluster watchdog: {e}"))?;
    let stdin = child.stdin.take().expect("piped stdin");
    Ok((child, stdin))
}

/// `tools/NAME.xz` unpacked once into the build tree (`target/<profile>/kube-tools/`), keyed by
/// the archive's size and mtime; concurrent test binaries race safely (write, then rename).
fn unpacked_binary(tools: &Path, name: &str) -> Result<PathBuf, String> {
    let archive = tools.join(format!("{name}.xz"));
    let meta = std::fs::metadata(&archive).map_err(|e| format!("{}: {e}", archive.display()))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let cache = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("kube-tools")))
        .unwrap_or_else(|| std::env::temp_dir().join("vk-kube-tools"));
    let target = cache.join(format!("{name}-{}-{mtime}", meta.len()));
    if target.is_file() {
        return Ok(target);
    }
    std::fs::create_dir_all(&cache).map_err(|e| format!("creating {}: {e}", cache.display()))?;
    let tmp = cache.join(format!("{name}.{}.tmp", std::process::id()));
    let file = std::fs::File::create(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let status = Command::new("xz")
        .arg("-dc")
        .arg(&archive)
        .stdout(file)
        .status()
        .map_err(|e| format!("running xz (install xz-utils): {e}"))?;
    if !status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("xz -dc {} failed: {status}", archive.display()));
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .and_then(|()| std::fs::rename(&tmp, &target))
        .map_err(|e| format!("installing {}: {e}", target.display()))?;
    Ok(target)
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
