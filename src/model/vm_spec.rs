//! The one decoder of a pod's VM annotations (cocoon-common `ParseVMSpec`),
//! into the contract's typed `vm-spec`. Every reader of these annotations — the policies' facts
//! and the provider alike — goes through here, so each annotation has one rule:
//!
//! - free text (name, image, storage, network, fork-from, clone-from-dir, conn-type) is raw;
//! - booleans are true only for the exact value `"true"` (cocoon-common's rule, shared with the
//!   operator: `" true"` or `"True"` must not make vk-cocoon and the operator disagree);
//! - closed domains (os, backend, mode, snapshot policy) ignore surrounding ASCII whitespace and
//!   ASCII case; absent or empty means the domain's default, and a value outside the domain is
//!   `Unknown` carrying the raw text (mode has no unknown: anything but `run` is clone);
//! - the probe port is absent (ICMP), a port number 1..=65535 (trimmed: TCP), or invalid (raw).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::annotations as key;
use super::names;
use crate::policy::contract::types::{Backend, BootMode, GuestOs, ReadinessProbe, RestoreMode, SnapshotPolicy, VmSpec};

/// A pod whose annotations cannot describe a VM.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmSpecError {
    #[error("pod has no {} annotation: the operator must name the VM", key::VM_NAME)]
    MissingVmName,
    /// A VM name (the pod's own, or the one it forks) that cocoon would refuse.
    #[error(
        "{key} {value:?} is not a VM name cocoon accepts ({}); fix the annotation and recreate the pod",
        names::VM_NAME_RULE
    )]
    InvalidVmName { key: &'static str, value: String },
    /// A pre-assigned VM id that is not an id (a path, a flag, a control character).
    #[error(
        "{} {value:?} is not a VM id ({}); fix the annotation and recreate the pod",
        key::VM_ID,
        names::VM_ID_RULE
    )]
    InvalidVmId { value: String },
}

/// The closed-domain rule: trimmed of ASCII whitespace, ASCII-lower-cased.
fn normalized(raw: &str) -> String {
    raw.trim_matches(|c: char| c.is_ascii_whitespace()).to_ascii_lowercase()
}

pub fn guest_os(raw: &str) -> GuestOs {
    match normalized(raw).as_str() {
        "" | "linux" => GuestOs::Linux,
        "windows" => GuestOs::Windows,
        "android" => GuestOs::Android,
        "macos" => GuestOs::Macos,
        _ => GuestOs::Unknown(raw.to_string()),
    }
}

/// The `backend` annotation, and the hypervisor cocoon reports for a VM or a snapshot.
pub fn backend(raw: &str) -> Backend {
    match normalized(raw).as_str() {
        "" => Backend::Unspecified,
        "cloud-hypervisor" => Backend::CloudHypervisor,
        "firecracker" => Backend::Firecracker,
        _ => Backend::Unknown(raw.to_string()),
    }
}

/// The contract's backend of a parsed hypervisor. A value cocoon did not name exactly is decoded
/// as a pod's `backend` annotation is (case and surrounding blanks ignored), as before it was typed.
pub fn backend_of(h: &crate::hypervisor::Hypervisor) -> Backend {
    use crate::hypervisor::Hypervisor;
    match h {
        Hypervisor::CloudHypervisor => Backend::CloudHypervisor,
        Hypervisor::Firecracker => Backend::Firecracker,
        Hypervisor::Unspecified => Backend::Unspecified,
        Hypervisor::Other(raw) => backend(raw),
    }
}

pub fn boot_mode(raw: &str) -> BootMode {
    if normalized(raw) == "run" {
        BootMode::Run
    } else {
        BootMode::Clone
    }
}

pub fn snapshot_policy(raw: &str) -> SnapshotPolicy {
    match normalized(raw).as_str() {
        "" | "always" => SnapshotPolicy::Always,
        "main-only" => SnapshotPolicy::MainOnly,
        "never" => SnapshotPolicy::Never,
        _ => SnapshotPolicy::Unknown(raw.to_string()),
    }
}

