//! Where the stats and log files of the host and of cocoon's VMs are. Every root is
//! configurable so tests can point the daemon at a simulator's tree (the defaults are a real
//! host's).

use std::path::{Path, PathBuf};

use crate::hypervisor::Hypervisor;

/// The host's and cocoon's directories the daemon reads directly, bypassing the cocoon CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// `VK_PROC_ROOT` (default `/proc`): `stat`, `meminfo`, `<pid>/{status,stat,net/dev}`.
    pub proc_root: PathBuf,
    /// `VK_CGROUP_ROOT` (default `/sys/fs/cgroup`, cgroup v2).
    pub cgroup_root: PathBuf,
    /// `COCOON_CGROUP_PARENT` (default `cocoon.slice`): the slice holding `vm-<id>.scope`.
    pub cgroup_parent: String,
    /// `COCOON_ROOT_DIR` (default `/var/lib/cocoon`): the node's filesystem stats.
    pub root_dir: PathBuf,
    /// `COCOON_RUN_DIR` (default `<COCOON_ROOT_DIR>/run`): `<backend>/<id>/{cow.raw,overlay.qcow2}`.
    pub run_dir: PathBuf,
    /// `COCOON_LOG_DIR` (default `/var/log/cocoon`): `<backend>/<id>/<hypervisor>.log`.
    pub log_dir: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        Self::from_lookup(|_| None).expect("the default paths are valid")
    }
}

/// The host's and cocoon's directories the stats read.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Host paths")]
pub struct PathsArgs {
    /// Where /proc is
    #[arg(long, env = "VK_PROC_ROOT", value_name = "DIR", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// Where the cgroup v2 tree is
    #[arg(long, env = "VK_CGROUP_ROOT", value_name = "DIR", default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
    /// The slice holding cocoon's vm-ID.scope cgroups (per-VM cpu.stat)
    #[arg(
        long,
        env = "COCOON_CGROUP_PARENT",
        value_name = "SLICE",
        default_value = "cocoon.slice"
    )]
    pub cocoon_cgroup_parent: String,
    /// cocoon's run dir, the VMs' COW disks (unset: COCOON_ROOT_DIR/run)
    #[arg(long, env = "COCOON_RUN_DIR", value_name = "DIR")]
    pub cocoon_run_dir: Option<PathBuf>,
    /// cocoon's log dir: BACKEND/ID/HYPERVISOR.log (kubectl logs)
    #[arg(long, env = "COCOON_LOG_DIR", value_name = "DIR", default_value = "/var/log/cocoon")]
    pub cocoon_log_dir: PathBuf,
}

/// cocoon's directory name of a backend (`cloudhypervisor`, `firecracker`).
pub fn backend_dir(hypervisor: &Hypervisor) -> &'static str {
    if *hypervisor == Hypervisor::Firecracker {
        "firecracker"
    } else {
        "cloudhypervisor"
    }
}

impl HostPaths {
    /// The paths from their settings; `root_dir` is cocoon's root (`COCOON_ROOT_DIR`, owned by
    /// the runtime's settings).
    pub fn from_args(args: &PathsArgs, root_dir: &Path) -> Self {
        Self {
            proc_root: args.proc_root.clone(),
            cgroup_root: args.cgroup_root.clone(),
            cgroup_parent: args.cocoon_cgroup_parent.clone(),
            run_dir: args.cocoon_run_dir.clone().unwrap_or_else(|| root_dir.join("run")),
            log_dir: args.cocoon_log_dir.clone(),
            root_dir: root_dir.to_path_buf(),
        }
    }

