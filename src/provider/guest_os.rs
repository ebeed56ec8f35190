//! The guest's operating system, chosen once from the VM spec: where a macOS guest (run by
//! cocoon-macos, never in `cocoon vm list`) takes a path of its own through CreatePod,
//! UpdatePod, DeletePod and the startup reconcile, and where a Linux (or Windows) guest takes
//! the cocoon path of the operation's own module.
//!
//! A method answers `None` when the operation goes on with its cocoon path, `Some` with the
//! operation's result when the guest's own path ran it to its end.

use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;

use super::CocoonProvider;
use super::macos;
use crate::kubelet::{Next, ProviderError};
use crate::model::{PodFacts, VmSpec};
use crate::policy::contract::types::GuestOs as Os;
use crate::runtime::VmRecord;

/// What differs between guests in the provider's operations.
#[async_trait]
pub(super) trait GuestOs: Send + Sync {
    /// CreatePod of a pod the startup reconcile already tracks with its VM `vm`.
    async fn adopt_tracked(
        &self,
        p: &CocoonProvider,
        pod: &Arc<Pod>,
        key: &str,
        vm: &VmRecord,
    ) -> Option<Result<Next, ProviderError>>;

    /// CreatePod of a pod whose incarnation is claimed.
    async fn create(
        &self,
        p: &CocoonProvider,
        pod: &Arc<Pod>,
        key: &str,
        spec: &VmSpec,
        facts: &PodFacts,
    ) -> Option<Result<Next, ProviderError>>;

    /// UpdatePod of a tracked managed pod.
    async fn update(
        &self,
        p: &CocoonProvider,
        pod: &Arc<Pod>,
        key: &str,
        spec: &VmSpec,
    ) -> Option<Result<Next, ProviderError>>;

    /// DeletePod of a managed pod, its tracked VM `vm`.
    async fn delete(
        &self,
        p: &CocoonProvider,
        pod: &Pod,
        key: &str,
        uid: &str,
        vm: Option<&VmRecord>,
    ) -> Option<Result<(), ProviderError>>;

    /// Whether the guest's VM is one of `cocoon vm list`'s (the startup reconcile matches
    /// those; it asks cocoon-macos about each macOS pod instead).
    fn listed_by_cocoon(&self) -> bool;
}

/// The guest of a pod's VM spec (managed `os=macos` pods only take the macOS path: an
/// unmanaged one is adopted as any).
pub(super) fn for_spec(spec: &VmSpec) -> &'static dyn GuestOs {
    if spec.managed && spec.os == Os::Macos {
        &Macos
    } else {
        &Cocoon
    }
}

/// A guest cocoon runs (Linux, Windows): every operation's own cocoon path.
struct Cocoon;

#[async_trait]
impl GuestOs for Cocoon {
    async fn adopt_tracked(
        &self,
        _: &CocoonProvider,
        _: &Arc<Pod>,
        _: &str,
        _: &VmRecord,
    ) -> Option<Result<Next, ProviderError>> {
        None
    }

    async fn create(
        &self,
        _: &CocoonProvider,
        _: &Arc<Pod>,
        _: &str,
        _: &VmSpec,
        _: &PodFacts,
    ) -> Option<Result<Next, ProviderError>> {
        None
    }

    async fn update(
        &self,
        _: &CocoonProvider,
        _: &Arc<Pod>,
        _: &str,
        _: &VmSpec,
    ) -> Option<Result<Next, ProviderError>> {
        None
    }

    async fn delete(
        &self,
        _: &CocoonProvider,
        _: &Pod,
        _: &str,
        _: &str,
        _: Option<&VmRecord>,
    ) -> Option<Result<(), ProviderError>> {
        None
    }

    fn listed_by_cocoon(&self) -> bool {
        true
    }
}

/// A macOS guest run by cocoon-macos (`macos/`).
struct Macos;

#[async_trait]
impl GuestOs for Macos {
    async fn adopt_tracked(
        &self,
        p: &CocoonProvider,
        pod: &Arc<Pod>,
        key: &str,
        vm: &VmRecord,
    ) -> Option<Result<Next, ProviderError>> {
        Some(macos::adopt_tracked(p, pod, key, vm.clone()).await)
    }

    async fn create(
        &self,
        p: &CocoonProvider,
        pod: &Arc<Pod>,
        key: &str,
        spec: &VmSpec,
        facts: &PodFacts,
    ) -> Option<Result<Next, ProviderError>> {
        Some(macos::create(p, pod, key, spec, facts.clone()).await)
    }

    async fn update(
        &self,
        p: &CocoonProvider,
        pod: &Arc<Pod>,
        key: &str,
        spec: &VmSpec,
    ) -> Option<Result<Next, ProviderError>> {
        Some(macos::update(p, pod, key, spec).await)
    }

    async fn delete(
        &self,
        p: &CocoonProvider,
        pod: &Pod,
        key: &str,
        uid: &str,
        vm: Option<&VmRecord>,
    ) -> Option<Result<(), ProviderError>> {
        Some(macos::delete(p, pod, key, uid, vm.cloned()).await)
    }

    fn listed_by_cocoon(&self) -> bool {
        false
    }
}
