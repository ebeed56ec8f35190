//! Default `guest-fixup` policy: after a clone, fork, clone-from-dir, wake or run, decide which
//! commands must run in the guest, and which static addresses must be set through its serial
//! console, before it is usable.
//!
//! A Windows guest's static NICs get their addresses through the Special Administration
//! Console (the host sets them after any command ran): after a clone, fork or clone-from-dir
//! beside the network-device reset, and after a `run` alone. A wake keeps the guest's own
//! configuration (it is the same guest), and a Linux guest gets its addresses from the script.
//!
//! A fixup is needed for a Windows guest, a firecracker guest, or any static NIC; a
//! cloud-hypervisor Linux guest whose NICs all use DHCP heals itself. Unmanaged pods get no
//! guest work. The kind is `windows` > `linux_fc` > `linux_static`. The Linux script splices in
//! the VM name and the NICs' MACs and addresses, so they are checked first: a value outside its
//! safe character set is refused (`unsafe-vm-name`, `unsafe-nic`) rather than quoted, so that a
//! hostile annotation or record can never become shell text.
//!
//! As in the spec, firecracker is read from the pod's backend annotation; the `hypervisor` cocoon
//! reports is passed for custom policies and not consulted here.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

mod safety;
mod script;

use alloc::format;
use alloc::string::String;

// Natively the bindings also derive serde, so the benchmark can hand this crate the host's
// facts (same JSON shape: both sides are generated from the same WIT).
#[cfg(target_arch = "wasm32")]
wit_bindgen::generate!({ world: "guest-fixup-policy", path: "../../wit", additional_derives: [PartialEq] });
#[cfg(not(target_arch = "wasm32"))]
wit_bindgen::generate!({
    world: "guest-fixup-policy",
    path: "../../wit",
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});

use cocoonstack::vk_policy::types::{Backend, EventReason, GuestOs, Refusal, RefusalKind};
pub use exports::cocoonstack::vk_policy::guest_fixup::{
    BootOrigin, ConsoleAddress, Decision, Facts, Fixup, FixupKind, Nic, Outcome,
};
// The no_std runtime glue (allocator, panic handler, cabi_realloc) lives in the support crate.
use vk_policy_support as _;

pub use safety::is_valid_vm_name;
pub use script::{NetworkConfig, WINDOWS_PS, linux_script};

pub struct Policy;

impl exports::cocoonstack::vk_policy::guest_fixup::Guest for Policy {
    fn decide(facts: Facts) -> Decision {
        decide(&facts)
    }
}

// Component exports exist only in the wasm build (export names contain `:`, which native
// linkers reject); natively the crate is a plain library for tests and benchmarks.
#[cfg(target_arch = "wasm32")]
export!(Policy);

/// What kind of fixup a guest needs (also its metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Windows,
    LinuxFc,
    LinuxStatic,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Windows, Kind::LinuxFc, Kind::LinuxStatic];

    pub fn label(self) -> &'static str {
        match self {
            Kind::Windows => "windows",
            Kind::LinuxFc => "linux_fc",
            Kind::LinuxStatic => "linux_static",
        }
    }

    /// The contract's kind (the host's metric label).
    pub fn wit(self) -> FixupKind {
        match self {
            Kind::Windows => FixupKind::Windows,
            Kind::LinuxFc => FixupKind::LinuxFc,
            Kind::LinuxStatic => FixupKind::LinuxStatic,
        }
    }

    /// The decision's reason: the label as a kebab-case token.
    pub fn reason(self) -> &'static str {
        match self {
            Kind::Windows => "windows",
            Kind::LinuxFc => "linux-fc",
            Kind::LinuxStatic => "linux-static",
        }
    }
}

/// `needed(spec, v)` and the kind, in the spec's precedence; `None` when the guest heals itself.
pub fn classify(facts: &Facts) -> Option<Kind> {
    if facts.spec.os == GuestOs::Windows {
        Some(Kind::Windows)
    } else if facts.spec.backend == Backend::Firecracker {
        Some(Kind::LinuxFc)
    } else if static_nics(facts) > 0 {
        Some(Kind::LinuxStatic)
    } else {
        None
    }
}

