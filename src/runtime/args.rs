//! Pure argv construction for every verb, in the exact flag order the Go daemon sent them.

use super::quantity::to_byte_arg;
use std::collections::BTreeMap;

/// Hypervisor backend of a VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    #[default]
    CloudHypervisor,
    Firecracker,
}

/// `vm clone --restore-mode` (cloud-hypervisor only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreMode {
    Copy,
    OnDemand,
    Mmap,
}

impl RestoreMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreMode::Copy => "copy",
            RestoreMode::OnDemand => "ondemand",
            RestoreMode::Mmap => "mmap",
        }
    }
}

/// cgroup knobs; a zero value omits the flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CpuPolicy {
    pub weight: u32,
    pub quota_us: u64,
    pub period_us: u64,
}

/// `vm run` request. Sizes are k8s quantities (`4Gi`) or byte counts; they are sent as byte counts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunSpec {
    pub name: Option<String>,
    pub cpu: Option<u32>,
    pub cpu_policy: CpuPolicy,
    pub memory: Option<String>,
    pub storage: Option<String>,
    /// Only old cocoon builds take `--nics` on run; `None` for current ones.
    pub nics: Option<u32>,
    pub network: Option<String>,
    pub windows: bool,
    pub backend: Backend,
    pub no_direct_io: bool,
    pub image: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum CloneSource {
    /// A local snapshot ref (name or ID).
    Snapshot(String),
    /// A directory in the format `snapshot export --to-dir` writes (the files, then
    /// `snapshot.json`).
    Dir(String),
}

/// `vm clone` request. The guest topology (CPU, memory, disk) always comes from the snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct CloneSpec {
    pub name: Option<String>,
    pub network: Option<String>,
    pub no_direct_io: bool,
    pub pull: bool,
    pub restore_mode: Option<RestoreMode>,
    pub nics: Option<u32>,
    pub cpu_policy: CpuPolicy,
    pub backend: Backend,
    pub source: CloneSource,
}

/// `vm exec` request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    /// Sent as `-e K=V`, sorted by key.
    pub env: BTreeMap<String, String>,
    /// Attach stdin (`-i`).
    pub stdin: bool,
    /// A session a client drives (`kubectl exec`): no overall deadline — the caller ends it (the
    /// client leaving, the stream idle timeout). Otherwise the runtime's exec timeout applies.
    pub unbounded: bool,
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn push_opt(args: &mut Vec<String>, flag: &str, v: Option<impl ToString>) {
    if let Some(v) = v {
        args.push(flag.into());
        args.push(v.to_string());
    }
}

fn push_cpu_policy(args: &mut Vec<String>, p: CpuPolicy) {
    push_opt(args, "--cpu-weight", (p.weight > 0).then_some(p.weight));
    push_opt(args, "--cpu-quota-us", (p.quota_us > 0).then_some(p.quota_us));
    push_opt(args, "--cpu-period-us", (p.period_us > 0).then_some(p.period_us));
}

/// `vm run --output json [--name] [--cpu] [cpu-policy] [--memory B] [--storage B] [--nics] [--network] [--windows] [--fc] [--no-direct-io] IMAGE`
pub fn run(spec: &RunSpec) -> Vec<String> {
    let mut a = s(&["vm", "run", "--output", "json"]);
    push_opt(&mut a, "--name", spec.name.as_ref());
    push_opt(&mut a, "--cpu", spec.cpu.filter(|c| *c > 0));
    push_cpu_policy(&mut a, spec.cpu_policy);
    push_opt(
        &mut a,
        "--memory",
        spec.memory.as_deref().filter(|m| !m.is_empty()).map(to_byte_arg),
    );
    push_opt(
        &mut a,
        "--storage",
        spec.storage.as_deref().filter(|m| !m.is_empty()).map(to_byte_arg),
    );
    push_opt(&mut a, "--nics", spec.nics);
    push_opt(&mut a, "--network", spec.network.as_ref().filter(|n| !n.is_empty()));
    if spec.windows {
        a.push("--windows".into());
    }
    if spec.backend == Backend::Firecracker {
        a.push("--fc".into());
    }
    if spec.no_direct_io {
        a.push("--no-direct-io".into());
    }
    a.push(spec.image.clone());
    a
}

