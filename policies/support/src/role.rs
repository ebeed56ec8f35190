//! A pod's agent role, from its CocoonSet owner and its VM name (cocoon-common's `RoleForPod`; both
//! naming generations, `src/provider/DECISIONS.md` row 9): the role never comes from a VM-name
//! suffix alone, so a toolbox whose name ends in `-0` is not mistaken for a main agent.

use alloc::format;
use alloc::string::String;

use crate::naming::hex_prefix;

/// The role of a pod within its CocoonSet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Slot 0 of its CocoonSet.
    Main,
    /// Slot > 0 of its CocoonSet.
    SubAgent,
    /// Anything else: a toolbox, or a pod without a CocoonSet owner.
    Toolbox,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Main => "main",
            Role::SubAgent => "sub-agent",
            Role::Toolbox => "toolbox",
        }
    }
}

/// `InferRole(ExtractAgentSlot(namespace, owner, vm_name))`, where `cocoonset_owner` is the name
/// of the pod's first `CocoonSet` owner reference ("" when it has none).
pub fn role_for_pod(namespace: &str, cocoonset_owner: &str, vm_name: &str) -> Role {
    match agent_slot(namespace, cocoonset_owner, vm_name) {
        Some(0) => Role::Main,
        Some(_) => Role::SubAgent,
        None => Role::Toolbox,
    }
}

/// The agent slot encoded in `vm_name`, accepting both naming generations: the current
/// `vk-<ns>-<pod>-<hash6>` (verified by regenerating the exact name) and the Aug-2026
/// `vk-<ns>-<cs>-<slot>`. `None` means "not an agent of this CocoonSet".
pub fn agent_slot(namespace: &str, cocoonset_owner: &str, vm_name: &str) -> Option<u64> {
    if cocoonset_owner.is_empty() {
        return None;
    }
    let hashed_prefix = format!("vk-{}-{}-", namespace, cocoonset_owner.replace('.', "-"));
    if let Some(rest) = vm_name.strip_prefix(&hashed_prefix) {
        let segment = rest.split('-').next().unwrap_or("");
        if let Some(slot) = parse_slot(segment)
            && vm_name_for_deployment(namespace, cocoonset_owner, slot) == vm_name
        {
            return Some(slot);
        }
    }
    let legacy_prefix = format!("vk-{namespace}-{cocoonset_owner}-");
    vm_name.strip_prefix(&legacy_prefix).and_then(parse_slot)
}

/// cocoon-common `VMNameForPod`: `vk-<ns>-<pod with dots as dashes>-<sha256(ns/pod)[:6]>`.
pub fn vm_name_for_pod(namespace: &str, pod: &str) -> String {
    let hash = hex_prefix(&format!("{namespace}/{pod}"), 6);
    format!("vk-{}-{}-{}", namespace, pod.replace('.', "-"), hash)
}

/// cocoon-common `VMNameForDeployment`: the VM name of slot `slot` of CocoonSet `cocoonset`.
pub fn vm_name_for_deployment(namespace: &str, cocoonset: &str, slot: u64) -> String {
    vm_name_for_pod(namespace, &format!("{cocoonset}-{slot}"))
}

/// A non-negative decimal slot number: ASCII digits only, no sign, no dashes.
fn parse_slot(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn current_naming_yields_the_slot_only_for_the_exact_generated_name() {
        let main = vm_name_for_deployment("ns", "demo", 0);
        let sub = vm_name_for_deployment("ns", "demo", 3);
        assert!(main.starts_with("vk-ns-demo-0-") && main.len() == "vk-ns-demo-0-".len() + 6);
        assert_eq!(role_for_pod("ns", "demo", &main), Role::Main);
        assert_eq!(role_for_pod("ns", "demo", &sub), Role::SubAgent);
        // Right shape, wrong hash: not an agent of this set.
        assert_eq!(role_for_pod("ns", "demo", "vk-ns-demo-0-000000"), Role::Toolbox);
        // Another namespace or owner regenerates a different name.
        assert_eq!(role_for_pod("other", "demo", &main), Role::Toolbox);
        assert_eq!(role_for_pod("ns", "demo2", &main), Role::Toolbox);
    }

    #[test]
    fn dotted_cocoonset_names_are_dashed_in_the_prefix() {
        let name = vm_name_for_deployment("ns", "my.set", 0);
        assert!(name.starts_with("vk-ns-my-set-0-"));
        assert_eq!(role_for_pod("ns", "my.set", &name), Role::Main);
    }

    #[test]
    fn aug_2026_naming_is_accepted() {
        assert_eq!(role_for_pod("ns", "demo", "vk-ns-demo-0"), Role::Main);
        assert_eq!(role_for_pod("ns", "demo", "vk-ns-demo-12"), Role::SubAgent);
        assert_eq!(role_for_pod("ns", "demo", "vk-ns-demo-+1"), Role::Toolbox);
        assert_eq!(role_for_pod("ns", "demo", "vk-ns-demo-0-x"), Role::Toolbox);
        assert_eq!(role_for_pod("ns", "demo", "vk-ns-demo-"), Role::Toolbox);
    }

    #[test]
    fn a_pod_without_a_cocoonset_owner_is_a_toolbox_even_with_a_trailing_zero() {
        assert_eq!(role_for_pod("ns", "", "vk-ns--0"), Role::Toolbox);
        assert_eq!(role_for_pod("ns", "", "toolbox-0"), Role::Toolbox);
    }
}