pub fn decide(facts: &Facts) -> Decision {
    let vm = safety::shown(&facts.spec.vm_name);
    let after = origin_name(facts.origin);
    if !facts.spec.managed {
        return none(
            "unmanaged",
            format!("vm {vm} is not managed by vk-cocoon: guest work after the {after} is the operator's"),
        );
    }
    if facts.origin == BootOrigin::Run {
        return after_run(facts, &vm);
    }
    let Some(kind) = classify(facts) else {
        return none(
            "not-needed",
            format!("vm {vm} needs no guest fixup after the {after}: not windows, not firecracker, no static NIC"),
        );
    };
    if kind == Kind::Windows {
        return windows(facts, &vm, after);
    }
    linux(facts, kind, &vm, after)
}

/// A fresh `run` boots with the configuration its image and cocoon gave it; only a Windows
/// guest's static addresses need setting, through its console.
fn after_run(facts: &Facts, vm: &str) -> Decision {
    if facts.spec.os != GuestOs::Windows || static_nics(facts) == 0 {
        return none(
            "not-needed",
            format!("vm {vm} needs no guest fixup after the run: only a Windows guest's static addresses are set"),
        );
    }
    if let Some(refused) = unsafe_nic(facts, vm) {
        return refused;
    }
    let addresses = console_addresses(facts);
    let message = format!(
        "vm {vm} needs its static addresses set through the serial console after the run: {}",
        count(addresses.len(), "static NIC")
    );
    let hint = script::sac_hint(&addresses);
    run_with(Kind::Windows, alloc::vec::Vec::new(), hint, addresses, message)
}

/// The network-device reset, then (static NICs) the addresses through the console; a wake
/// keeps the guest's own configuration.
fn windows(facts: &Facts, vm: &str, after: &str) -> Decision {
    // The PowerShell command is fixed text: nothing from the facts reaches it.
    let mut message = format!("vm {vm} needs a windows fixup after the {after}: re-enable its network devices");
    if facts.origin == BootOrigin::Wake || static_nics(facts) == 0 {
        return run(Kind::Windows, script::windows_argv(), script::windows_hint(), message);
    }
    if let Some(refused) = unsafe_nic(facts, vm) {
        return refused;
    }
    let addresses = console_addresses(facts);
    message.push_str(&format!(
        ", then set {} through the serial console",
        count(addresses.len(), "static address")
    ));
    let hint = format!("{}\n{}", script::windows_hint(), script::sac_hint(&addresses));
    run_with(Kind::Windows, script::windows_argv(), hint, addresses, message)
}

/// The static NICs' addresses as the console sets them: a prefix outside 1..=32 is a /24 (the
/// mask Windows would be given otherwise is meaningless).
fn console_addresses(facts: &Facts) -> alloc::vec::Vec<ConsoleAddress> {
    facts
        .nics
        .iter()
        .enumerate()
        .filter(|(_, nic)| !nic.ip.is_empty())
        .map(|(i, nic)| ConsoleAddress {
            nic: i as u32,
            ip: nic.ip.clone(),
            prefix: if (1..=32).contains(&nic.prefix) { nic.prefix } else { 24 },
            gateway: nic.gateway.clone(),
        })
        .collect()
}

/// A NIC value that would reach the guest outside its safe character set: the MAC and the
/// addresses of a Linux script, the static addresses typed at a Windows console.
fn unsafe_nic(facts: &Facts, vm: &str) -> Option<Decision> {
    let (i, field, value) = if facts.spec.os == GuestOs::Windows {
        facts.nics.iter().enumerate().find_map(|(i, nic)| {
            if !safety::is_safe_ipv4_text(&nic.ip) {
                Some((i, "ip", nic.ip.as_str()))
            } else if !safety::is_safe_ipv4_text(&nic.gateway) {
                Some((i, "gateway", nic.gateway.as_str()))
            } else {
                None
            }
        })?
    } else {
        safety::first_unsafe_nic(&facts.nics)?
    };
    let allowed = if field == "mac" {
        "a non-empty run of hex digits and ':'"
    } else {
        "IPv4 digits and '.'"
    };
    let into = if facts.spec.os == GuestOs::Windows {
        "typed at the guest's serial console"
    } else {
        "written into the guest script"
    };
    Some(refuse(
        "unsafe-nic",
        format!(
            "NIC {i} (eth{i}) of vm {vm} has an unsafe {field} {}: only {allowed} may be {into}; nothing was run: fix the VM's network record and recreate the pod",
            safety::quoted(value)
        ),
    ))
}

