//! vk-cocoon: a virtual-kubelet provider that runs pods as cocoon microVMs.
//!
//! The crate is split by concern:
//! - [`policy`]: the WebAssembly policy engine (every *decision* runs as a sandboxed component).
//! - [`runtime`]: the typed async client for the `cocoon` CLI.
//! - [`kubelet`]: the virtual node towards the Kubernetes API (node, lease, pod watch, status).
//! - [`peer`]: the peer snapshot tier (serving a hibernated guest's files to the node that wakes it).
//! - [`host`]: the host kernel's facts and the few calls `std` lacks; the one module allowed `unsafe`.
//! - [`listener`]: the accept loop of every listener, with its connection cap and deadlines.
//! - [`retry`]: the one retry schedule every wait between two attempts uses.

pub mod host;
pub mod hypervisor;
pub mod kubelet;
pub mod kubelet_api;
pub mod listener;
pub mod model;
pub mod peer;
pub mod policy;
pub mod provider;
pub mod registry;
pub mod retry;
pub mod runtime;
pub mod settings;
pub mod stats;
