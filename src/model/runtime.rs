//! The runtime annotations of a pod (`vm.cocoonstack.io/id`, `/ip`, `/vnc-port`): written by
//! vk-cocoon for a managed VM, pre-assigned by the operator for an unmanaged one.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::annotations as key;

/// The raw values, "" when absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuntimeAnnotations {
    pub vm_id: String,
    pub ip: String,
    pub vnc_port: String,
}

impl RuntimeAnnotations {
    pub fn decode(annotations: &BTreeMap<String, String>) -> Self {
        let get = |k: &str| annotations.get(k).cloned().unwrap_or_default();
        RuntimeAnnotations {
            vm_id: get(key::VM_ID),
            ip: get(key::IP),
            vnc_port: get(key::VNC_PORT),
        }
    }

    pub fn of_pod(pod: &Pod) -> Self {
        pod.metadata.annotations.as_ref().map(Self::decode).unwrap_or_default()
    }
}
