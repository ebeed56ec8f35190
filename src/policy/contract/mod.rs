//! The policy contract as Rust types, generated from the WIT by wasmtime's bindgen: the current
//! version (`wit/vk-policy.wit`), whose records the host uses as they are (facts it builds,
//! decisions it acts on; serde for case tables), and the frozen 0.1.0 and 0.2.0 (`wit/v0.1.0/`,
//! `wit/v0.2.0/`), which [`super::slots`] adapts to the current types.
//!
//! The shared `types` interface is generated once per version (in its `snapshot` world) and
//! reused by the other worlds, so a pod's facts have one Rust type whatever slot they go to.

use std::fmt;

/// A contract version the host speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ContractVersion {
    V0_1_0,
    V0_2_0,
    V0_3_0,
}

impl ContractVersion {
    /// Every version the host loads, oldest first.
    pub const SPOKEN: [ContractVersion; 3] = [
        ContractVersion::V0_1_0,
        ContractVersion::V0_2_0,
        ContractVersion::V0_3_0,
    ];
    /// The version the default policies and `policy new` use.
    pub const CURRENT: ContractVersion = ContractVersion::V0_3_0;
    pub const PACKAGE: &str = "cocoonstack:vk-policy";

    pub fn as_str(self) -> &'static str {
        match self {
            ContractVersion::V0_1_0 => "0.1.0",
            ContractVersion::V0_2_0 => "0.2.0",
            ContractVersion::V0_3_0 => "0.3.0",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::SPOKEN.into_iter().find(|v| v.as_str() == text)
    }

    /// `cocoonstack:vk-policy/<interface>@<version>`.
    pub fn interface(self, name: &str) -> String {
        format!("{}/{name}@{}", Self::PACKAGE, self.as_str())
    }

    /// "0.1.0, 0.2.0, 0.3.0", for messages.
    pub fn spoken_list() -> String {
        Self::SPOKEN.map(|v| v.as_str()).join(", ")
    }
}

impl fmt::Display for ContractVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", Self::PACKAGE, self.as_str())
    }
}

/// Bindings of the current contract.
mod current {
    pub mod snapshot {
        wasmtime::component::bindgen!({
            world: "snapshot-before-destroy-policy",
            path: "wit",
            additional_derives: [serde::Serialize, serde::Deserialize, PartialEq, Eq],
        });
    }
    pub mod bring_up {
        wasmtime::component::bindgen!({
            world: "bring-up-policy",
            path: "wit",
            additional_derives: [serde::Serialize, serde::Deserialize, PartialEq, Eq],
            with: { "cocoonstack:vk-policy/types": super::snapshot::cocoonstack::vk_policy::types },
        });
    }
    pub mod admission {
        wasmtime::component::bindgen!({
            world: "cpu-class-admission-policy",
            path: "wit",
            additional_derives: [serde::Serialize, serde::Deserialize, PartialEq, Eq],
            with: { "cocoonstack:vk-policy/types": super::snapshot::cocoonstack::vk_policy::types },
        });
    }
    pub mod translation {
        wasmtime::component::bindgen!({
            world: "resource-translation-policy",
            path: "wit",
            additional_derives: [serde::Serialize, serde::Deserialize, PartialEq, Eq],
            with: { "cocoonstack:vk-policy/types": super::snapshot::cocoonstack::vk_policy::types },
        });
    }
    pub mod guest_fixup {
        wasmtime::component::bindgen!({
            world: "guest-fixup-policy",
            path: "wit",
            additional_derives: [serde::Serialize, serde::Deserialize, PartialEq, Eq],
            with: { "cocoonstack:vk-policy/types": super::snapshot::cocoonstack::vk_policy::types },
        });
    }
}