    /// Reads the variables (and `COCOON_ROOT_DIR`) through `lookup`, with the rules of the
    /// environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let root = crate::settings::parse_lookup::<crate::runtime::config::RootArgs>(&lookup)?;
        Ok(Self::from_args(
            &crate::settings::parse_lookup::<PathsArgs>(&lookup)?,
            &root.root_dir,
        ))
    }

    /// `<cgroup root>/<parent>/vm-<id>.scope/cpu.stat`.
    pub fn cpu_stat(&self, vm_id: &str) -> PathBuf {
        self.cgroup_root
            .join(&self.cgroup_parent)
            .join(format!("vm-{}.scope", id_component(vm_id)))
            .join("cpu.stat")
    }

    /// `<proc root>/<pid>/<file>`.
    pub fn pid_file(&self, pid: i64, file: &str) -> PathBuf {
        self.proc_root.join(pid.to_string()).join(file)
    }

    pub fn proc_file(&self, file: &str) -> PathBuf {
        self.proc_root.join(file)
    }

    /// The VM's run directory.
    pub fn vm_run_dir(&self, hypervisor: &Hypervisor, vm_id: &str) -> PathBuf {
        self.run_dir.join(backend_dir(hypervisor)).join(id_component(vm_id))
    }

    /// The COW disk candidates, in cocoon's order: a cloud image's `overlay.qcow2` (not on
    /// firecracker), else the OCI boot's `cow.raw`.
    pub fn cow_candidates(&self, hypervisor: &Hypervisor, vm_id: &str) -> Vec<PathBuf> {
        let dir = self.vm_run_dir(hypervisor, vm_id);
        if *hypervisor == Hypervisor::Firecracker {
            vec![dir.join("cow.raw")]
        } else {
            vec![dir.join("overlay.qcow2"), dir.join("cow.raw")]
        }
    }

    /// The hypervisor's log file (`cocoon vm logs` reads the same file):
    /// `<log dir>/<backend>/<id>/{cloud-hypervisor,firecracker}.log`.
    pub fn vm_log_file(&self, hypervisor: &Hypervisor, vm_id: &str) -> PathBuf {
        let file = if *hypervisor == Hypervisor::Firecracker {
            "firecracker.log"
        } else {
            "cloud-hypervisor.log"
        };
        self.log_dir
            .join(backend_dir(hypervisor))
            .join(id_component(vm_id))
            .join(file)
    }

    pub fn root_dir(&self) -> &Path {
        &self.root_dir
    }
}

/// A VM id as one path component. Ids are checked when a pod is decoded, and cocoon's are
/// 26 base32 characters; anything else (an absolute path, `..`, a `/`) becomes a name no VM
/// directory has, so a path built from it never leaves cocoon's directories.
fn id_component(vm_id: &str) -> &str {
    if crate::model::names::is_vm_id(vm_id) {
        vm_id
    } else {
        "-not-a-vm-id-"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_id_that_is_a_path_never_leaves_cocoons_directories() {
        let d = HostPaths::default();
        for id in ["/tmp/x", "../../etc", "a/b", ".."] {
            let run = d.vm_run_dir(&Hypervisor::CloudHypervisor, id);
            assert_eq!(
                run,
                PathBuf::from("/var/lib/cocoon/run/cloudhypervisor/-not-a-vm-id-"),
                "{id}"
            );
            let log = d.vm_log_file(&Hypervisor::Firecracker, id);
            assert!(
                log.starts_with("/var/log/cocoon/firecracker/-not-a-vm-id-"),
                "{id}: {log:?}"
            );
            let cpu = d.cpu_stat(id);
            assert!(
                cpu.starts_with("/sys/fs/cgroup/cocoon.slice/vm--not-a-vm-id-.scope"),
                "{id}: {cpu:?}"
            );
        }
    }

    #[test]
    fn defaults_are_a_real_hosts_and_every_root_moves() {
        let d = HostPaths::default();
        assert_eq!(
            d.cpu_stat("K7Q"),
            PathBuf::from("/sys/fs/cgroup/cocoon.slice/vm-K7Q.scope/cpu.stat")
        );
        assert_eq!(d.pid_file(42, "net/dev"), PathBuf::from("/proc/42/net/dev"));
        assert_eq!(
            d.cow_candidates(&Hypervisor::CloudHypervisor, "K7Q"),
            vec![
                PathBuf::from("/var/lib/cocoon/run/cloudhypervisor/K7Q/overlay.qcow2"),
                PathBuf::from("/var/lib/cocoon/run/cloudhypervisor/K7Q/cow.raw")
            ]
        );
        assert_eq!(
            d.vm_log_file(&Hypervisor::Firecracker, "K7Q"),
            PathBuf::from("/var/log/cocoon/firecracker/K7Q/firecracker.log")
        );
        let t = HostPaths::from_lookup(|k| match k {
            "VK_PROC_ROOT" => Some("/t/proc".into()),
            "VK_CGROUP_ROOT" => Some("/t/cg".into()),
            "COCOON_CGROUP_PARENT" => Some("x.slice".into()),
            "COCOON_ROOT_DIR" => Some("/t/root".into()),
            "COCOON_LOG_DIR" => Some("/t/log".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(t.cpu_stat("A"), PathBuf::from("/t/cg/x.slice/vm-A.scope/cpu.stat"));
        assert_eq!(t.run_dir, PathBuf::from("/t/root/run"), "the run dir follows the root");
        assert_eq!(
            t.vm_log_file(&Hypervisor::CloudHypervisor, "A"),
            PathBuf::from("/t/log/cloudhypervisor/A/cloud-hypervisor.log")
        );
    }
}
