//! The daemon driven through the **real cocoon-operator** (v0.3.3), its client in production:
//! the operator turns CocoonSets and CocoonHibernations into pods and annotations, the real
//! scheduler places the main agent by node pool and toleration, the daemon brings the VMs up in
//! cocoon-sim and pushes and pulls snapshots through a CNCF Distribution v3 registry on
//! loopback — the registry the operator reads (`HEAD …/manifests/hibernate`) and deletes tags
//! from, by tag. Every step is checked where a user would look: the CocoonSet's status, the
//! pods, the VMs and the registry.
//!
//! One operator and one registry serve the test binary ([`stack`]: the operator watches every
//! namespace); each test has its own namespace, node and node pool ([`Site`]), so the scheduler
//! can only place its pods on its own daemon's node.

mod hibernation;
mod release;
mod squad;

use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::wait::await_condition;
use serde_json::{Value, json};
use vk_cocoon::registry::ManifestLookup;
use vk_cocoon::runtime::CocoonRuntime;

use crate::daemon::*;
use crate::kube_support::operator::{self as op, Operator};
use crate::kube_support::{self, KubeCluster, Watchdog};
use crate::provider_support::seed_snapshot_on;
use crate::registry_support::{TestRegistry, TransferClient};

pub const SET_NAME: &str = "cocoonset.cocoonstack.io/name";
pub const ROLE: &str = "cocoonset.cocoonstack.io/role";
pub const GENERATION: &str = "cocoonset.cocoonstack.io/generation";
pub const OBSERVED_GENERATION: &str = "vm.cocoonstack.io/lifecycle-observed-generation";
pub const FORK_FROM: &str = "vm.cocoonstack.io/fork-from";
pub const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";
pub const RESTORE: &str = "vm.cocoonstack.io/restore-from-hibernate";
pub const HIBERNATED_ON_NODE: &str = "cocoonset.cocoonstack.io/hibernated-on-node";
/// The image the sets here run: a local snapshot seeded on every node (mode `clone`).
pub const IMAGE_REF: &str = "base";

/// How long one operator-driven step may take: the operator polls hibernation every 5 s and
/// requeues a pending set every 5 s; a step takes a few of those on a loaded machine.
pub const STEP_SECS: u64 = 180;

/// The binary's operator and registry, on its shared cluster.
pub struct Stack {
    pub cluster: &'static KubeCluster,
    pub registry: TestRegistry,
    pub operator: Operator,
    /// Stops the registry when the test binary ends (the static is never dropped).
    _registry_watchdog: Watchdog,
}

static STACK: OnceLock<Stack> = OnceLock::new();

/// The operator and registry of this test binary, started on first use; `None` when the tools
/// are missing (see [`kube_support::skip`]).
pub async fn stack() -> Option<&'static Stack> {
    let cluster = kube_support::shared().await?;
    let tools = op::tools_dir().and_then(|_| kube_support::tools::registry_v3_binary());
    let registry_binary = match tools {
        Ok(binary) => binary,
        Err(why) => {
            kube_support::skip(&why);
            return None;
        }
    };
    let stack = tokio::task::spawn_blocking(move || {
        STACK.get_or_init(|| {
            let registry = TestRegistry::start_v3(&registry_binary);
            let process = registry.process().expect("the registry runs");
            let exe = registry_binary.canonicalize().unwrap_or(registry_binary.clone());
            let watchdog = Watchdog::terminate(process, &exe, registry.dir.path()).unwrap_or_else(|e| panic!("{e}"));
            let operator = Operator::start(cluster, &registry.host()).unwrap_or_else(|e| panic!("{e}"));
            Stack {
                cluster,
                registry,
                operator,
                _registry_watchdog: watchdog,
            }
        })
    })
    .await
    .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    Some(stack)
}

fn resource(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(op::GROUP, op::VERSION, kind))
}

/// One test's corner of the cluster: a namespace, a node pool, and the node of that pool — a
/// machine running `vk-cocoon run` against the binary's registry.
pub struct Site {
    pub stack: &'static Stack,
    pub admin: kube::Client,
    pub ns: String,
    /// `VK_NODE_POOL` of the node and `spec.nodePool` of the sets here.
    pub pool: String,
    // Before `machine`: its log lives in the machine's directory.
    pub daemon: DaemonProcess,
    pub machine: Machine,
}

