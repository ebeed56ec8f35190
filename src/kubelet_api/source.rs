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
    pub hypervisor: crate::hypervisor::Hypervisor,
    /// The VMM's pid (0 while none runs).
    pub pid: i64,
    /// Where port-forward may connect: the guest's address, or why there is none.
    pub address: GuestAddress,
}

/// The guest's address as the node may use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestAddress {
    /// Its first NIC's address, or cocoon-net's lease, inside the guest networks.
    Ip(IpAddr),
    /// None yet (the lease is pending); the text says so.
    Pending(String),
    /// One the node does not connect to (outside the guest networks, another pod's); why.
    Refused(String),
}

pub trait PodSource: Send + Sync {
    /// Every pod the node runs, as last seen.
    fn pods(&self) -> Vec<Pod>;
    /// Pod `namespace/name` with its VM (`None` while it has none: hibernated, creating).
    fn pod(&self, namespace: &str, name: &str) -> Option<(Arc<Pod>, Option<PodVm>)>;
}
