//! The decision slots of the policy contract.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Version of the WIT package every slot's interface belongs to.
pub const WIT_PACKAGE: &str = "cocoonstack:vk-policy@0.1.0";

/// One decision the daemon delegates to a policy component.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Slot {
    SnapshotBeforeDestroy,
    BringUp,
    CpuClassAdmission,
    ResourceTranslation,
    GuestFixup,
}

impl Slot {
    pub const ALL: [Slot; 5] = [
        Slot::SnapshotBeforeDestroy,
        Slot::BringUp,
        Slot::CpuClassAdmission,
        Slot::ResourceTranslation,
        Slot::GuestFixup,
    ];

    /// The slot's name, which is also its WIT interface name.
    pub fn name(self) -> &'static str {
        match self {
            Slot::SnapshotBeforeDestroy => "snapshot-before-destroy",
            Slot::BringUp => "bring-up",
            Slot::CpuClassAdmission => "cpu-class-admission",
            Slot::ResourceTranslation => "resource-translation",
            Slot::GuestFixup => "guest-fixup",
        }
    }

    /// The WIT world a component for this slot implements.
    pub fn world(self) -> String {
        format!("{}-policy", self.name())
    }

    /// The fully qualified interface the component must export.
    pub fn export_name(self) -> String {
        let (package, version) = WIT_PACKAGE.split_once('@').expect("package carries a version");
        format!("{package}/{}@{version}", self.name())
    }

    /// What the host does when this slot's policy fails (trap, timeout, memory, bad answer).
    pub fn fail_safe_rule(self) -> &'static str {
        match self {
            Slot::SnapshotBeforeDestroy => {
                "preserve state: snapshot and push before destroying, or keep the VM and retry the delete"
            }
            Slot::BringUp => "refuse the bring-up: no VM boots",
            Slot::CpuClassAdmission => "reject the pod (at startup: the node does not register)",
            Slot::ResourceTranslation => "refuse the bring-up rather than boot with guessed limits",
            Slot::GuestFixup => {
                "run nothing in the guest, mark the lifecycle failed and never publish Ready (the pod stays Running / Not Ready)"
            }
        }
    }

    /// The embedded default component.
    pub fn default_component(self) -> &'static [u8] {
        use policy_artifacts::defaults;
        match self {
            Slot::SnapshotBeforeDestroy => defaults::SNAPSHOT_BEFORE_DESTROY,
            Slot::BringUp => defaults::BRING_UP,
            Slot::CpuClassAdmission => defaults::CPU_CLASS_ADMISSION,
            Slot::ResourceTranslation => defaults::RESOURCE_TRANSLATION,
            Slot::GuestFixup => defaults::GUEST_FIXUP,
        }
    }

    /// The `VK_POLICY_*` variable that points this slot at a component file.
    pub fn env_var(self) -> String {
        format!("VK_POLICY_{}", self.name().replace('-', "_").to_ascii_uppercase())
    }
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Slot {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Slot::ALL.into_iter().find(|slot| slot.name() == text).ok_or_else(|| {
            let names: Vec<_> = Slot::ALL.iter().map(|s| s.name()).collect();
            format!("unknown policy slot {text:?}; the slots are {}", names.join(", "))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_slots() {
        for slot in Slot::ALL {
            assert_eq!(slot.name().parse::<Slot>(), Ok(slot));
        }
        let err = "bringup".parse::<Slot>().unwrap_err();
        assert!(err.contains("bring-up") && err.contains("guest-fixup"), "{err}");
    }

    #[test]
    fn export_names_and_env_vars() {
        assert_eq!(Slot::BringUp.export_name(), "cocoonstack:vk-policy/bring-up@0.1.0");
        assert_eq!(Slot::CpuClassAdmission.env_var(), "VK_POLICY_CPU_CLASS_ADMISSION");
        assert_eq!(
            Slot::GuestFixup.export_name(),
            "cocoonstack:vk-policy/guest-fixup@0.1.0"
        );
        assert_eq!(Slot::GuestFixup.world(), "guest-fixup-policy");
        assert_eq!(Slot::GuestFixup.env_var(), "VK_POLICY_GUEST_FIXUP");
    }
}