impl Site {
    pub async fn new(prefix: &str) -> Option<Site> {
        let stack = stack().await?;
        let cluster = stack.cluster;
        let admin = cluster.admin_client().await;
        let ns = cluster.namespace(prefix).await;
        let pool = kube_support::unique(&format!("{prefix}-pool"));
        let mut machine = Machine::new(prefix);
        machine.daemon_env = vec![
            ("VK_NODE_POOL".into(), pool.clone()),
            ("OCI_REGISTRY".into(), stack.registry.host()),
            (
                "VK_REGISTRY_SPOOL_DIR".into(),
                machine.dir.path().join("spool").display().to_string(),
            ),
        ];
        seed_snapshot_on(&machine.runtime, IMAGE_REF, "ghcr.io/x/base:1").await;
        let daemon = machine.start_daemon(cluster);
        machine.wait_registered(cluster).await;
        Some(Site {
            stack,
            admin,
            ns,
            pool,
            daemon,
            machine,
        })
    }

    pub fn sets(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.admin.clone(), &self.ns, &resource("CocoonSet"))
    }

    pub fn hibernations(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.admin.clone(), &self.ns, &resource("CocoonHibernation"))
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.admin.clone(), &self.ns)
    }

    /// Creates CocoonSet `name` in this site's pool with `spec` (its `nodePool` added).
    pub async fn create_set(&self, name: &str, mut spec: Value) -> DynamicObject {
        spec["nodePool"] = json!(self.pool);
        let set = json!({
            "apiVersion": format!("{}/{}", op::GROUP, op::VERSION),
            "kind": "CocoonSet",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": spec,
        });
        let obj: DynamicObject = serde_json::from_value(set).unwrap();
        self.sets()
            .create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("creating CocoonSet {}/{name}: {e}", self.ns))
    }

    /// A merge patch of the set's spec; its new generation.
    pub async fn patch_set(&self, name: &str, spec: Value) -> i64 {
        let set = self
            .sets()
            .patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": spec})))
            .await
            .unwrap_or_else(|e| panic!("patching CocoonSet {}/{name}: {e}", self.ns));
        set.metadata.generation.expect("a generation")
    }

    pub async fn delete_set(&self, name: &str) {
        self.sets()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting CocoonSet {}/{name}: {e}", self.ns));
    }

    /// Waits (on a watch) until the set satisfies `cond` (`None`: it is gone).
    pub async fn wait_set(
        &self,
        name: &str,
        what: &str,
        cond: impl Fn(Option<&DynamicObject>) -> bool,
    ) -> Option<DynamicObject> {
        let watch = await_condition(self.sets(), name, cond);
        match tokio::time::timeout(Duration::from_secs(STEP_SECS), watch).await {
            Ok(result) => result.unwrap_or_else(|e| panic!("watching CocoonSet {}/{name}: {e}", self.ns)),
            Err(_) => panic!(
                "timed out after {STEP_SECS} s waiting for CocoonSet {}/{name}: {what}\n{}",
                self.ns,
                self.report().await
            ),
        }
    }

    /// Waits until the set's status says `phase` with `ready` ready agents.
    pub async fn wait_phase(&self, name: &str, phase: &str, ready: i64) -> DynamicObject {
        self.wait_set(name, &format!("phase {phase}, {ready} ready agents"), |s| {
            s.is_some_and(|s| phase_of(s) == Some(phase) && status_int(s, "readyAgents") == ready)
        })
        .await
        .expect("the set exists")
    }

    /// Waits until pod `name` satisfies `cond` (`None`: it is gone), with the report on timeout.
    pub async fn wait_pod(&self, name: &str, what: &str, cond: impl Fn(Option<&Pod>) -> bool) -> Option<Pod> {
        let watch = await_condition(self.pods(), name, cond);
        match tokio::time::timeout(Duration::from_secs(STEP_SECS), watch).await {
            Ok(result) => result.unwrap_or_else(|e| panic!("watching pod {}/{name}: {e}", self.ns)),
            Err(_) => panic!(
                "timed out after {STEP_SECS} s waiting for pod {}/{name}: {what}\n{}",
                self.ns,
                self.report().await
            ),
        }
    }

    /// The pods of set `set`, by name.
    pub async fn pods_of(&self, set: &str) -> Vec<Pod> {
        let mut pods = self
            .pods()
            .list(&ListParams::default().labels(&format!("{SET_NAME}={set}")))
            .await
            .unwrap()
            .items;
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        pods
    }

    /// The VM name the operator gives slot `slot` of set `set`.
    pub fn vm(&self, set: &str, slot: u32) -> String {
        format!("vk-{}-{set}-{slot}", self.ns)
    }

    /// The daemon's own registry client (the same code the daemon runs).
    pub fn registry(&self) -> TransferClient {
        self.stack.registry.transfer_client("", &self.machine.node)
    }

    /// Whether `vm:tag` is in the registry.
    pub async fn has_tag(&self, vm: &str, tag: &str) -> bool {
        match self.registry().manifest(vm, tag).await {
            Ok(ManifestLookup::Found(_)) => true,
            Ok(ManifestLookup::Absent) => false,
            Err(e) => panic!("reading {vm}:{tag} from the registry: {e}"),
        }
    }

    /// Waits until `vm:tag` is (or is not) in the registry.
    pub async fn wait_tag(&self, vm: &str, tag: &str, present: bool) {
        let what = format!("{vm}:{tag} {}", if present { "pushed" } else { "deleted" });
        let deadline = std::time::Instant::now() + Duration::from_secs(STEP_SECS);
        while self.has_tag(vm, tag).await != present {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out after {STEP_SECS} s waiting for {what}\n{}",
                self.report().await
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The VM ids cocoon runs here under `vm`'s name (a converged node has at most one).
    pub async fn vm_ids(&self, vm: &str) -> Vec<String> {
        self.machine.vms_named(vm).await.into_iter().map(|v| v.id).collect()
    }

    /// What a failing test prints: the sets, hibernations and pods here, and what the
    /// operator logged about this namespace (the daemon's log is printed by its own drop).
    pub async fn report(&self) -> String {
        let yaml = self.stack.cluster.kubectl(&[
            "get",
            &format!("cocoonsets.{g},cocoonhibernations.{g},pods", g = op::GROUP),
            "-n",
            &self.ns,
            "-o",
            "yaml",
        ]);
        let log = self.stack.operator.log();
        let mine: Vec<&str> = log.lines().filter(|l| l.contains(&self.ns)).collect();
        format!(
            "--- objects in {ns} ---\n{}{}\n--- cocoon-operator log lines naming {ns} (last 60) ---\n{}",
            String::from_utf8_lossy(&yaml.stdout),
            String::from_utf8_lossy(&yaml.stderr),
            mine[mine.len().saturating_sub(60)..].join("\n"),
            ns = self.ns
        )
    }
}

// ---- reading the operator's objects -------------------------------------------------------

pub fn phase_of(set: &DynamicObject) -> Option<&str> {
    set.data.pointer("/status/phase").and_then(Value::as_str)
}

pub fn status_int(set: &DynamicObject, field: &str) -> i64 {
    set.data
        .pointer(&format!("/status/{field}"))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// `status.agents`, as (podName, vmName, vmID).
pub fn status_agents(set: &DynamicObject) -> Vec<(String, String, String)> {
    let text = |a: &Value, k: &str| a.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
    let mut agents: Vec<_> = set
        .data
        .pointer("/status/agents")
        .and_then(Value::as_array)
        .map(|list| {
            list.iter()
                .map(|a| (text(a, "podName"), text(a, "vmName"), text(a, "vmID")))
                .collect()
        })
        .unwrap_or_default();
    agents.sort();
    agents
}

pub fn object_annotation<'a>(obj: &'a DynamicObject, key: &str) -> Option<&'a str> {
    obj.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The pod's node (`spec.nodeName`).
pub fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// The pod runs a VM the daemon reported ready at the set's `generation` or later.
pub fn ready_at(pod: &Pod, generation: i64) -> bool {
    is_up(pod) && observed_generation(pod) >= generation && annotation(pod, VM_ID).is_some()
}

/// The pod's guest is hibernated, as of the set's `generation` or later.
pub fn hibernated_at(pod: &Pod, generation: i64) -> bool {
    lifecycle(pod) == Some("hibernated") && observed_generation(pod) >= generation
}

pub fn observed_generation(pod: &Pod) -> i64 {
    annotation(pod, OBSERVED_GENERATION)
        .and_then(|g| g.parse().ok())
        .unwrap_or(-1)
}
