//! The integration suite on the fake apiserver, the cocoon simulators and a real loopback
//! registry, in one test binary: each binary links the whole daemon (wasmtime, kube, the
//! registry client), so one binary per concern module instead of one per file keeps the link
//! step of every build to a single link. Run one concern with `cargo test --test integration
//! provider::` (or a single file, `provider::hibernate::`).
//!
//! The real-apiserver end-to-end suite is its own binary (`tests/real_apiserver`): it starts a
//! kube-apiserver and etcd once per process and is run alone when only it is wanted.
//!
//! The shared harnesses are the `vk-test-support` crate (`tests/support`), because the benches
//! and the real-apiserver suite use them too.

// Named at the root for the concern modules (`crate::provider_support::env`, ...).
use vk_test_support::{kubelet_support, policy_examples, provider_support, registry_support, runtime_support};

mod architecture;
mod coverage;
mod crash;
mod kubelet;
mod policy;
mod provider;
mod registry;
mod runtime;