fn linux(facts: &Facts, kind: Kind, vm: &str, after: &str) -> Decision {
    let name = facts.spec.vm_name.as_str();
    if !safety::is_valid_vm_name(name) {
        return refuse(
            "unsafe-vm-name",
            format!(
                "vm name {} does not match cocoon's ^[a-zA-Z0-9][a-zA-Z0-9._-]{{0,62}}$, so it is not written into the guest script; nothing was run: fix the pod's vm.cocoonstack.io/name and recreate it",
                safety::quoted(name)
            ),
        );
    }
    if let Some(refused) = unsafe_nic(facts, vm) {
        return refused;
    }
    let firecracker = kind == Kind::LinuxFc;
    let network = if is_cloud_image(facts) {
        NetworkConfig::CloudInit
    } else {
        NetworkConfig::Networkd
    };
    let script = linux_script(name, &facts.nics, firecracker, network);
    let nics = facts.nics.len();
    let statics = static_nics(facts);
    let what = match kind {
        Kind::LinuxFc => format!(
            "firecracker guest with {} ({statics} static), MACs re-applied",
            count(nics, "NIC")
        ),
        _ => count(statics, "static NIC"),
    };
    let how = match network {
        NetworkConfig::CloudInit => "cloud-init re-run",
        NetworkConfig::Networkd => "systemd-networkd config rewritten",
    };
    let message = format!(
        "vm {vm} needs a {} fixup after the {after}: {what}, {how}",
        kind.label()
    );
    let argv = alloc::vec!["sh".into(), "-c".into(), script.clone()];
    run(kind, argv, script, message)
}

fn static_nics(facts: &Facts) -> usize {
    facts.nics.iter().filter(|nic| !nic.ip.is_empty()).count()
}

/// A cloud image: the clone source is an http(s) image, or (fork, wake) the VM boots from a
/// cloud-image overlay.
fn is_cloud_image(facts: &Facts) -> bool {
    let source = facts.source_image.as_str();
    source.starts_with("http://") || source.starts_with("https://") || facts.cloudimg_overlay
}

fn origin_name(origin: BootOrigin) -> &'static str {
    match origin {
        BootOrigin::Clone => "clone",
        BootOrigin::Fork => "fork",
        BootOrigin::CloneFromDir => "clone-from-dir",
        BootOrigin::Wake => "wake",
        BootOrigin::Run => "run",
    }
}

fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn run(kind: Kind, argv: alloc::vec::Vec<String>, hint: String, message: String) -> Decision {
    run_with(kind, argv, hint, alloc::vec::Vec::new(), message)
}

fn run_with(
    kind: Kind,
    argv: alloc::vec::Vec<String>,
    hint: String,
    console_addresses: alloc::vec::Vec<ConsoleAddress>,
    message: String,
) -> Decision {
    Decision {
        outcome: Outcome::Run(Fixup {
            kind: kind.wit(),
            argv,
            hint,
            console_addresses,
        }),
        reason: kind.reason().into(),
        message,
    }
}

fn none(reason: &str, message: String) -> Decision {
    Decision {
        outcome: Outcome::None,
        reason: reason.into(),
        message,
    }
}

/// The values are the pod's and the VM's: nothing changes them but recreating the pod.
fn refuse(reason: &str, message: String) -> Decision {
    Decision {
        outcome: Outcome::Refuse(Refusal {
            kind: RefusalKind::Permanent,
            event: EventReason::PostCloneRefused,
        }),
        reason: reason.into(),
        message,
    }
}

#[cfg(test)]
mod tests;
