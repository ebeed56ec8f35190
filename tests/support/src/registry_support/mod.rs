//! A real OCI registry for tests: Debian's `docker-registry` (CNCF distribution 2.8) on a free loopback
//! port, storage in a temporary directory, deletes enabled; killed on drop. [`TestRegistry::start_v3`]
//! runs CNCF Distribution v3 instead (the binary from the project's tools folder, which
//! `kube_support::tools::registry_v3_binary` finds and unpacks), which deletes a manifest by tag as
//! the cocoon-operator does. Also the cocoon simulator and a `CocoonCli` pointed at it (see
//! `runtime_support`), and [`TransferClient`]: the registry adapter with the daemon's transfer path
//! around it (cocoon export / import, as the provider runs them).

pub mod hostile;
pub mod token;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use vk_cocoon::provider::ports::CloudImageResult;
use vk_cocoon::provider::transfer::{TransferError, Transfers};
use vk_cocoon::registry::{PullReport, PushReport, Registry, RegistryAuth, RegistryConfig, TransferSettings};
use vk_cocoon::runtime::CocoonRuntime;

/// The registry binary: `REGISTRY_BIN`, else `/usr/bin/docker-registry`; missing = a failure that says how to install it.
pub fn registry_bin() -> PathBuf {
    let bin = std::env::var_os("REGISTRY_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/docker-registry"));
    if !bin.exists() {
        panic!(
            "the registry tests need Debian's docker-registry at {}: run `apt-get install -y docker-registry` (or set REGISTRY_BIN)",
            bin.display()
        );
    }
    bin
}

/// The registry program a [`TestRegistry`] runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// Debian's `docker-registry` 2.8: `DELETE /v2/<repo>/manifests/<tag>` is refused
    /// (`DIGEST_INVALID`), only by digest works.
    Debian,
    /// CNCF Distribution v3.1 (this binary): deletes by tag, the way the cocoon-operator drops
    /// `:hibernate`.
    DistributionV3(PathBuf),
}

impl Flavour {
    fn binary(&self) -> PathBuf {
        match self {
            Flavour::Debian => registry_bin(),
            Flavour::DistributionV3(binary) => binary.clone(),
        }
    }
}

/// A client for the registry at `host` (the registry's own address, or a wire in front of it), with
/// the `SNAPSHOT_*` tuning `transfer`.
pub fn client_at(host: &str, prefix: &str, node: &str, auth: RegistryAuth, transfer: TransferSettings) -> Registry {
    let value = if prefix.is_empty() {
        host.to_string()
    } else {
        format!("{host}/{prefix}")
    };
    let mut cfg = RegistryConfig::parse(&value).expect("config").expect("some");
    // The suite's loopback rule for the registry port: the client only ever talks to cfg.host.
    let host = cfg.host.rsplit_once(':').map_or(cfg.host.as_str(), |(h, _)| h);
    let ip: std::net::IpAddr = host.trim_matches(['[', ']']).parse().expect("an IP host");
    assert!(ip.is_loopback(), "test registries live on loopback, not {}", cfg.host);
    cfg.transfer = transfer;
    Registry::with_auth(cfg, node.to_string(), auth).expect("registry client")
}

/// [`client_at`] with the daemon's transfer path around it.
pub fn transfer_client_at(
    host: &str,
    prefix: &str,
    node: &str,
    auth: RegistryAuth,
    transfer: TransferSettings,
) -> TransferClient {
    TransferClient {
        registry: std::sync::Arc::new(client_at(host, prefix, node, auth, transfer)),
        transfers: Transfers::new(),
    }
}

pub struct TestRegistry {
    pub dir: tempfile::TempDir,
    pub port: u16,
    pub flavour: Flavour,
    child: Option<Child>,
    /// The auth server when the registry runs with `auth: token`.
    pub token: Option<token::TokenServer>,
}

impl TestRegistry {
    pub fn start() -> TestRegistry {
        TestRegistry::start_flavour(Flavour::Debian)
    }

    /// CNCF Distribution v3, the program `binary`.
    pub fn start_v3(binary: &Path) -> TestRegistry {
        TestRegistry::start_flavour(Flavour::DistributionV3(binary.to_path_buf()))
    }

    fn start_flavour(flavour: Flavour) -> TestRegistry {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let mut r = TestRegistry {
            dir,
            port,
            flavour,
            child: None,
            token: None,
        };
        r.spawn();
        r
    }

    /// The registry's process (to stop it when the test binary ends, for one kept in a static).
    pub fn process(&self) -> Option<&Child> {
        self.child.as_ref()
    }

