//! The macOS path's decisions, pure (`DECISIONS.md` row 7). They are the host's for
//! now: the bring-up and translation contracts (WIT v0.1/v0.2) have no macOS facts or plans, so
//! the adopt / start / run choice, the launch sizes and the refusals are taken here, in this
//! one module, until the contract grows them (`src/provider/macos/README.md`).

use crate::policy::contract::resource_translation::GuestResources;
use crate::runtime::macos::MacVm;

// How the rest of the provider records and recognises a macOS VM lives below this folder
// (the probe start needs it, and the macOS path reaches the probe start through the boot finish).
pub use crate::provider::mac_guest::{HYPERVISOR, is_macos_vm, record, vm_id};

/// The macOS defaults of cocoon-macos (and vk-cocoon): 4 vCPUs, 8192 MiB.
pub const DEFAULT_CPUS: u32 = 4;
pub const DEFAULT_MEMORY_MIB: u64 = 8192;
const MIB: u64 = 1 << 20;

/// What `cocoon-macos vm inspect NAME` said, and what CreatePod does about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A live qemu runs the VM: adopt it.
    AdoptLive(MacVm),
    /// A record whose qemu is dead: `vm start` it (the disk is the guest's; never re-created).
    StartDead(MacVm),
    /// Nothing there: ensure the image, then `vm run`.
    RunNew,
}

/// `inspected`: `None` when the CLI said the VM does not exist. `alive`: whether a pid is live.
pub fn step(inspected: Option<MacVm>, alive: impl Fn(i64) -> bool) -> Step {
    match inspected {
        None => Step::RunNew,
        Some(vm) if vm.pid > 0 && alive(vm.pid) => Step::AdoptLive(vm),
        Some(vm) => Step::StartDead(vm),
    }
}

/// The `vm run` sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub cpus: u32,
    pub memory_mib: u64,
    pub storage_bytes: Option<u64>,
}

/// From the translation policy's guest resources: vCPUs rounded up to an even count (macOS
/// guests want one), memory in whole MiB (rounded up), and a system disk never below the
/// image's virtual size (the CLI refuses to shrink one; `None` keeps the image's size).
pub fn sizes(guest: Option<&GuestResources>, image_virtual_size: u64) -> Sizes {
    let cpus = guest.and_then(|g| g.vcpus).filter(|c| *c > 0).unwrap_or(DEFAULT_CPUS);
    let memory_mib = guest
        .and_then(|g| g.memory_bytes)
        .filter(|b| *b > 0)
        .map(|b| b.div_ceil(MIB))
        .unwrap_or(DEFAULT_MEMORY_MIB);
    let storage_bytes = guest
        .and_then(|g| g.storage_bytes)
        .filter(|b| *b > 0)
        .map(|b| b.max(image_virtual_size));
    Sizes {
        cpus: cpus.saturating_add(cpus % 2),
        memory_mib,
        storage_bytes,
    }
}

/// `COCOON_MACOS_VNC_PASSWORD` as QEMU and cocoon-macos accept it: at most 8 bytes, no control
/// characters (a newline would inject a second monitor command).
pub fn check_vnc_password(pw: &str) -> Result<(), BadVncPassword> {
    if pw.len() > 8 {
        return Err(BadVncPassword::TooLong { bytes: pw.len() });
    }
    if let Some(c) = pw.chars().find(|c| c.is_control()) {
        return Err(BadVncPassword::ControlCharacter(c));
    }
    Ok(())
}

/// A `COCOON_MACOS_VNC_PASSWORD` that QEMU would refuse (or misread).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadVncPassword {
    #[error(
        "COCOON_MACOS_VNC_PASSWORD is {bytes} bytes; VNC passwords are at most 8 bytes (QEMU's limit): set a shorter one, or unset it to run macOS guests without VNC"
    )]
    TooLong { bytes: usize },
    #[error(
        "COCOON_MACOS_VNC_PASSWORD contains the control character {0:?}; use printable characters only, or unset it to run macOS guests without VNC"
    )]
    ControlCharacter(char),
}

