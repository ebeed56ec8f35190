//! Pure decoders from Kubernetes objects to the contract's typed facts: no I/O, no wasm. The
//! policies receive what they produce; the provider reads the same values, never the raw
//! annotations.

pub mod annotations;
pub mod names;
pub mod pod;
pub mod runtime;
pub mod vm_spec;

pub use crate::policy::contract::types::{PodFacts, VmSpec};
pub use pod::{first_container_resources, pod_facts};
pub use runtime::RuntimeAnnotations;
