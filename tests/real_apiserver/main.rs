//! End-to-end scenarios against a **real kube-apiserver** (v1.36 + etcd, started by
//! `vk_test_support::kube_support` from the project's tools folder), with `vk-cocoon run` as a
//! process and cocoon-sim behind it.
//!
//! Why the real server: these scenarios are about what a cluster does to the daemon — RBAC (every
//! daemon here runs as the ServiceAccount `deploy/rbac.yaml` binds, never as admin, so a verb
//! missing from the RBAC fails a test), admission, validation, the real status and
//! strategic-merge semantics, graceful deletion, Events. What a real server cannot be made to do
//! on demand (outages, 410 Gone, injected conflicts) stays on the in-repo fake
//! (`tests/integration/kubelet`, `tests/integration/provider`).
//!
//! One control plane serves the whole binary; each test keeps to its own namespace and node
//! name. Without the tools folder every test here is skipped (one line on stderr), except under
//! `CI=true`, where that is a failure.

// The harnesses (tests/support): the control plane, the node machine running the daemon, the
// kubelet API node, the simulator and the registry.
use vk_test_support::{
    daemon, kube_support, kubelet_node, policy_examples, provider_support, registry_support, runtime_support,
};

mod hibernate;
mod hostile_client;
mod kubelet_api;
mod lifecycle;
mod macos;
mod node;
mod operator;
mod peer;
mod policy;
mod preflight;
mod python_client;
mod restart;
mod shutdown;
mod streaming;
mod streaming_direct;
mod tenancy;
