//! Deleting a manifest (hibernate compensation), through [`super::auth`]: a token registry wants a token
//! for the `delete` action.

use super::answer;
use super::client::Registry;
use super::distribution::Access;
use super::errors::RegistryError;

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
        let Some(digest) = self.manifest_digest(repo, tag).await? else {
            return Ok(());
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
                cause: None,
            }),
        }
    }

    async fn delete_ref(&self, repo: &str, reference: &str, artifact: &str) -> Result<DeleteOutcome, RegistryError> {
        let target = self.repo(repo)?;
        let url = format!("{}/manifests/{}", target.url, self.checked_reference(reference)?);
        let exchange = async {
            let resp = self
                .http
                .send(&target.scope(Access::Delete), |c| c.delete(&url))
                .await
                .map_err(|e| self.http_error("deleting", artifact, e))?;
            let status = resp.status();
            let text = answer::error_text(resp, self.answer_deadline()).await;
            Ok((status, text))
        };
        let (status, text) = self.within_deadline("deleting", artifact, exchange).await?;
        let answer = || format!("DELETE {url} answered {status}: {text}");
        Ok(match status.as_u16() {
            200..=299 => DeleteOutcome::Deleted,
            404 => DeleteOutcome::Absent,
            401 | 403 => return Err(self.denied("deleting", artifact, format!("{} (no delete right)", answer()))),
            400..=499 => DeleteOutcome::Refused(answer()),
            _ => return Err(self.unavailable("deleting", artifact, answer())),
        })
    }
}