    /// A registry with `auth: token` (realm, service, issuer, rootcertbundle) and its auth server,
    /// which knows `users`.
    pub fn start_with_token_auth(users: Vec<token::User>) -> TestRegistry {
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let token = token::TokenServer::start(dir.path(), users);
        let mut r = TestRegistry {
            dir,
            port,
            flavour: Flavour::Debian,
            child: None,
            token: Some(token),
        };
        r.spawn();
        r
    }

    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn host(&self) -> String {
        self.addr().to_string()
    }

    /// A client for this registry with `prefix` (e.g. "cocoon"), anonymous.
    pub fn client(&self, prefix: &str, node: &str) -> Registry {
        self.client_as(prefix, node, RegistryAuth::Anonymous)
    }

    /// A client with the credentials `auth` (what the docker config would give it).
    pub fn client_as(&self, prefix: &str, node: &str, auth: RegistryAuth) -> Registry {
        self.client_tuned(prefix, node, auth, TransferSettings::default())
    }

    /// A client with the `SNAPSHOT_*` tuning `transfer` (v2 layout, budgets, stall limit).
    pub fn client_tuned(&self, prefix: &str, node: &str, auth: RegistryAuth, transfer: TransferSettings) -> Registry {
        client_at(&self.host(), prefix, node, auth, transfer)
    }

    /// The registry adapter with the daemon's transfer path around it.
    pub fn transfer_client(&self, prefix: &str, node: &str) -> TransferClient {
        self.transfer_client_as(prefix, node, RegistryAuth::Anonymous)
    }

    pub fn transfer_client_as(&self, prefix: &str, node: &str, auth: RegistryAuth) -> TransferClient {
        self.transfer_client_tuned(prefix, node, auth, TransferSettings::default())
    }

    pub fn transfer_client_tuned(
        &self,
        prefix: &str,
        node: &str,
        auth: RegistryAuth,
        transfer: TransferSettings,
    ) -> TransferClient {
        transfer_client_at(&self.host(), prefix, node, auth, transfer)
    }

    /// Stops (`SIGSTOP`) the registry process: its sockets stay open and nothing answers.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen registry run again (`SIGCONT`).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    /// The CPU time (user + system, all threads) the registry process has used so far, from
    /// `/proc/<pid>/stat`.
    pub fn cpu_time(&self) -> std::time::Duration {
        let pid = self.child.as_ref().expect("the registry runs").id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the registry's /proc stat");
        let ticks = vk_cocoon::stats::parse::pid_cpu_ticks(&stat).expect("utime and stime in the stat line");
        let per_second = vk_cocoon::host::cpu::clock_ticks_per_second();
        std::time::Duration::from_secs_f64(ticks as f64 / per_second as f64)
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("the registry runs").id();
        let ok = Command::new("kill")
            .arg(sig)
            .arg(pid.to_string())
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {pid}");
    }

