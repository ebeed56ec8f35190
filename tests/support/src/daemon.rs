//! The pieces of one node machine for the real-apiserver scenarios: a cocoon simulator with its
//! state, cocoon's root directory, cocoon-net's lease file, optionally a real OCI registry —
//! and `vk-cocoon run` as a child process against them. Plus waits on pods through the API.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cocoon_sim::Sim;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;

use crate::kube_support::{self, KubeCluster};
use crate::provider_support::fleet_ca::FleetCa;
use crate::provider_support::loopback;
use crate::registry_support::{TestRegistry, TransferClient};
use crate::runtime_support;
use vk_cocoon::runtime::{CocoonCli, CocoonRuntime, VmRecord};

pub const LIFECYCLE: &str = "vm.cocoonstack.io/lifecycle-state";
pub const LIFECYCLE_MESSAGE: &str = "vm.cocoonstack.io/lifecycle-state-message";
pub const VM_ID: &str = "vm.cocoonstack.io/id";
pub const IMAGE: &str = "cocoonset.cocoonstack.io/image";
/// A daemon environment value that stands for the machine's guest network: its simulator's
/// loopback subnet (`127.N.0.0/16`), where its guests and nothing else live.
pub const GUEST_NETWORK: &str = "<the machine's guest network>";

/// One machine the daemon runs on.
pub struct Machine {
    /// `VK_NODE_NAME`, unique in the test binary.
    pub node: String,
    pub dir: tempfile::TempDir,
    pub sim: Sim,
    /// The same CLI client the daemon uses, for setting up and inspecting VMs and snapshots.
    pub runtime: Arc<CocoonCli>,
    pub leases: PathBuf,
    pub registry: Option<TestRegistry>,
    /// More environment for the daemons this machine starts.
    pub daemon_env: Vec<(String, String)>,
}

impl Machine {
    pub fn new(node_prefix: &str) -> Machine {
        let dir = tempfile::tempdir().unwrap();
        // The simulator's static guest addresses are on loopback, in a 127.N subnet of this
        // root's own: the daemon's real probes reach the "guests" without leaving the machine,
        // and port-forward reaches this machine's guest, never another test's.
        let sim = Sim::new(dir.path().join("sim")).unwrap();
        let runtime = Arc::new(CocoonCli::new(runtime_support::config(&sim)));
        let leases = dir.path().join("leases.json");
        std::fs::write(&leases, "null").unwrap();
        Machine {
            node: kube_support::unique(node_prefix),
            dir,
            sim,
            runtime,
            leases,
            registry: None,
            daemon_env: Vec::new(),
        }
    }

