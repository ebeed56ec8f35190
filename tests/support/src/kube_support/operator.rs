//! The real cocoon-operator as a process against a test cluster: the node daemon's client in
//! production. From the tools folder (`../shared/tools/cocoon-operator` beside the Kubernetes
//! tools, or `$VK_OPERATOR_TOOLS_DIR`): its binary (v0.3.3, unpacked once into the build tree),
//! its two CRDs, and its least-privilege identity (`serviceaccount.yaml`, `role.yaml`), under
//! which it runs here — a verb its role lacks fails a test as it would fail in a cluster.
//!
//! ```ignore
//! let operator = Operator::start(cluster, "127.0.0.1:5000")?; // OCI_REGISTRY; waits for /readyz
//! operator.log();                                             // its debug log so far
//! ```
//!
//! One operator serves a whole cluster (it watches every namespace and has no flag to narrow
//! that), so tests share one and keep apart by namespace and node pool. It stops on drop
//! (SIGTERM, which it handles), and — kept in a `static` — when the test binary ends, by a
//! [`Watchdog`].

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::tools::{self, Watchdog};
use super::{KubeCluster, tail};

/// Overrides where the operator's folder is.
pub const TOOLS_ENV: &str = "VK_OPERATOR_TOOLS_DIR";
/// The namespace and ServiceAccount of the operator's own RBAC (`role.yaml`).
pub const NAMESPACE: &str = "cocoon-system";
pub const SERVICE_ACCOUNT: &str = "cocoon-operator";
/// The CRDs' API group and version.
pub const GROUP: &str = "cocoonset.cocoonstack.io";
pub const VERSION: &str = "v1";
const CRDS: [&str; 2] = [
    "cocoonset.cocoonstack.io_cocoonsets.yaml",
    "cocoonset.cocoonstack.io_cocoonhibernations.yaml",
];

/// The operator's folder, or why it is missing.
pub fn tools_dir() -> Result<PathBuf, String> {
    let dir = tools::sibling_tool_dir(TOOLS_ENV, "cocoon-operator");
    let missing: Vec<&str> = [
        "cocoon-operator.xz",
        "serviceaccount.yaml",
        "role.yaml",
        CRDS[0],
        CRDS[1],
    ]
    .into_iter()
    .filter(|f| !dir.join(f).is_file())
    .collect();
    if missing.is_empty() {
        Ok(dir)
    } else {
        Err(format!(
            "no cocoon-operator at {} (missing {}): set {TOOLS_ENV} to the folder with cocoon-operator.xz",
            dir.display(),
            missing.join(", ")
        ))
    }
}

/// A running `cocoon-operator`.
pub struct Operator {
    child: Option<Child>,
    /// Its HOME, DOCKER_CONFIG and log.
    dir: tempfile::TempDir,
    _watchdog: Watchdog,
}

impl Operator {
    /// Installs the CRDs and the operator's identity in `cluster` (idempotent), then starts the
    /// operator under that identity with `OCI_REGISTRY=registry` and waits until it is ready.
    pub fn start(cluster: &KubeCluster, registry: &str) -> Result<Operator, String> {
        let tools = tools_dir()?;
        let kubeconfig = install(cluster, &tools)?;
        let binary = tools::unpacked(&tools.join("cocoon-operator.xz"))?;
        let binary = binary.canonicalize().unwrap_or(binary);
        let dir = tempfile::Builder::new()
            .prefix("vk-operator-")
            .tempdir()
            .map_err(|e| format!("creating the operator's directory: {e}"))?;
        // Its registry keychain reads a docker config: an empty one of its own, never ~/.docker.
        let docker = dir.path().join("docker");
        std::fs::create_dir_all(&docker)
            .and_then(|()| std::fs::write(docker.join("config.json"), "{}"))
            .map_err(|e| format!("writing the operator's docker config: {e}"))?;
        let mut last_error = String::new();
        for _attempt in 0..3 {
            // A free port now; another process may take it first, then the operator exits and
            // we try another.
            let probe_port = free_port()?;
            let log = dir.path().join("operator.log");
            let out = std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
            let err = out.try_clone().map_err(|e| format!("{}: {e}", log.display()))?;
            let child = Command::new(&binary)
                .arg("--leader-elect=false")
                .arg("--metrics-bind-address=127.0.0.1:0")
                .arg(format!("--health-probe-bind-address=127.0.0.1:{probe_port}"))
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .env("HOME", dir.path())
                .env("KUBECONFIG", &kubeconfig)
                .env("DOCKER_CONFIG", &docker)
                .env("OCI_REGISTRY", registry)
                .env("OPERATOR_LOG_LEVEL", "debug")
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .map_err(|e| format!("starting {}: {e}", binary.display()))?;
            let watchdog = Watchdog::terminate(&child, &binary, dir.path())?;
            let mut child = Some(child);
            match wait_ready(&mut child, probe_port, &log, Duration::from_secs(60)) {
                Ok(()) => {
                    return Ok(Operator {
                        child,
                        dir,
                        _watchdog: watchdog,
                    });
                }
                Err(e) => {
                    stop(&mut child);
                    last_error = e;
                }
            }
        }
        Err(last_error)
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Its last `lines` log lines.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log_path(), lines)
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("operator.log")
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// Waits until the operator answers `/readyz` with 200; an error with its log if it exits or
/// takes longer than `within`.
fn wait_ready(child: &mut Option<Child>, probe_port: u16, log: &Path, within: Duration) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        if http_get(probe_port, "/readyz").is_some_and(|(status, _)| status == 200) {
            return Ok(());
        }
        if child.as_mut().is_none_or(|c| !matches!(c.try_wait(), Ok(None))) {
            return Err(format!("cocoon-operator exited:\n{}", tail(log, 30)));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "cocoon-operator is not ready on 127.0.0.1:{probe_port} after {within:?}:\n{}",
                tail(log, 30)
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SIGTERM (which it handles: its controllers stop), then waits for it.
fn stop(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        let _ = child.wait();
    }
}

/// The CRDs (waited until Established) and the operator's namespace, ServiceAccount and
/// ClusterRole(Binding); a kubeconfig with a token for that ServiceAccount, once RBAC grants it.
fn install(cluster: &KubeCluster, tools: &Path) -> Result<PathBuf, String> {
    let file = |name: &str| tools.join(name).display().to_string();
    let mut apply = vec!["apply".to_string()];
    for name in CRDS.iter().chain(&["serviceaccount.yaml", "role.yaml"]) {
        apply.push("-f".into());
        apply.push(file(name));
    }
    let args: Vec<&str> = apply.iter().map(String::as_str).collect();
    // The namespace exists already (the daemon's identity lives there too); create it if not.
    let _ = cluster.kubectl(&["create", "namespace", NAMESPACE]);
    cluster.kubectl_checked(&args)?;
    cluster.kubectl_checked(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        &format!("crd/cocoonsets.{GROUP}"),
        &format!("crd/cocoonhibernations.{GROUP}"),
    ])?;
    let kubeconfig = cluster.service_account_kubeconfig(NAMESPACE, SERVICE_ACCOUNT)?;
    for can_i in [
        ["patch", &format!("cocoonsets.{GROUP}"), "--all-namespaces"],
        ["delete", "pods", "--all-namespaces"],
    ] {
        cluster.wait_until_allowed(&kubeconfig, &can_i)?;
    }
    Ok(kubeconfig)
}

/// One plain-HTTP GET on loopback: (status, body), `None` while nothing answers.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    Some((status, body))
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free loopback port: {e}"))
}
