//! The decision slots. Each is one type implementing [`PolicySlot`]: its facts and decision
//! (the contract's bindgen records, used as they are), its pre-instantiated world, how to call
//! it, its fail-safe decision, what it checks in an answer, and how a 0.1.0 component of the
//! slot is adapted. Everything else — loading, the sandbox, case tables, metrics, hot reload —
//! is written once, generically, over this trait.
//!
//! Adding a slot: a world in `wit/vk-policy.wit`, a guest crate under `policies/`, one module
//! here implementing [`PolicySlot`] (listed in `declare_slots!`), and its case table.

use std::fmt::{self, Debug};
use std::str::FromStr;

use serde::Serialize;
use serde::de::DeserializeOwned;
use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::contract::ContractVersion;
use super::limits::{MAX_MESSAGE_LEN, MAX_REASON_LEN};
use super::sandbox::Sandbox;
use crate::model::{PodFacts, VmSpec};

pub mod admission;
pub mod bring_up;
pub mod guest_fixup;
mod legacy;
pub mod snapshot;
pub mod translation;

pub use admission::CpuClassAdmission;
pub use bring_up::BringUp;
pub use guest_fixup::GuestFixup;
pub use snapshot::SnapshotBeforeDestroy;
pub use translation::ResourceTranslation;

/// A pod as a decision input: the object, and what every slot's facts start from.
pub struct PodInput<'a> {
    pub pod: &'a k8s_openapi::api::core::v1::Pod,
    pub facts: PodFacts,
    pub spec: VmSpec,
}

/// What the host reads of any decision (never to act on: for logs and metrics).
pub struct Summary<'a> {
    /// The policy's own token.
    pub reason: &'a str,
    pub message: &'a str,
    /// The outcome, from a closed set per slot (`cocoon_vk_policy_decisions_total{outcome}`).
    pub outcome: &'static str,
}

/// One decision slot of the contract.
pub trait PolicySlot: SlotCell + Sized + Send + Sync + 'static {
    const SLOT: Slot;
    /// The slot's name, which is also its WIT interface name.
    const NAME: &'static str;
    /// What the host does when this slot's policy fails (trap, timeout, memory, bad answer).
    const FAIL_SAFE_RULE: &'static str;

    type Facts: Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static;
    type Decision: Clone + Debug + PartialEq + Serialize + DeserializeOwned + Send + Sync + 'static;
    /// The current contract's pre-instantiated world.
    type Pre: WorldPre;
    /// The 0.1.0 world ([`NoLegacy`] for a slot newer than 0.1.0).
    type V0_1Pre: WorldPre;
    /// The 0.2.0 world.
    type V0_2Pre: WorldPre;

    /// The embedded default component.
    fn default_component() -> &'static [u8];

    fn call(
        world: &<Self::Pre as WorldPre>::World,
        store: &mut Store<Sandbox>,
        facts: &Self::Facts,
    ) -> wasmtime::Result<Self::Decision>;

    /// Calls a 0.1.0 component: the facts adapted down, its answer adapted up (`Err` when the
    /// answer has no meaning in the current contract).
    fn call_v0_1(
        world: &<Self::V0_1Pre as WorldPre>::World,
        store: &mut Store<Sandbox>,
        facts: &Self::Facts,
    ) -> wasmtime::Result<Result<Self::Decision, String>>;

    /// Calls a 0.2.0 component, the same way.
    fn call_v0_2(
        world: &<Self::V0_2Pre as WorldPre>::World,
        store: &mut Store<Sandbox>,
        facts: &Self::Facts,
    ) -> wasmtime::Result<Result<Self::Decision, String>>;

    /// The decision the host takes when the policy failed; `message` says what failed and what
    /// the host does instead. Never permissive.
    fn fail_safe(facts: &Self::Facts, message: String) -> Self::Decision;

    /// Slot-specific checks of an answer the host relies on (beyond [`Summary`]'s text bounds).
    fn check(decision: &Self::Decision) -> Result<(), String>;

    fn summary(decision: &Self::Decision) -> Summary<'_>;

    /// The facts of a pod with the host's side at its defaults (case tables and `policy eval`
    /// override them with `host:`); see `policies/README.md`, "Testing a policy", for each
    /// slot's defaults.
    fn default_facts(pod: PodInput<'_>) -> Self::Facts;

    /// Fills, in facts written as contract JSON (`host:` of a case table merged over the
    /// defaults), the fields a contract version added inside a variant's payload since the case
    /// was written: they take their empty value, so a table written for an older contract keeps
    /// parsing.
    fn fill_added_fields(_facts: &mut serde_json::Value) {}
}

