//! Pure domain types decoded from Kubernetes objects: no I/O, no wasm. The policy engine turns
//! them into WIT facts; the provider reads them directly.

pub mod annotations;
pub mod pod;
pub mod vm_spec;

pub use pod::{PodFacts, first_container_resources};
pub use vm_spec::VmSpec;