/// `vm clone --output json [--name] [--network] [--no-direct-io] [--pull] [--restore-mode] [--nics] [cpu-policy] (--from-dir DIR | SNAPSHOT)`
/// `--pull` is forced for `--from-dir`; `--restore-mode` and `--nics` are omitted for firecracker.
pub fn clone(spec: &CloneSpec) -> Vec<String> {
    let mut a = s(&["vm", "clone", "--output", "json"]);
    push_opt(&mut a, "--name", spec.name.as_ref());
    push_opt(&mut a, "--network", spec.network.as_ref().filter(|n| !n.is_empty()));
    if spec.no_direct_io {
        a.push("--no-direct-io".into());
    }
    if spec.pull || matches!(spec.source, CloneSource::Dir(_)) {
        a.push("--pull".into());
    }
    if spec.backend != Backend::Firecracker {
        push_opt(&mut a, "--restore-mode", spec.restore_mode.map(RestoreMode::as_str));
        push_opt(&mut a, "--nics", spec.nics);
    }
    push_cpu_policy(&mut a, spec.cpu_policy);
    match &spec.source {
        CloneSource::Dir(d) => {
            a.push("--from-dir".into());
            a.push(d.clone());
        }
        CloneSource::Snapshot(name) => a.push(name.clone()),
    }
    a
}

pub fn inspect(reference: &str) -> Vec<String> {
    s(&["vm", "inspect", reference])
}
pub fn version() -> Vec<String> {
    s(&["version"])
}
pub fn list() -> Vec<String> {
    s(&["vm", "list", "-o", "json"])
}
pub fn remove(reference: &str) -> Vec<String> {
    s(&["vm", "rm", "--force", reference])
}
pub fn start(reference: &str) -> Vec<String> {
    s(&["vm", "start", reference])
}
pub fn reconcile_stale_create(reference: &str) -> Vec<String> {
    s(&["vm", "reconcile-stale-create", reference, "-o", "json"])
}
pub fn net_resize(reference: &str, nics: u32) -> Vec<String> {
    s(&["vm", "net", "--nics", &nics.to_string(), reference])
}

/// `vm exec [-i] [-e K=V]... REF -- ARGV...` (env sorted by key).
pub fn exec(reference: &str, spec: &ExecSpec) -> Vec<String> {
    let mut a = s(&["vm", "exec"]);
    if spec.stdin {
        a.push("-i".into());
    }
    for (k, v) in &spec.env {
        a.push("-e".into());
        a.push(format!("{k}={v}"));
    }
    a.push(reference.into());
    a.push("--".into());
    a.extend(spec.argv.iter().cloned());
    a
}

pub fn logs(reference: &str, tail: Option<u64>) -> Vec<String> {
    let mut a = s(&["vm", "logs"]);
    push_opt(&mut a, "--tail", tail);
    a.push(reference.into());
    a
}
pub fn events() -> Vec<String> {
    s(&["vm", "status", "--event", "--format", "json"])
}
pub fn snapshot_save(name: &str, vm_id: &str) -> Vec<String> {
    s(&["snapshot", "save", "--name", name, vm_id])
}
pub fn snapshot_inspect(name: &str) -> Vec<String> {
    s(&["snapshot", "inspect", name])
}
pub fn snapshot_rm(name: &str) -> Vec<String> {
    s(&["snapshot", "rm", name])
}
pub fn snapshot_list(vm: Option<&str>) -> Vec<String> {
    let mut a = s(&["snapshot", "list", "-o", "json"]);
    push_opt(&mut a, "--vm", vm);
    a
}
pub fn snapshot_import(name: &str) -> Vec<String> {
    s(&["snapshot", "import", "--name", name])
}
pub fn snapshot_export(name: &str) -> Vec<String> {
    s(&["snapshot", "export", name, "-o", "-"])
}
pub fn snapshot_export_dir(name: &str, dir: &str) -> Vec<String> {
    s(&["snapshot", "export", name, "--to-dir", dir])
}
pub fn image_pull(reference: &str, force: bool) -> Vec<String> {
    let mut a = s(&["image", "pull"]);
    if force {
        a.push("--force".into());
    }
    a.push(reference.into());
    a
}
pub fn image_inspect(reference: &str) -> Vec<String> {
    s(&["image", "inspect", reference])
}
pub fn image_import(name: &str) -> Vec<String> {
    s(&["image", "import", name])
}

/// The verb of an argv (`vm clone`, `image pull`): its first two words, for logs and errors.
pub(crate) fn verb_of(args: &[String]) -> String {
    args.iter().take(2).cloned().collect::<Vec<_>>().join(" ")
}