/// Checks every answer: the slot's own rules, and text the host can log and publish.
pub fn validate<S: PolicySlot>(decision: &S::Decision) -> Result<(), String> {
    let summary = S::summary(decision);
    if !is_token(summary.reason, b"") {
        return Err(format!(
            "reason {:?} is not a lower-kebab-case token of at most {MAX_REASON_LEN} bytes",
            summary.reason
        ));
    }
    if summary.message.len() > MAX_MESSAGE_LEN {
        return Err(format!(
            "message is {} bytes, more than {MAX_MESSAGE_LEN}",
            summary.message.len()
        ));
    }
    S::check(decision)
}

/// A non-empty token of at most [`MAX_REASON_LEN`] bytes: lower-case ASCII letters, digits, `-`
/// and any of `extra`.
pub(crate) fn is_token(text: &str, extra: &[u8]) -> bool {
    !text.is_empty()
        && text.len() <= MAX_REASON_LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || extra.contains(&b))
}

/// Reason of every fail-safe decision.
pub const POLICY_FAILED: &str = "policy-failed";

/// A bindgen `*Pre` of one world: built once per loaded component, instantiated per decision.
pub trait WorldPre: Sized + Send + Sync + 'static {
    type World;
    fn new(pre: InstancePre<Sandbox>) -> wasmtime::Result<Self>;
    fn instantiate(&self, store: &mut Store<Sandbox>) -> wasmtime::Result<Self::World>;
}

macro_rules! world_pre {
    ($($pre:ty => $world:ty),* $(,)?) => {
        $(impl $crate::policy::slots::WorldPre for $pre {
            type World = $world;
            fn new(
                pre: wasmtime::component::InstancePre<$crate::policy::sandbox::Sandbox>,
            ) -> wasmtime::Result<Self> {
                <$pre>::new(pre)
            }
            fn instantiate(
                &self,
                store: &mut wasmtime::Store<$crate::policy::sandbox::Sandbox>,
            ) -> wasmtime::Result<Self::World> {
                <$pre>::instantiate(self, store)
            }
        })*
    };
}
pub(crate) use world_pre;

/// The older world of a slot that did not exist in that contract version: nothing binds to it.
pub enum NoLegacy {}

impl WorldPre for NoLegacy {
    type World = NoLegacy;
    fn new(_pre: InstancePre<Sandbox>) -> wasmtime::Result<Self> {
        Err(wasmtime::format_err!(
            "this slot did not exist in that contract version"
        ))
    }
    fn instantiate(&self, _store: &mut Store<Sandbox>) -> wasmtime::Result<Self::World> {
        match *self {}
    }
}

/// Generic code that needs one slot's type, run for a slot known only at run time (a config
/// file's key, a case table's `slot:`).
pub trait SlotVisitor {
    type Output;
    fn visit<S: PolicySlot>(self) -> Self::Output;
}

/// Where [`super::Policies`] keeps a slot's live policy.
pub trait SlotCell {
    fn cell(cells: &SlotCells) -> &arc_swap::ArcSwap<super::LoadedPolicy<Self>>
    where
        Self: PolicySlot;
}

