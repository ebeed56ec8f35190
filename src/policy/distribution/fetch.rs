//! Getting a slot's artifact: from the local store when its digest is there (content-addressed,
//! so no registry is needed), else from the registry — verified, then stored. Tags are refused
//! unless allowed; an allowed tag is resolved once per load and the digest logged.

use std::path::Path;

use tracing::{info, warn};

use crate::registry::{PulledArtifact, Registry, RegistryConfig};

use super::super::error::LoadError;
use super::format::{MAX_LAYER_BYTES, PolicyArtifact};
use super::reference::{Pin, PolicyRef};
use super::store::ArtifactStore;

/// A policy artifact ready to validate.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The reference pinned at the digest that was fetched.
    pub reference: PolicyRef,
    pub artifact: PolicyArtifact,
    /// Served from the local store, without the registry.
    pub from_store: bool,
}

/// Fetches policy artifacts for the reloader and the CLI.
#[derive(Debug, Clone)]
pub struct PolicyFetcher {
    store: ArtifactStore,
    allow_tags: bool,
}

fn failed(reference: &PolicyRef, detail: impl Into<String>) -> LoadError {
    LoadError::Fetch {
        reference: reference.to_string(),
        detail: detail.into(),
    }
}

/// A registry client for the reference's host, with the docker-config credentials the snapshot
/// client uses (the same [`Registry`] type).
pub fn registry_for(reference: &PolicyRef) -> Result<Registry, LoadError> {
    let cfg = RegistryConfig::parse(&reference.registry)
        .map_err(|e| failed(reference, e.to_string()))?
        .ok_or_else(|| failed(reference, "it names no registry"))?;
    Registry::new(cfg, String::new()).map_err(|e| failed(reference, e.to_string()))
}

impl PolicyFetcher {
    pub fn new(store_dir: impl AsRef<Path>, allow_tags: bool) -> Self {
        PolicyFetcher {
            store: ArtifactStore::new(store_dir.as_ref()),
            allow_tags,
        }
    }

    pub fn store(&self) -> &ArtifactStore {
        &self.store
    }

    /// [`Self::fetch`] from synchronous code (the reload thread, startup in a blocking task): on
    /// its own current-thread runtime, on a scoped thread when called inside another runtime.
    pub fn fetch_blocking(&self, reference: &PolicyRef) -> Result<Fetched, LoadError> {
        let run = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| failed(reference, format!("cannot start an I/O runtime: {e}")))?
                .block_on(self.fetch(reference))
        };
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| s.spawn(run).join().expect("the policy fetch thread panicked"))
        } else {
            run()
        }
    }

    /// The artifact `reference` names, verified.
    pub async fn fetch(&self, reference: &PolicyRef) -> Result<Fetched, LoadError> {
        let digest = self.digest_of(reference).await?;
        let pinned = reference.at_digest(&digest);
        if let Some(stored) = self.store.get(&digest) {
            let artifact = PolicyArtifact::from_pulled(&stored).map_err(|d| failed(&pinned, d))?;
            return Ok(Fetched {
                reference: pinned,
                artifact,
                from_store: true,
            });
        }
        let registry = registry_for(reference)?;
        let pulled = match registry
            .pull_artifact(&reference.repository, &digest, MAX_LAYER_BYTES)
            .await
        {
            Ok(Some(pulled)) => pulled,
            Ok(None) => {
                return Err(failed(
                    &pinned,
                    format!("the registry has no manifest {digest} in {}", reference.repository),
                ));
            }
            Err(error) => {
                return Err(failed(
                    &pinned,
                    format!(
                        "{error}; it is not in the local artifact store {} either, so there is no copy to serve",
                        self.store.dir().display()
                    ),
                ));
            }
        };
        let artifact = PolicyArtifact::from_pulled(&pulled).map_err(|d| failed(&pinned, d))?;
        self.keep(&pulled);
        info!(reference = %pinned, slot = %artifact.slot, "policy artifact pulled");
        Ok(Fetched {
            reference: pinned,
            artifact,
            from_store: false,
        })
    }

    /// The digest to serve: the reference's own, or (tags allowed) what the tag names now —
    /// or, with the registry unreachable, what it named last time.
    async fn digest_of(&self, reference: &PolicyRef) -> Result<String, LoadError> {
        let tag = match &reference.pin {
            Pin::Digest(digest) => return Ok(digest.clone()),
            Pin::Tag(tag) => tag,
        };
        if !self.allow_tags {
            return Err(failed(
                reference,
                "policies are pinned by digest: name it as …@sha256:<digest> (`vk-cocoon policy push` prints it), or set VK_POLICY_ALLOW_TAGS=true to resolve tags once at each load",
            ));
        }
        let text = reference.to_string();
        match registry_for(reference)?.resolve_tag(&reference.repository, tag).await {
            Ok(Some(digest)) => {
                info!(reference = %text, %digest, "policy tag resolved; serving that digest until the next reload");
                if let Err(error) = self.store.remember_tag(&text, &digest) {
                    warn!(%error, "cannot remember the tag's digest in the artifact store");
                }
                Ok(digest)
            }
            Ok(None) => Err(failed(reference, "the registry has no such tag")),
            Err(error) => match self.store.last_tag(&text) {
                Some(digest) => {
                    warn!(reference = %text, %digest, %error, "the registry cannot resolve the tag; serving the digest it named last time");
                    Ok(digest)
                }
                None => Err(failed(
                    reference,
                    format!("{error}; the tag was never resolved on this node, so there is no digest to fall back to"),
                )),
            },
        }
    }

    fn keep(&self, pulled: &PulledArtifact) {
        if let Err(error) = self.store.put(pulled) {
            warn!(dir = %self.store.dir().display(), %error, "cannot store the pulled policy artifact; a registry outage at the next start would stop the daemon");
        }
    }
}