    fn spawn(&mut self) {
        let config = self.dir.path().join("config.yml");
        let auth = match &self.token {
            None => String::new(),
            Some(t) => format!(
                "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
                t.realm(),
                token::SERVICE,
                token::ISSUER,
                t.cert_path.display()
            ),
        };
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  redirect:\n    disable: true\nhttp:\n  addr: 127.0.0.1:{}\n{auth}",
                self.storage().display(),
                self.port
            ),
        )
        .unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("registry.log"))
            .unwrap();
        let child = Command::new(self.flavour.binary())
            .arg("serve")
            .arg(&config)
            // Distribution v3 exports its traces to https://localhost:4318 unless told not to.
            .env("OTEL_TRACES_EXPORTER", "none")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning the {:?} registry: {e}", self.flavour));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            // With token auth an anonymous `/v2/` is 401: the registry is up either way.
            if let Some(200 | 401) = self.http_status("GET", "/v2/") {
                return;
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default();
                panic!(
                    "the {:?} registry did not come up on {}: {log}",
                    self.flavour,
                    self.host()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the registry (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and storage.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// A minimal HTTP/1.0 request (status code only), for readiness checks.
    pub fn http_status(&self, method: &str, path: &str) -> Option<u16> {
        self.http_status_with(method, path, "")
    }

    /// The same with extra header lines (each ending in `\r\n`), e.g. a static `Authorization`.
    pub fn http_status_with(&self, method: &str, path: &str, headers: &str) -> Option<u16> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "{method} {path} HTTP/1.0\r\nHost: {}\r\n{headers}\r\n", self.host()).ok()?;
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).ok()?;
        let line = String::from_utf8_lossy(&buf[..n]).to_string();
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// The storage path of a blob.
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
        self.storage()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Bytes currently sitting in upload sessions (`_uploads/*/data`).
    pub fn upload_bytes(&self) -> u64 {
        fn walk(p: &Path, in_uploads: bool, acc: &mut u64) {
            let Ok(rd) = std::fs::read_dir(p) else { return };
            for e in rd.flatten() {
                let path = e.path();
                let name = e.file_name().to_string_lossy().to_string();
                if path.is_dir() {
                    walk(&path, in_uploads || name == "_uploads", acc);
                } else if in_uploads && name == "data" {
                    *acc += e.metadata().map(|m| m.len()).unwrap_or(0);
                }
            }
        }
        let mut acc = 0;
        walk(&self.storage(), false, &mut acc);
        acc
    }
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The registry adapter plus the daemon's transfer path (`provider::transfer`): pushes run `cocoon
/// snapshot export` into the registry, pulls stream the registry into `cocoon snapshot import`.
/// Everything else (`manifest`, `snapshot_config`, `delete_manifest`, …) is the adapter's own.
pub struct TransferClient {
    pub registry: std::sync::Arc<Registry>,
    pub transfers: Transfers,
}

impl std::ops::Deref for TransferClient {
    type Target = Registry;
    fn deref(&self) -> &Registry {
        &self.registry
    }
}

impl TransferClient {
    pub async fn push_snapshot(
        &self,
        rt: &dyn CocoonRuntime,
        local: &str,
        repo: &str,
        tag: &str,
        base_image: &str,
    ) -> Result<PushReport, TransferError> {
        self.transfers
            .push(rt, self.registry.as_ref(), local, repo, tag, base_image)
            .await
    }

    pub async fn pull_snapshot(
        &self,
        rt: &dyn CocoonRuntime,
        repo: &str,
        tag: &str,
        local: &str,
    ) -> Result<PullReport, TransferError> {
        self.transfers.pull(rt, self.registry.as_ref(), repo, tag, local).await
    }

    pub async fn ensure_cloud_image(
        &self,
        rt: &dyn CocoonRuntime,
        reference: &str,
        force: bool,
    ) -> Result<CloudImageResult, TransferError> {
        self.transfers
            .import_cloud_image(rt, self.registry.as_ref(), reference, force)
            .await
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Files of a `snapshot export --to-dir` directory: name → (apparent size, bytes).
pub fn dir_files(dir: &Path) -> std::collections::BTreeMap<String, (u64, Vec<u8>)> {
    let mut out = std::collections::BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let bytes = std::fs::read(e.path()).unwrap();
        out.insert(name, (e.metadata().unwrap().len(), bytes));
    }
    out
}

/// Pushes a hand-made artifact (for kinds this crate never writes: cloud images, odd media types, indexes).
/// `layers` = (media type, title, bytes). Returns the manifest digest.
pub async fn push_raw_artifact(
    reg: &TestRegistry,
    repository: &str,
    tag: &str,
    artifact_type: &str,
    config: (&str, &[u8]),
    layers: &[(&str, &str, Vec<u8>)],
) -> String {
    use oci_client::client::{ClientConfig, ClientProtocol};
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    });
    let r = oci_client::Reference::with_tag(reg.host(), repository.to_string(), tag.to_string());
    client
        .auth(
            &r,
            &oci_client::secrets::RegistryAuth::Anonymous,
            oci_client::RegistryOperation::Push,
        )
        .await
        .unwrap();
    let digest = |b: &[u8]| {
        use sha2::Digest;
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)))
    };
    let cfg_digest = digest(config.1);
    client.push_blob(&r, config.1.to_vec(), &cfg_digest).await.unwrap();
    let mut descs = Vec::new();
    for (mt, title, bytes) in layers {
        let d = digest(bytes);
        client.push_blob(&r, bytes.clone(), &d).await.unwrap();
        descs.push(serde_json::json!({"mediaType": mt, "digest": d, "size": bytes.len(), "annotations": {"org.opencontainers.image.title": title}}));
    }
    let body = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": artifact_type,
        "config": {"mediaType": config.0, "digest": cfg_digest, "size": config.1.len()},
        "layers": descs,
    }))
    .unwrap();
    let d = digest(&body);
    client
        .push_manifest_raw(&r, body, "application/vnd.oci.image.manifest.v1+json".parse().unwrap())
        .await
        .unwrap();
    d
}
