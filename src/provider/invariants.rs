//! The host invariants: the few rules the provider applies itself rather than asking a policy,
//! because they describe what this build and the cocoon runtime can do, not a choice a policy could
//! make differently (`policies/README.md`, "Host invariants", lists them with the reasons). Each is
//! typed on the decoded VM spec; nothing here reads an annotation.

use crate::model::VmSpec;
use crate::policy::contract::types::{Backend, BootMode, GuestOs};

/// A cloud-hypervisor Windows guest is hibernated without its NIC (its DHCP lease released,
/// the NIC hot-removed before the save), so its hibernate snapshot has none: the restore adds
/// one fresh NIC and the boot finishes by waiting for that NIC's lease, not with a fixup. The
/// two halves must agree, or a wake comes up with no NIC or two; a policy cannot change one
/// without breaking the other, so both live here.
pub(super) fn nic_less_hibernate(spec: &VmSpec) -> bool {
    spec.backend == Backend::CloudHypervisor && spec.os == GuestOs::Windows
}

/// A Windows guest waiting for its lease gets one `ipconfig /renew` nudge (its DHCP client does
/// not retry soon enough on a fresh NIC).
pub(super) fn renew_nudge(spec: &VmSpec) -> bool {
    spec.os == GuestOs::Windows
}

/// `isClonedBoot`, for a VM found at restart without a fixup marker: the bring-up decision is
/// not persisted, so its path is read back from the spec (an explicit clone source, or any mode
/// but run, came from a snapshot and may owe a fixup).
pub(super) fn cloned_boot(spec: &VmSpec) -> bool {
    !spec.clone_from_dir.trim().is_empty() || !spec.fork_from.is_empty() || spec.mode != BootMode::Run
}

/// `vm_boot_duration_seconds{backend}`: a closed set of labels.
pub(super) fn backend_label(backend: &Backend) -> &'static str {
    match backend {
        Backend::Unspecified => "unspecified",
        Backend::CloudHypervisor => "cloud-hypervisor",
        Backend::Firecracker => "firecracker",
        Backend::Unknown(_) => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::vm_spec::decode;

    fn spec(pairs: &[(&str, &str)]) -> VmSpec {
        decode(&pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    const OS: &str = "cocoonset.cocoonstack.io/os";
    const BACKEND: &str = "vm.cocoonstack.io/backend";
    const MODE: &str = "cocoonset.cocoonstack.io/mode";

    #[test]
    fn only_cloud_hypervisor_windows_guests_hibernate_without_a_nic() {
        assert!(nic_less_hibernate(&spec(&[
            (BACKEND, "cloud-hypervisor"),
            (OS, "windows")
        ])));
        assert!(
            nic_less_hibernate(&spec(&[(BACKEND, "Cloud-Hypervisor"), (OS, " Windows")])),
            "one casing rule: the decoder's"
        );
        assert!(!nic_less_hibernate(&spec(&[(BACKEND, "firecracker"), (OS, "windows")])));
        assert!(
            !nic_less_hibernate(&spec(&[(OS, "windows")])),
            "an unspecified backend never drops a NIC"
        );
        assert!(renew_nudge(&spec(&[(OS, "WINDOWS")])));
        assert!(!renew_nudge(&spec(&[])));
    }

    #[test]
    fn cloned_boots() {
        assert!(cloned_boot(&spec(&[])));
        assert!(!cloned_boot(&spec(&[(MODE, "RUN")])));
        assert!(
            cloned_boot(&spec(&[(MODE, "run"), ("vm.cocoonstack.io/fork-from", "main")])),
            "fork-from overrides mode=run"
        );
    }
}