/// Whether `pid` is a live process (signal 0 succeeds) that is not a zombie.
pub fn pid_alive(pid: i64) -> bool {
    let Ok(pid) = i32::try_from(pid) else { return false };
    if pid <= 0 {
        return false;
    }
    let exists = crate::host::process::exists(pid);
    let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim_start().starts_with('Z')))
        .unwrap_or(false);
    exists && !zombie
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(pid: i64) -> MacVm {
        MacVm {
            name: "m".into(),
            pid,
            mac: "52:54:00:00:00:01".into(),
            ..Default::default()
        }
    }

    #[test]
    fn inspect_decides_adopt_start_or_run() {
        assert_eq!(step(None, |_| true), Step::RunNew);
        assert_eq!(step(Some(vm(7)), |p| p == 7), Step::AdoptLive(vm(7)));
        assert_eq!(step(Some(vm(7)), |_| false), Step::StartDead(vm(7)));
        assert_eq!(
            step(Some(vm(0)), |_| true),
            Step::StartDead(vm(0)),
            "pid 0: a stopped record, whatever signal 0 says"
        );
    }

    fn guest(vcpus: Option<u32>, memory: Option<u64>, storage: Option<u64>) -> GuestResources {
        GuestResources {
            vcpus,
            memory_bytes: memory,
            storage_bytes: storage,
        }
    }

    #[test]
    fn sizes_default_round_to_even_and_floor_the_disk() {
        assert_eq!(
            sizes(None, 100 << 30),
            Sizes {
                cpus: 4,
                memory_mib: 8192,
                storage_bytes: None
            }
        );
        let s = sizes(Some(&guest(Some(3), Some((4 << 30) + 1), Some(20 << 30))), 100 << 30);
        assert_eq!(s.cpus, 4, "odd vCPU counts round up");
        assert_eq!(s.memory_mib, 4097, "memory rounds up to a whole MiB");
        assert_eq!(s.storage_bytes, Some(100 << 30), "never below the image's virtual size");
        let s = sizes(Some(&guest(Some(6), None, Some(200 << 30))), 100 << 30);
        assert_eq!((s.cpus, s.memory_mib, s.storage_bytes), (6, 8192, Some(200 << 30)));
        assert_eq!(sizes(Some(&guest(Some(1), None, None)), 0).cpus, 2);
    }

    #[test]
    fn vnc_passwords_are_checked_as_qemu_would() {
        assert!(check_vnc_password("abcdefgh").is_ok());
        assert!(check_vnc_password("").is_ok());
        let long = check_vnc_password("abcdefghi").unwrap_err().to_string();
        assert!(long.contains("9 bytes") && long.contains("at most 8"), "{long}");
        let ctl = check_vnc_password("ab\ncd").unwrap_err().to_string();
        assert!(ctl.contains("control character"), "{ctl}");
        assert!(check_vnc_password("é漢漢").is_ok(), "8 bytes of UTF-8");
        assert!(check_vnc_password("漢漢漢").is_err(), "3 characters, 9 bytes");
    }

    #[test]
    fn the_record_is_a_dhcp_vm_named_qemu() {
        let r = record("mac-1", &vm(42));
        assert_eq!(
            (r.id.as_str(), r.hypervisor.as_str(), r.name()),
            ("qemu-mac-1", "qemu", "mac-1")
        );
        assert_eq!(r.primary_mac(), Some("52:54:00:00:00:01"));
        assert_eq!(r.primary_ip(), None);
        assert!(is_macos_vm(&r));
        assert_eq!(
            crate::provider::plan::dhcp_macs(&r),
            vec!["52:54:00:00:00:01".to_string()]
        );
        assert!(pid_alive(std::process::id() as i64));
        assert!(!pid_alive(0));
    }
}