/// `VK_RESTORE_MODE`: `None` outside the domain (the daemon refuses to start).
pub fn restore_mode(raw: &str) -> Option<RestoreMode> {
    match normalized(raw).as_str() {
        "copy" => Some(RestoreMode::Copy),
        "ondemand" => Some(RestoreMode::Ondemand),
        "mmap" => Some(RestoreMode::Mmap),
        _ => None,
    }
}

pub fn probe(raw: &str) -> ReadinessProbe {
    let text = raw.trim_matches(|c: char| c.is_ascii_whitespace());
    if text.is_empty() {
        return ReadinessProbe::Icmp;
    }
    match text.parse::<u16>() {
        Ok(port) if port > 0 => ReadinessProbe::Tcp(port),
        _ => ReadinessProbe::Invalid(raw.to_string()),
    }
}

/// Decodes whatever is there, leaving absent keys at their defaults.
pub fn decode(annotations: &BTreeMap<String, String>) -> VmSpec {
    let text = |k: &str| annotations.get(k).cloned().unwrap_or_default();
    let raw = |k: &str| annotations.get(k).map(String::as_str).unwrap_or("");
    let flag = |k: &str| annotations.get(k).is_some_and(|v| v == "true");
    VmSpec {
        vm_name: text(key::VM_NAME),
        image: text(key::IMAGE),
        mode: boot_mode(raw(key::MODE)),
        os: guest_os(raw(key::OS)),
        storage: text(key::STORAGE),
        network: text(key::NETWORK),
        snapshot_policy: snapshot_policy(raw(key::SNAPSHOT_POLICY)),
        fork_from: text(key::FORK_FROM),
        clone_from_dir: text(key::CLONE_FROM_DIR),
        managed: flag(key::MANAGED),
        force_pull: flag(key::FORCE_PULL),
        no_direct_io: flag(key::NO_DIRECT_IO),
        conn_type: text(key::CONN_TYPE),
        backend: backend(raw(key::BACKEND)),
        probe: probe(raw(key::PROBE_PORT)),
        restore_from_hibernate: flag(key::RESTORE_FROM_HIBERNATE),
        hibernate: flag(key::HIBERNATE),
        keep_snapshot_on_delete: flag(key::KEEP_SNAPSHOT_ON_DELETE),
    }
}

/// The spec of a pod object (no annotations decode to the defaults).
pub fn of_pod(pod: &Pod) -> VmSpec {
    match &pod.metadata.annotations {
        Some(annotations) => decode(annotations),
        None => decode(&BTreeMap::new()),
    }
}

/// The spec of a pod that must name its VM (CreatePod cannot proceed without one).
pub fn require_vm_name(spec: VmSpec) -> Result<VmSpec, VmSpecError> {
    if spec.vm_name.is_empty() {
        Err(VmSpecError::MissingVmName)
    } else {
        Ok(spec)
    }
}

