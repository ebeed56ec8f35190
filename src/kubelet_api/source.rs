//! What the kubelet API reads from the provider: a narrow, read-only view of its pod table
//! (implemented by `provider::serving`), so the serving side does not depend on how the
//! provider keeps its state.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

/// The VM of a pod, as far as the kubelet API needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodVm {
    pub id: String,
    /// `cloud-hypervisor` or `firecracker`.
    pub hypervisor: String,
    /// The VMM's pid (0 while none runs).
    pub pid: i64,
    /// The guest's address (its first NIC, or cocoon-net's lease), when known.
    pub ip: Option<IpAddr>,
}

pub trait PodSource: Send + Sync {
    /// Every pod the node runs, as last seen.
    fn pods(&self) -> Vec<Pod>;
    /// Pod `namespace/name` with its VM (`None` while it has none: hibernated, creating).
    fn pod(&self, namespace: &str, name: &str) -> Option<(Arc<Pod>, Option<PodVm>)>;
}