/// The list of slots: the [`Slot`] enum, [`with_slot`], and the live-policy cells all come from
/// it, so no other list of slots exists.
macro_rules! declare_slots {
    ($($variant:ident($field:ident) => $ty:ty),* $(,)?) => {
        /// One decision the daemon delegates to a policy component.
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
            serde::Serialize, serde::Deserialize, clap::ValueEnum,
        )]
        #[serde(rename_all = "kebab-case")]
        pub enum Slot {
            $($variant),*
        }

        impl Slot {
            pub const ALL: [Slot; [$(Slot::$variant),*].len()] = [$(Slot::$variant),*];

            /// The slot's name, which is also its WIT interface name.
            pub fn name(self) -> &'static str {
                match self {
                    $(Slot::$variant => <$ty as PolicySlot>::NAME),*
                }
            }

            /// What the host does when this slot's policy fails.
            pub fn fail_safe_rule(self) -> &'static str {
                match self {
                    $(Slot::$variant => <$ty as PolicySlot>::FAIL_SAFE_RULE),*
                }
            }

            /// The embedded default component.
            pub fn default_component(self) -> &'static [u8] {
                match self {
                    $(Slot::$variant => <$ty as PolicySlot>::default_component()),*
                }
            }
        }

        /// Runs `visitor` with the type of `slot`.
        pub fn with_slot<V: SlotVisitor>(slot: Slot, visitor: V) -> V::Output {
            match slot {
                $(Slot::$variant => visitor.visit::<$ty>()),*
            }
        }

        /// Every slot's live policy, swapped atomically on reload.
        pub struct SlotCells {
            $($field: arc_swap::ArcSwap<super::LoadedPolicy<$ty>>),*
        }

        impl SlotCells {
            pub(crate) fn builtin(
                engine: &super::PolicyEngine,
                cache: Option<&super::CompileCache>,
            ) -> Result<Self, super::LoadError> {
                Ok(SlotCells {
                    $($field: arc_swap::ArcSwap::from_pointee(super::LoadedPolicy::<$ty>::builtin(engine, cache)?)),*
                })
            }
        }

        $(impl SlotCell for $ty {
            fn cell(cells: &SlotCells) -> &arc_swap::ArcSwap<super::LoadedPolicy<Self>> {
                &cells.$field
            }
        })*
    };
}

declare_slots! {
    SnapshotBeforeDestroy(snapshot_before_destroy) => SnapshotBeforeDestroy,
    BringUp(bring_up) => BringUp,
    CpuClassAdmission(cpu_class_admission) => CpuClassAdmission,
    ResourceTranslation(resource_translation) => ResourceTranslation,
    GuestFixup(guest_fixup) => GuestFixup,
}

impl Slot {
    /// The WIT world a component for this slot implements.
    pub fn world(self) -> String {
        format!("{}-policy", self.name())
    }

    /// The fully qualified interface a component of `version` exports.
    pub fn export_name(self, version: ContractVersion) -> String {
        version.interface(self.name())
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
            let json = serde_json::to_value(slot).unwrap();
            assert_eq!(json, slot.name(), "serde and the WIT agree on the name");
        }
        let err = "bringup".parse::<Slot>().unwrap_err();
        assert!(err.contains("bring-up") && err.contains("guest-fixup"), "{err}");
    }

    #[test]
    fn export_names_and_env_vars() {
        assert_eq!(
            Slot::BringUp.export_name(ContractVersion::V0_3_0),
            "cocoonstack:vk-policy/bring-up@0.3.0"
        );
        assert_eq!(
            Slot::GuestFixup.export_name(ContractVersion::V0_1_0),
            "cocoonstack:vk-policy/guest-fixup@0.1.0"
        );
        assert_eq!(Slot::CpuClassAdmission.env_var(), "VK_POLICY_CPU_CLASS_ADMISSION");
        assert_eq!(Slot::GuestFixup.world(), "guest-fixup-policy");
        assert_eq!(Slot::GuestFixup.env_var(), "VK_POLICY_GUEST_FIXUP");
    }

    #[test]
    fn tokens() {
        assert!(is_token("linux-static", b""));
        assert!(!is_token("linux_static", b""));
        assert!(is_token("linux_static", b"_"));
        assert!(!is_token("", b""));
        assert!(!is_token(&"k".repeat(65), b""));
    }
}