    /// Turns on the peer snapshot tier: the peer token, the node's certificate from the fleet's
    /// peer CA `fleet` (this test's nodes ask the cluster for no serving certificate), the
    /// listener on `ip:port` (every node of a test on the same port, each on its own loopback
    /// address, which is its InternalIP), and `registry` when the machine has none of its own
    /// (the one registry of the cluster).
    pub fn with_peer(
        mut self,
        fleet: &FleetCa,
        ip: &str,
        port: u16,
        token: &str,
        registry: Option<&TestRegistry>,
    ) -> Machine {
        use std::os::unix::fs::PermissionsExt;
        let private = |path: &Path| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let token_file = self.dir.path().join("peer-token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        // The daemon refuses a token file others may read.
        private(&token_file);
        let (cert, key) = fleet.node_pem(&self.node);
        let (ca_file, cert_file, key_file) = (
            self.dir.path().join("peer-ca.crt"),
            self.dir.path().join("peer.crt"),
            self.dir.path().join("peer.key"),
        );
        std::fs::write(&ca_file, &fleet.pem).unwrap();
        std::fs::write(&cert_file, cert).unwrap();
        std::fs::write(&key_file, key).unwrap();
        private(&key_file);
        let mut env = vec![
            ("VK_PEER_CA_FILE".to_string(), ca_file.display().to_string()),
            ("VK_PEER_TLS_CERT".to_string(), cert_file.display().to_string()),
            ("VK_PEER_TLS_KEY".to_string(), key_file.display().to_string()),
            ("VK_PEER_TOKEN_FILE".to_string(), token_file.display().to_string()),
            ("VK_PEER_ADDR".to_string(), format!("{ip}:{port}")),
            ("VK_NODE_IP".to_string(), ip.to_string()),
            // Where this machine's cocoon (the simulator) keeps its snapshots' files.
            (
                "VK_COCOON_SNAPSHOT_DIR".to_string(),
                self.sim.root().join("snapshots").display().to_string(),
            ),
        ];
        if let Some(r) = registry {
            env.push(("OCI_REGISTRY".into(), r.host()));
            env.push((
                "VK_REGISTRY_SPOOL_DIR".into(),
                self.dir.path().join("spool").display().to_string(),
            ));
        }
        self.daemon_env.extend(env);
        self
    }

    /// Gives the machine a real registry (Debian's docker-registry on loopback): `OCI_REGISTRY`.
    pub fn with_registry(mut self) -> Machine {
        self.registry = Some(TestRegistry::start());
        self
    }

    /// Every VM cocoon knows on this machine.
    pub async fn vms(&self) -> Vec<VmRecord> {
        self.runtime.list().await.unwrap()
    }

    /// The VMs named `name` (a converged node has at most one).
    pub async fn vms_named(&self, name: &str) -> Vec<VmRecord> {
        self.vms().await.into_iter().filter(|v| v.name() == name).collect()
    }

    /// The argv of every `verb` (e.g. "vm clone") cocoon ran here, joined by spaces.
    pub fn calls(&self, verb: &str) -> Vec<String> {
        self.sim
            .calls()
            .unwrap()
            .into_iter()
            .filter(|c| c.verb == verb)
            .map(|c| c.argv.join(" "))
            .collect()
    }

    /// Waits until a `verb` invocation of cocoon is running here (`true`) or none is (`false`).
    pub async fn wait_cocoon_running(&self, verb: &str, running: bool) {
        let what = format!("cocoon {verb} {}", if running { "running" } else { "finished" });
        eventually(60, &what, || async {
            self.sim.pids_of(verb).unwrap().is_empty() != running
        })
        .await;
    }

    /// Waits until this machine's Node is registered.
    pub async fn wait_registered(&self, cluster: &KubeCluster) {
        let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(cluster.admin_client().await);
        eventually(60, "node registered", || {
            let nodes = nodes.clone();
            async move { nodes.get_opt(&self.node).await.unwrap().is_some() }
        })
        .await;
    }

    /// The daemon's client for the registry (to look at tags, and pull, as the daemon would).
    pub fn registry_client(&self) -> TransferClient {
        self.registry
            .as_ref()
            .expect("a machine with a registry")
            .transfer_client("", &self.node)
    }

    /// `vk-cocoon run` under the daemon identity of `deploy/rbac.yaml`; its kubelet API accepts
    /// the apiserver's kubelet-client certificate (signed by the cluster CA).
    pub fn start_daemon(&self, cluster: &KubeCluster) -> DaemonProcess {
        self.start_daemon_with(&cluster.daemon_kubeconfig_path(), Some(&cluster.ca_cert_path()))
    }

    /// `vk-cocoon run` with `KUBECONFIG=kubeconfig` and this machine's environment only.
    pub fn start_daemon_as(&self, kubeconfig: &Path) -> DaemonProcess {
        self.start_daemon_with(kubeconfig, None)
    }

    /// The simulator's stand-in for `/sys/fs/cgroup` (the daemon reads the VM scopes there).
    pub fn cgroup_root(&self) -> PathBuf {
        self.sim.root().join("cgroup")
    }

    /// `vk-cocoon run`; `client_ca` = `VK_CLIENT_CA_FILE` of its kubelet API.
    pub fn start_daemon_with(&self, kubeconfig: &Path, client_ca: Option<&Path>) -> DaemonProcess {
        // Chosen together: two ports picked one after the other can be the same one (each is
        // free again once its probe listener closes), and the daemon then fails to bind.
        let [metrics_port, kubelet_port] = free_ports::<2>();
        static STARTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let log = self.dir.path().join(format!("daemon-{n}.log"));
        let (sim_key, sim_root) = self.sim.env();
        let mut command = Command::new(runtime_support::daemon_bin());
        command
            .arg("run")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("KUBECONFIG", kubeconfig)
            .env("VK_NODE_NAME", &self.node)
            .env("VK_NODE_IP", "127.0.0.1")
            .env("COCOON_ROOT_DIR", self.dir.path())
            .env("VK_COCOON_BIN", runtime_support::sim_bin())
            .env(sim_key, sim_root)
            .env("VK_POLICY_CACHE_DIR", self.dir.path().join("policy-cache"))
            .env("VK_LEASES_PATH", &self.leases)
            .env("VK_COCOON_NET_CONTROL_SOCKET", "")
            .env("VK_METRICS_ADDR", format!("127.0.0.1:{metrics_port}"))
            .env("VK_LOG_LEVEL", "info,vk_cocoon=debug")
            // The suite's loopback rule, kept by the daemon itself: a probe off the machine is
            // refused and logged, and the test fails when the DaemonProcess goes.
            .env("VK_PROBE_NETWORKS", loopback::DAEMON_PROBE_NETWORKS)
            // The kubelet API on loopback. The apiserver dials the node's Hostname address
            // first: `localhost` resolves to loopback on every machine. Its serving certificate
            // comes from a CSR (signed in tests by kube_support::signer), stored under the
            // machine's directory; cocoon's log and cgroup trees are the simulator's.
            .env("VK_KUBELET_ADDRESS", "127.0.0.1")
            .env("VK_KUBELET_PORT", kubelet_port.to_string())
            .env("VK_NODE_HOSTNAME", "localhost")
            .env("VK_TLS_CERT_DIR", self.dir.path().join("pki"))
            .env("COCOON_LOG_DIR", self.dir.path().join("log"))
            .env("VK_CGROUP_ROOT", self.cgroup_root())
            .env("COCOON_SIM_CGROUP_ROOT", self.cgroup_root());
        if let Some(ca) = client_ca {
            command.env("VK_CLIENT_CA_FILE", ca);
        }
        let guests = format!("{}.0.0/16", self.sim.subnet());
        command.envs(
            self.daemon_env
                .iter()
                .map(|(k, v)| (k, if v == GUEST_NETWORK { &guests } else { v })),
        );
        if let Some(registry) = &self.registry {
            command.env("OCI_REGISTRY", registry.host());
        }
        let out = std::fs::File::create(&log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawn vk-cocoon run");
        DaemonProcess {
            child: Some(child),
            log,
            metrics_port,
            kubelet_port,
            acknowledged_refusals: 0,
        }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        // A daemon stopped with `kill -9` leaves its cocoon children running, as a real cocoon's
        // would (the restart scenarios rely on that); its `vm status --event` never ends by
        // itself. Stop every process started against this machine's simulator.
        let _ = self.sim.kill_everything();
    }
}

/// A running `vk-cocoon run`. Dropping it kills it (SIGKILL); a panicking test prints its log;
/// a probe it refused (an address off loopback, see [`loopback::DAEMON_PROBE_NETWORKS`]) that
/// the test did not provoke on purpose fails the test.
pub struct DaemonProcess {
    child: Option<Child>,
    log: PathBuf,
    pub metrics_port: u16,
    /// `VK_KUBELET_PORT` (on 127.0.0.1).
    pub kubelet_port: u16,
    /// How many `probe refused` lines the test provoked on purpose.
    acknowledged_refusals: usize,
}

impl DaemonProcess {
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its `probe refused` lines so far (each names the address it would not probe).
    pub fn probe_refusals(&self) -> Vec<String> {
        loopback::probe_refusals(&self.log())
    }

    /// Takes the refusals so far as provoked on purpose: they no longer fail the test.
    pub fn acknowledge_probe_refusals(&mut self) -> Vec<String> {
        let all = self.probe_refusals();
        let new = all[self.acknowledged_refusals.min(all.len())..].to_vec();
        self.acknowledged_refusals = all.len();
        new
    }

    /// Waits up to `secs` for it to exit by itself.
    pub async fn exited(&mut self, secs: u64) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(secs);
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not exit within {secs} s; its log:\n{}",
                kube_support::tail(&self.log, 40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGTERM, then waits for the exit.
    pub async fn terminate(&mut self) -> ExitStatus {
        vk_cocoon::host::process::terminate(self.pid()).expect("SIGTERM the daemon");
        self.exited(30).await
    }

    /// `kill -9`: no cleanup of anything in flight.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// One `GET /metrics` (HTTP/1.0, the whole answer), `None` while it does not listen.
    pub fn scrape_metrics(&self) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.metrics_port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "--- vk-cocoon run log ({}) ---\n{}",
                self.log.display(),
                kube_support::tail(&self.log, 60)
            );
            return;
        }
        let unexpected = self.acknowledge_probe_refusals();
        assert!(
            unexpected.is_empty(),
            "vk-cocoon run tried to probe addresses outside loopback (tests may only use 127.0.0.0/8 and ::1):\n{}",
            unexpected.join("\n")
        );
    }
}

