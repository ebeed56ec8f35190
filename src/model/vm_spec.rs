//! The VM spec carried in a pod's annotations (cocoon-common `ParseVMSpec`, behaviour spec §1.3).

use std::collections::BTreeMap;

use serde::Serialize;

use super::annotations as key;

/// The decoded spec. Strings are raw (no trimming); booleans are true only for exactly `"true"`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct VmSpec {
    pub vm_name: String,
    pub image: String,
    pub mode: String,
    pub os: String,
    pub storage: String,
    pub network: String,
    pub snapshot_policy: String,
    pub fork_from: String,
    pub clone_from_dir: String,
    pub managed: bool,
    pub force_pull: bool,
    pub no_direct_io: bool,
    pub conn_type: String,
    pub backend: String,
    pub probe_port: String,
    pub restore_from_hibernate: bool,
}

/// A pod whose annotations cannot describe a VM.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VmSpecError {
    #[error("pod has no {} annotation: the operator must name the VM", key::VM_NAME)]
    MissingVmName,
}

impl VmSpec {
    /// Decodes the spec; a missing or empty VM name is an error (CreatePod cannot proceed).
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Result<Self, VmSpecError> {
        let spec = Self::decode(annotations);
        if spec.vm_name.is_empty() {
            return Err(VmSpecError::MissingVmName);
        }
        Ok(spec)
    }

    /// Decodes whatever is there, leaving absent keys empty.
    pub fn decode(annotations: &BTreeMap<String, String>) -> Self {
        let text = |k: &str| annotations.get(k).cloned().unwrap_or_default();
        let flag = |k: &str| annotations.get(k).is_some_and(|v| v == "true");
        VmSpec {
            vm_name: text(key::VM_NAME),
            image: text(key::IMAGE),
            mode: text(key::MODE),
            os: text(key::OS),
            storage: text(key::STORAGE),
            network: text(key::NETWORK),
            snapshot_policy: text(key::SNAPSHOT_POLICY),
            fork_from: text(key::FORK_FROM),
            clone_from_dir: text(key::CLONE_FROM_DIR),
            managed: flag(key::MANAGED),
            force_pull: flag(key::FORCE_PULL),
            no_direct_io: flag(key::NO_DIRECT_IO),
            conn_type: text(key::CONN_TYPE),
            backend: text(key::BACKEND),
            probe_port: text(key::PROBE_PORT),
            restore_from_hibernate: flag(key::RESTORE_FROM_HIBERNATE),
        }
    }
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
            let spec = VmSpec::decode(&annotations(&[(key::MANAGED, value)]));
            assert_eq!(spec.managed, want, "{value:?}");
        }
    }

    #[test]
    fn strings_are_taken_raw() {
        let spec = VmSpec::decode(&annotations(&[
            (key::VM_NAME, " vm "),
            (key::MODE, "RUN"),
            (key::CLONE_FROM_DIR, "  "),
        ]));
        assert_eq!(
            (spec.vm_name.as_str(), spec.mode.as_str(), spec.clone_from_dir.as_str()),
            (" vm ", "RUN", "  ")
        );
    }

    #[test]
    fn a_missing_vm_name_is_a_named_error() {
        let err = VmSpec::from_annotations(&annotations(&[(key::IMAGE, "x")])).unwrap_err();
        assert!(err.to_string().contains("vm.cocoonstack.io/name"));
    }
}