/// The names and the pre-assigned id the pod hands cocoon, by cocoon's rules: the VM name, the
/// VM it forks, and — for an unmanaged pod, whose VM is named by it — the pre-assigned id.
pub fn check_names(spec: &VmSpec, preassigned_id: &str) -> Result<(), VmSpecError> {
    let name = |key: &'static str, value: &str| {
        if names::is_vm_name(value) {
            Ok(())
        } else {
            Err(VmSpecError::InvalidVmName {
                key,
                value: value.to_string(),
            })
        }
    };
    name(key::VM_NAME, &spec.vm_name)?;
    if !spec.fork_from.is_empty() {
        name(key::FORK_FROM, &spec.fork_from)?;
    }
    if !spec.managed && !preassigned_id.is_empty() && !names::is_vm_id(preassigned_id) {
        return Err(VmSpecError::InvalidVmId {
            value: preassigned_id.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn booleans_are_true_only_for_the_exact_string() {
        for (value, want) in [
            ("true", true),
            ("True", false),
            ("1", false),
            (" true", false),
            ("", false),
        ] {
            let spec = decode(&annotations(&[(key::MANAGED, value), (key::HIBERNATE, value)]));
            assert_eq!((spec.managed, spec.hibernate), (want, want), "{value:?}");
        }
    }

    #[test]
    fn free_text_is_taken_raw() {
        let spec = decode(&annotations(&[(key::VM_NAME, " vm "), (key::CLONE_FROM_DIR, "  ")]));
        assert_eq!((spec.vm_name.as_str(), spec.clone_from_dir.as_str()), (" vm ", "  "));
    }

    #[test]
    fn closed_domains_ignore_case_and_surrounding_whitespace_and_keep_unknown_values_raw() {
        assert_eq!(guest_os(""), GuestOs::Linux);
        assert_eq!(guest_os(" Windows\t"), GuestOs::Windows);
        assert_eq!(guest_os("MacOS"), GuestOs::Macos);
        assert_eq!(guest_os("Plan 9"), GuestOs::Unknown("Plan 9".into()));
        assert_eq!(backend(""), Backend::Unspecified);
        assert_eq!(backend("Cloud-Hypervisor "), Backend::CloudHypervisor);
        assert_eq!(backend("firecracker"), Backend::Firecracker);
        assert_eq!(backend("qemu"), Backend::Unknown("qemu".into()));
        assert_eq!(boot_mode(" RUN"), BootMode::Run);
        assert_eq!(boot_mode("static"), BootMode::Clone);
        assert_eq!(boot_mode(""), BootMode::Clone);
        assert_eq!(snapshot_policy(""), SnapshotPolicy::Always);
        assert_eq!(snapshot_policy("Main-Only"), SnapshotPolicy::MainOnly);
        assert_eq!(
            snapshot_policy("sometimes"),
            SnapshotPolicy::Unknown("sometimes".into())
        );
        assert_eq!(restore_mode(" MMAP "), Some(RestoreMode::Mmap));
        assert_eq!(restore_mode("fast"), None);
    }

    #[test]
    fn probe_ports_are_port_numbers() {
        assert_eq!(probe(""), ReadinessProbe::Icmp);
        assert_eq!(probe(" "), ReadinessProbe::Icmp);
        assert_eq!(probe("22"), ReadinessProbe::Tcp(22));
        assert_eq!(probe(" 8080 "), ReadinessProbe::Tcp(8080));
        for bad in ["0", "65536", "ssh", "-1"] {
            assert_eq!(probe(bad), ReadinessProbe::Invalid(bad.into()), "{bad:?}");
        }
    }

    #[test]
    fn names_and_ids_are_checked_by_cocoons_rules() {
        let spec = |pairs: &[(&str, &str)]| decode(&annotations(pairs));
        assert_eq!(check_names(&spec(&[(key::VM_NAME, "vk-ns-a-0")]), ""), Ok(()));
        let err = check_names(&spec(&[(key::VM_NAME, "vk-$(touch x)")]), "").unwrap_err();
        assert!(
            err.to_string().contains("vm.cocoonstack.io/name \"vk-$(touch x)\""),
            "{err}"
        );
        let err = check_names(&spec(&[(key::VM_NAME, "vm"), (key::FORK_FROM, "../x")]), "").unwrap_err();
        assert!(err.to_string().contains(key::FORK_FROM), "{err}");
        // An unmanaged pod's VM is named by its id: a path there is refused.
        let err = check_names(&spec(&[(key::VM_NAME, "vm")]), "/tmp/x").unwrap_err();
        assert_eq!(err, VmSpecError::InvalidVmId { value: "/tmp/x".into() });
        // A managed pod's id annotation is the daemon's own output, not a name it is given.
        let managed = spec(&[(key::VM_NAME, "vm"), (key::MANAGED, "true")]);
        assert_eq!(check_names(&managed, "/tmp/x"), Ok(()));
    }

    #[test]
    fn a_missing_vm_name_is_a_named_error() {
        let err = require_vm_name(decode(&annotations(&[(key::IMAGE, "x")]))).unwrap_err();
        assert!(err.to_string().contains("vm.cocoonstack.io/name"));
    }
}
