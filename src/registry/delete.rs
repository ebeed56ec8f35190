//! Deleting a manifest (hibernate compensation), through [`super::auth`]: oci-client has no DELETE, and a
//! token registry wants a token for the `delete` action.

use super::auth::{HttpError, repository_scope};
use super::client::{Registry, is_not_found};
use super::errors::RegistryError;
use std::time::Duration;

enum DeleteOutcome {
    Deleted,
    Absent,
    /// A 4xx other than 401 / 403 / 404: the registry will not delete by this reference.
    Refused(String),
}

impl Registry {
    /// Deletes the manifest `repo:tag`. Tries DELETE by tag; where the registry refuses that (distribution
    /// 2.x: 400 `DIGEST_INVALID`, 405 `UNSUPPORTED`, any 4xx but 404) it resolves the tag's digest and
    /// deletes by digest. 404 at any step counts as done.
    pub async fn delete_manifest(&self, repo: &str, tag: &str) -> Result<(), RegistryError> {
        let artifact = format!("{repo}:{tag}");
        match self.delete_ref(repo, tag, &artifact).await? {
            DeleteOutcome::Deleted => {
                tracing::info!(%artifact, "deleted manifest by tag");
                return Ok(());
            }
            DeleteOutcome::Absent => {
                tracing::info!(%artifact, "manifest already absent");
                return Ok(());
            }
            DeleteOutcome::Refused(why) => {
                tracing::debug!(%artifact, %why, "delete by tag refused; deleting by digest")
            }
        }
        let r = self.reference(repo, tag);
        let digest = match self.client.fetch_manifest_digest(&r, &self.auth).await {
            Ok(d) => d,
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => return Err(self.oci_error("resolving the digest (to delete) of", &artifact, e)),
        };
        match self.delete_ref(repo, &digest, &artifact).await? {
            DeleteOutcome::Deleted => {
                tracing::info!(%artifact, %digest, "deleted manifest by digest");
                Ok(())
            }
            DeleteOutcome::Absent => Ok(()),
            DeleteOutcome::Refused(why) => Err(RegistryError::Unavailable {
                op: "deleting".into(),
                artifact,
                registry: self.cfg.host.clone(),
                detail: format!(
                    "{why} (by digest {digest}); enable deletes on the registry (storage.delete.enabled: true / REGISTRY_STORAGE_DELETE_ENABLED=true)"
                ),
            }),
        }
    }

    async fn delete_ref(&self, repo: &str, reference: &str, artifact: &str) -> Result<DeleteOutcome, RegistryError> {
        let repository = self.cfg.repository(repo);
        let url = format!("{}/v2/{repository}/manifests/{reference}", self.cfg.base_url());
        let scope = repository_scope(&repository, "delete");
        let resp = self
            .http
            .send(&scope, |c| c.delete(&url).timeout(Duration::from_secs(60)))
            .await
            .map_err(|e| match e {
                HttpError::Transport(d) => self.unavailable("deleting", artifact, d),
                HttpError::Denied(d) => self.denied("deleting", artifact, d),
            })?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        let answer = || format!("DELETE {url} answered {status}: {}", body.trim());
        Ok(match status.as_u16() {
            200..=299 => DeleteOutcome::Deleted,
            404 => DeleteOutcome::Absent,
            401 | 403 => return Err(self.denied("deleting", artifact, format!("{} (no delete right)", answer()))),
            400..=499 => DeleteOutcome::Refused(answer()),
            _ => return Err(self.unavailable("deleting", artifact, answer())),
        })
    }
}
