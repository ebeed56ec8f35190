//! The shared support of vk-cocoon's test binaries and benches, one crate instead of source
//! files each binary compiled again (a dev-dependency of the root package; the fake apiserver's
//! semantics tests use `kube_support` without the `daemon` feature).
//!
//! * [`kube_support`]: a real Kubernetes control plane from the project's tools folder, the
//!   cocoon-operator beside it, and the kubelet-serving CSR approver and signer.
//! * [`bench`](mod@bench): what every benchmark binary reads the same way (its `BENCH_*` knobs, the
//!   simulator it runs, the process's memory, medians).
//! * With the `daemon` feature, the harnesses that drive vk-cocoon:
//!   [`runtime_support`] (the cocoon simulator behind the daemon's CLI client),
//!   [`registry_support`] (a real OCI registry, a token server, a hostile registry),
//!   [`kubelet_support`] (a recording provider under the real virtual node),
//!   [`provider_support`] (the real `CocoonProvider` against the fake apiserver and the
//!   simulator), [`daemon`] (one node machine running `vk-cocoon run` as a process against the
//!   real control plane) and [`kubelet_node`] (such a node with a pod, its kubelet API served
//!   with a cluster-signed certificate).
//!
//! The modules are public for whichever binary needs them: what one binary leaves unused is not
//! dead, and a helper lives here once.

use std::path::{Path, PathBuf};

pub mod bench;
pub mod kube_support;
pub mod policy_examples;

#[cfg(feature = "daemon")]
pub mod daemon;
#[cfg(feature = "daemon")]
pub mod kubelet_node;
#[cfg(feature = "daemon")]
pub mod kubelet_support;
#[cfg(feature = "daemon")]
pub mod provider_support;
#[cfg(feature = "daemon")]
pub mod registry_support;
#[cfg(feature = "daemon")]
pub mod runtime_support;

/// The repository root: the first ancestor of this crate holding `deploy/rbac.yaml`.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|dir| dir.join("deploy/rbac.yaml").is_file())
        .expect("the test support crate lives inside the vk-cocoon repository (deploy/rbac.yaml)")
        .to_path_buf()
}