/// `N` distinct free loopback ports (their listeners held together while choosing).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<std::net::TcpListener> = (0..N)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().unwrap().port())
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

// ---- pods through the API ------------------------------------------------------------------

/// A managed agent pod for VM `vm`, bound to `node` in namespace `ns` (no scheduler: the test binds).
pub fn managed_pod(ns: &str, node: &str, name: &str, vm: &str, extra: &[(&str, &str)]) -> Pod {
    let mut pod = crate::provider_support::managed(name, vm, extra);
    pod.metadata.namespace = Some(ns.into());
    pod.spec.as_mut().unwrap().node_name = Some(node.into());
    pod
}

pub async fn create_pod(client: &kube::Client, pod: &Pod) -> Pod {
    let ns = pod.metadata.namespace.as_deref().unwrap();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod {ns}/{:?}: {e}", pod.metadata.name))
}

pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

pub fn lifecycle(pod: &Pod) -> Option<&str> {
    annotation(pod, LIFECYCLE)
}

/// The Ready condition is True.
pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The Ready condition's (status, message).
pub fn ready_condition(pod: &Pod) -> Option<(String, String)> {
    let c = pod
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?;
    Some((c.status.clone(), c.message.clone().unwrap_or_default()))
}

/// Lifecycle `ready` and the Ready condition True.
/// Waits on a watch of `pods` until `want` of them are up; how long since `started`. Fails past
/// `allowance` plus a second per pod.
pub async fn wait_up_count(pods: &Api<Pod>, want: usize, started: Instant, allowance: Duration) -> Duration {
    use futures::TryStreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let mut up = std::collections::HashSet::new();
    let events = watcher(pods.clone(), watcher::Config::default()).applied_objects();
    let mut events = std::pin::pin!(events);
    let deadline = allowance + Duration::from_secs(want as u64);
    while up.len() < want {
        let next = tokio::time::timeout(deadline.saturating_sub(started.elapsed()), events.try_next())
            .await
            .unwrap_or_else(|_| panic!("{} of {want} pods up after {deadline:?}", up.len()))
            .expect("watching the pods")
            .expect("the watch does not end");
        let name = next.metadata.name.clone().unwrap_or_default();
        if is_up(&next) {
            up.insert(name);
        } else {
            up.remove(&name);
        }
    }
    started.elapsed()
}