/// Why `r` cannot be a positional argument naming `what` (empty, or a CLI would read it as a
/// flag); `None` when it can. Shared by the cocoon and cocoon-macos clients.
pub(crate) fn unsafe_ref(what: &str, r: &str) -> Option<String> {
    (r.is_empty() || r.starts_with('-')).then(|| format!("{what} {r:?} must be non-empty and must not start with '-'"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn j(a: Vec<String>) -> String {
        a.join(" ")
    }

    #[test]
    fn run_full_order() {
        let spec = RunSpec {
            name: Some("vk-ns-pod-0".into()),
            cpu: Some(2),
            cpu_policy: CpuPolicy {
                weight: 20,
                quota_us: 200000,
                period_us: 100000,
            },
            memory: Some("4Gi".into()),
            storage: Some("20Gi".into()),
            nics: None,
            network: Some("cocoon".into()),
            windows: true,
            backend: Backend::Firecracker,
            no_direct_io: true,
            image: "ghcr.io/x/ubuntu:24.04".into(),
        };
        assert_eq!(
            j(run(&spec)),
            "vm run --output json --name vk-ns-pod-0 --cpu 2 --cpu-weight 20 --cpu-quota-us 200000 --cpu-period-us 100000 \
             --memory 4294967296 --storage 21474836480 --network cocoon --windows --fc --no-direct-io ghcr.io/x/ubuntu:24.04"
        );
    }

    #[test]
    fn run_minimal_omits_zero_values() {
        let spec = RunSpec {
            cpu: Some(0),
            cpu_policy: CpuPolicy {
                weight: 1,
                ..Default::default()
            },
            memory: Some("".into()),
            image: "img".into(),
            ..Default::default()
        };
        assert_eq!(j(run(&spec)), "vm run --output json --cpu-weight 1 img");
        let odd = RunSpec {
            memory: Some("lots".into()),
            image: "img".into(),
            ..Default::default()
        };
        assert_eq!(
            j(run(&odd)),
            "vm run --output json --memory lots img",
            "unparseable quantities pass through"
        );
    }

    fn clone_spec() -> CloneSpec {
        CloneSpec {
            name: Some("to".into()),
            network: Some("net".into()),
            no_direct_io: true,
            pull: true,
            restore_mode: Some(RestoreMode::Mmap),
            nics: Some(2),
            cpu_policy: CpuPolicy {
                weight: 39,
                quota_us: 100000,
                period_us: 100000,
            },
            backend: Backend::CloudHypervisor,
            source: CloneSource::Snapshot("snap".into()),
        }
    }

    #[test]
    fn clone_full_order() {
        assert_eq!(
            j(clone(&clone_spec())),
            "vm clone --output json --name to --network net --no-direct-io --pull --restore-mode mmap --nics 2 \
             --cpu-weight 39 --cpu-quota-us 100000 --cpu-period-us 100000 snap"
        );
    }

    #[test]
    fn clone_fc_and_from_dir() {
        let mut spec = clone_spec();
        spec.backend = Backend::Firecracker;
        spec.pull = false;
        spec.source = CloneSource::Dir("/stage/x".into());
        assert_eq!(
            j(clone(&spec)),
            "vm clone --output json --name to --network net --no-direct-io --pull --cpu-weight 39 --cpu-quota-us 100000 \
             --cpu-period-us 100000 --from-dir /stage/x"
        );
    }

    #[test]
    fn exec_sorted_env_and_stdin() {
        let mut spec = ExecSpec {
            argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
            stdin: true,
            ..Default::default()
        };
        spec.env.insert("ZED".into(), "1".into());
        spec.env.insert("ALPHA".into(), "a=b".into());
        assert_eq!(
            exec("vm1", &spec),
            s(&[
                "vm",
                "exec",
                "-i",
                "-e",
                "ALPHA=a=b",
                "-e",
                "ZED=1",
                "vm1",
                "--",
                "sh",
                "-c",
                "echo hi"
            ])
        );
        spec.stdin = false;
        spec.env.clear();
        assert_eq!(j(exec("vm1", &spec)), "vm exec vm1 -- sh -c echo hi");
    }

    #[test]
    fn simple_verbs() {
        assert_eq!(j(list()), "vm list -o json");
        assert_eq!(j(remove("x")), "vm rm --force x");
        assert_eq!(j(reconcile_stale_create("x")), "vm reconcile-stale-create x -o json");
        assert_eq!(j(net_resize("x", 0)), "vm net --nics 0 x");
        assert_eq!(j(logs("x", Some(10))), "vm logs --tail 10 x");
        assert_eq!(j(logs("x", None)), "vm logs x");
        assert_eq!(j(events()), "vm status --event --format json");
        assert_eq!(j(snapshot_save("n", "id")), "snapshot save --name n id");
        assert_eq!(j(snapshot_export("n")), "snapshot export n -o -");
        assert_eq!(j(snapshot_export_dir("n", "/d")), "snapshot export n --to-dir /d");
        assert_eq!(j(snapshot_import("n")), "snapshot import --name n");
        assert_eq!(j(snapshot_list(Some("v"))), "snapshot list -o json --vm v");
        assert_eq!(j(image_pull("r", true)), "image pull --force r");
        assert_eq!(j(image_pull("r", false)), "image pull r");
        assert_eq!(j(image_import("n")), "image import n");
    }
}