/// Bindings of the frozen 0.1.0 contract (no derives: only the adapters touch them).
pub(crate) mod v0_1 {
    pub mod snapshot {
        wasmtime::component::bindgen!({ world: "snapshot-before-destroy-policy", path: "wit/v0.1.0" });
    }
    pub mod bring_up {
        wasmtime::component::bindgen!({
            world: "bring-up-policy",
            path: "wit/v0.1.0",
            with: { "cocoonstack:vk-policy/types": super::snapshot::cocoonstack::vk_policy::types },
        });
    }
    pub mod admission {
        wasmtime::component::bindgen!({
            world: "cpu-class-admission-policy",
            path: "wit/v0.1.0",
            with: { "cocoonstack:vk-policy/types": super::snapshot::cocoonstack::vk_policy::types },
        });
    }
    pub mod translation {
        wasmtime::component::bindgen!({
            world: "resource-translation-policy",
            path: "wit/v0.1.0",
            with: { "cocoonstack:vk-policy/types": super::snapshot::cocoonstack::vk_policy::types },
        });
    }
    pub mod guest_fixup {
        wasmtime::component::bindgen!({
            world: "guest-fixup-policy",
            path: "wit/v0.1.0",
            with: { "cocoonstack:vk-policy/types": super::snapshot::cocoonstack::vk_policy::types },
        });
    }
    pub use snapshot::cocoonstack::vk_policy::types;
}

/// Bindings of the frozen 0.2.0 contract. Its records have the current shapes minus the 0.3.0
/// additions, so they derive serde: the adapters carry values across by their JSON form.
pub(crate) mod v0_2 {
    pub mod snapshot {
        wasmtime::component::bindgen!({
            world: "snapshot-before-destroy-policy",
            path: "wit/v0.2.0",
            additional_derives: [serde::Serialize, serde::Deserialize],
        });
    }
    pub mod bring_up {
        wasmtime::component::bindgen!({
            world: "bring-up-policy",
            path: "wit/v0.2.0",
            additional_derives: [serde::Serialize, serde::Deserialize],
            with: { "cocoonstack:vk-policy/types": super::snapshot::cocoonstack::vk_policy::types },
        });
    }
    pub mod admission {
        wasmtime::component::bindgen!({
            world: "cpu-class-admission-policy",
            path: "wit/v0.2.0",
            additional_derives: [serde::Serialize, serde::Deserialize],
            with: { "cocoonstack:vk-policy/types": super::snapshot::cocoonstack::vk_policy::types },
        });
    }
    pub mod translation {
        wasmtime::component::bindgen!({
            world: "resource-translation-policy",
            path: "wit/v0.2.0",
            additional_derives: [serde::Serialize, serde::Deserialize],
            with: { "cocoonstack:vk-policy/types": super::snapshot::cocoonstack::vk_policy::types },
        });
    }
    pub mod guest_fixup {
        wasmtime::component::bindgen!({
            world: "guest-fixup-policy",
            path: "wit/v0.2.0",
            additional_derives: [serde::Serialize, serde::Deserialize],
            with: { "cocoonstack:vk-policy/types": super::snapshot::cocoonstack::vk_policy::types },
        });
    }
}

/// Facts and refusal types shared by every slot.
pub mod types {
    pub use super::current::snapshot::cocoonstack::vk_policy::types::*;
}

/// Slot `snapshot-before-destroy`.
pub mod snapshot_before_destroy {
    pub use super::current::snapshot::SnapshotBeforeDestroyPolicy as World;
    pub use super::current::snapshot::SnapshotBeforeDestroyPolicyPre as Pre;
    pub use super::current::snapshot::exports::cocoonstack::vk_policy::snapshot_before_destroy::*;
}

/// Slot `bring-up`.
pub mod bring_up {
    pub use super::current::bring_up::BringUpPolicy as World;
    pub use super::current::bring_up::BringUpPolicyPre as Pre;
    pub use super::current::bring_up::exports::cocoonstack::vk_policy::bring_up::*;
}

/// Slot `cpu-class-admission`.
pub mod cpu_class_admission {
    pub use super::current::admission::CpuClassAdmissionPolicy as World;
    pub use super::current::admission::CpuClassAdmissionPolicyPre as Pre;
    pub use super::current::admission::exports::cocoonstack::vk_policy::cpu_class_admission::*;
}

/// Slot `resource-translation`.
pub mod resource_translation {
    pub use super::current::translation::ResourceTranslationPolicy as World;
    pub use super::current::translation::ResourceTranslationPolicyPre as Pre;
    pub use super::current::translation::exports::cocoonstack::vk_policy::resource_translation::*;
}

/// Slot `guest-fixup`.
pub mod guest_fixup {
    pub use super::current::guest_fixup::GuestFixupPolicy as World;
    pub use super::current::guest_fixup::GuestFixupPolicyPre as Pre;
    pub use super::current::guest_fixup::exports::cocoonstack::vk_policy::guest_fixup::*;
}
