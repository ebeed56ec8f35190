//! Snapshot saves, pushes and pulls, each counted in its `{result}` metric and timed in its
//! duration histogram — one place for every path that moves guest state (fork, delete,
//! hibernate, clone source, wake).

use std::time::Instant;

use super::CocoonProvider;
use super::metrics::ProviderMetrics;
use super::ports::{RegistryFailure, SnapshotRegistry};

impl CocoonProvider {
    /// `cocoon snapshot save --name <name> <vm_id>`.
    pub(super) async fn save_snapshot(&self, name: &str, vm_id: &str) -> crate::runtime::Result<()> {
        let started = Instant::now();
        let saved = self.ports.runtime.snapshot_save(name, vm_id).await;
        ProviderMetrics::count(&self.metrics.snapshot_save, saved.is_ok());
        self.metrics
            .snapshot_save_duration
            .observe(started.elapsed().as_secs_f64());
        saved
    }

    /// Streams the local snapshot `local` into `repo:tag`, recording `base_image`.
    pub(super) async fn push_snapshot(
        &self,
        registry: &dyn SnapshotRegistry,
        local: &str,
        repo: &str,
        tag: &str,
        base_image: &str,
    ) -> Result<(), RegistryFailure> {
        let started = Instant::now();
        let pushed = registry
            .push_snapshot(self.ports.runtime.as_ref(), local, repo, tag, base_image)
            .await;
        ProviderMetrics::count(&self.metrics.snapshot_push, pushed.is_ok());
        self.metrics
            .snapshot_push_duration
            .observe(started.elapsed().as_secs_f64());
        pushed
    }

    /// Imports `repo:tag` into the local store as `local`.
    pub(super) async fn pull_snapshot(
        &self,
        registry: &dyn SnapshotRegistry,
        repo: &str,
        tag: &str,
        local: &str,
    ) -> Result<(), RegistryFailure> {
        let started = Instant::now();
        let pulled = registry
            .pull_snapshot(self.ports.runtime.as_ref(), repo, tag, local)
            .await;
        ProviderMetrics::count(&self.metrics.snapshot_pull, pulled.is_ok());
        self.metrics
            .snapshot_pull_duration
            .observe(started.elapsed().as_secs_f64());
        pulled
    }
}
