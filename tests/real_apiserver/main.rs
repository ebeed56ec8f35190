//! End-to-end scenarios against a **real kube-apiserver** (v1.36 + etcd, started by
//! `tests/kube_support` from the project's tools folder), with `vk-cocoon run` as a process and
//! cocoon-sim behind it.
//!
//! Why the real server: these scenarios are about what a cluster does to the daemon — RBAC (every
//! daemon here runs as the ServiceAccount `deploy/rbac.yaml` binds, never as admin, so a verb
//! missing from the RBAC fails a test), admission, validation, the real status and
//! strategic-merge semantics, graceful deletion, Events. What a real server cannot be made to do
//! on demand (outages, 410 Gone, injected conflicts) stays on the in-repo fake
//! (`tests/kubelet_*.rs`, `tests/provider_*.rs`).
//!
//! One control plane serves the whole binary; each test keeps to its own namespace and node
//! name. Without the tools folder every test here is skipped (one line on stderr), except under
//! `CI=true`, where that is a failure.

#[path = "../kube_support/mod.rs"]
mod kube_support;
#[path = "../provider_support/mod.rs"]
mod provider_support;
#[path = "../kube_support/signer.rs"]
mod signer;

mod daemon;
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