pub fn is_up(pod: &Pod) -> bool {
    lifecycle(pod) == Some("ready") && is_ready(pod)
}

/// Waits (on a watch, not by polling) until pod `ns/name` satisfies `cond`; returns it
/// (`None` when the condition was met by its absence).
pub async fn wait_pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    secs: u64,
    what: &str,
    cond: impl Fn(Option<&Pod>) -> bool,
) -> Option<Pod> {
    let api = Api::<Pod>::namespaced(client.clone(), ns);
    match tokio::time::timeout(Duration::from_secs(secs), await_condition(api.clone(), name, cond)).await {
        Ok(result) => result.unwrap_or_else(|e| panic!("watching pod {ns}/{name}: {e}")),
        Err(_) => {
            let now = api.get_opt(name).await.ok().flatten();
            panic!(
                "timed out after {secs} s waiting for pod {ns}/{name}: {what}; it is now: {}",
                now.map(|p| format!("annotations {:?}, status {:?}", p.metadata.annotations, p.status))
                    .unwrap_or_else(|| "gone".into())
            )
        }
    }
}

/// Waits until the pod is up (lifecycle `ready` ∧ Ready).
pub async fn wait_up(client: &kube::Client, ns: &str, name: &str) -> Pod {
    wait_pod(client, ns, name, 90, "lifecycle ready and Ready=True", |p| {
        p.is_some_and(is_up)
    })
    .await
    .expect("the pod exists")
}

/// Polls `cond` every 100 ms until it holds or `secs` pass (for state outside the API: VMs,
/// registry tags).
pub async fn eventually<F, Fut>(secs: u64, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond().await {
        assert!(
            Instant::now() < deadline,
            "timed out after {secs} s waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// (type, reason, note) of the events.k8s.io Events about pod `name` in `ns`.
pub async fn events_about(client: &kube::Client, ns: &str, name: &str) -> Vec<(String, String, String)> {
    let api = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), ns);
    api.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.note.unwrap_or_default(),
            )
        })
        .collect()
}
