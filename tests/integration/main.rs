//! The integration suite on the fake apiserver, the cocoon simulators and a real loopback
//! registry, in one test binary: each binary links the whole daemon (wasmtime, kube, the
//! registry client), so one binary per concern module instead of one per file keeps the link
//! step of every build to a single link. Run one concern with `cargo test --test integration
//! provider::` (or a single file, `provider::hibernate::`).
//!
//! The real-apiserver end-to-end suite is its own binary (`tests/real_apiserver`): it starts a
//! kube-apiserver and etcd once per process and is run alone when only it is wanted.
//!
//! The shared harnesses live beside this directory (`tests/*_support`) because the benches and
//! the real-apiserver suite use them too.

#[path = "../provider_support/mod.rs"]
mod provider_support;

// The support modules nest (the provider's harness builds on the kubelet's and the registry's,
// the registry's on the runtime's): one copy of each, named at the root for the concern modules.
use provider_support::{kubelet_support, registry_support};
use registry_support::runtime_support;

mod architecture;
mod coverage;
mod crash;
mod kubelet;
mod policy;
mod provider;
mod registry;
mod runtime;
