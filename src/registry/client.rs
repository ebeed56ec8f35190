//! [`Registry`]: the OCI client — the distribution requests of `super::distribution`, authorized by
//! `super::auth`, on oci-client's manifest types — with manifest reads of a typed outcome, config
//! blobs and verified blob streams.

use super::auth::{AuthedHttp, RealmPolicy};
use super::config::RegistryConfig;
use super::errors::{Cause, RegistryError};
use super::manifest::{self, OciImageManifest, OciManifest, SnapshotConfig};
use futures::StreamExt;
use oci_client::secrets::RegistryAuth;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// What a manifest read found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestLookup {
    /// The registry answered 404: the tag is authoritatively absent.
    Absent,
    Found(ArtifactInfo),
}

/// The facts of a manifest the provider needs (wake source resolution, evidence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactInfo {
    /// `sha256:…` of the manifest bytes.
    pub digest: String,
    pub artifact_type: Option<String>,
    pub annotations: BTreeMap<String, String>,
}

/// A fetched manifest or index.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    pub digest: String,
    pub manifest: OciManifest,
}

/// A manifest, reached directly or through an index.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub digest: String,
    pub manifest: OciImageManifest,
    pub from_index: bool,
}

/// A handle on the registry; cheap to share (`Arc<Registry>`).
pub struct Registry {
    pub(crate) cfg: RegistryConfig,
    pub(crate) node_name: String,
    pub(crate) http: AuthedHttp,
    /// At most `max_heavy_pulls` pulls of v2 / index artifacts at once.
    pub(crate) heavy_pulls: Arc<Semaphore>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("cfg", &self.cfg)
            .field("node_name", &self.node_name)
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// Builds the client; credentials come from the docker config (`DOCKER_CONFIG` or `~/.docker/config.json`,
    /// credential helpers included), else anonymous. Token challenges are answered with them.
    pub fn new(cfg: RegistryConfig, node_name: String) -> Result<Registry, RegistryError> {
        let auth = docker_auth(&cfg.host);
        Self::with_auth(cfg, node_name, auth)
    }

    /// Builds the client with explicit credentials.
    pub fn with_auth(cfg: RegistryConfig, node_name: String, auth: RegistryAuth) -> Result<Registry, RegistryError> {
        // No client-wide read timeout: a long streamed upload would trip it while its answer is
        // pending. Answers read whole run within the answer deadline, blob downloads chunk by chunk
        // within it, and a transfer that stops moving bytes is ended by its stall timeout.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| RegistryError::InvalidRequest(format!("building the HTTP client for {}: {e}", cfg.host)))?;
        let realms = RealmPolicy {
            registry_host: cfg.host_name(),
            plain_http: cfg.plain_http,
            trusted: cfg.token_realms.clone(),
        };
        tracing::info!(registry = %cfg.host, prefix = %cfg.prefix, plain_http = cfg.plain_http, auth = auth_kind(&auth), token_realms = ?cfg.token_realms, "registry client ready");
        Ok(Registry {
            heavy_pulls: Arc::new(Semaphore::new(cfg.max_heavy_pulls.max(1))),
            http: AuthedHttp::new(http, auth, realms, cfg.transfer.stall_timeout),
            cfg,
            node_name,
        })
    }

    pub fn config(&self) -> &RegistryConfig {
        &self.cfg
    }

    /// The progress cadence and stall limit of this client's transfers.
    pub(crate) fn watch(&self) -> super::progress::Watch {
        super::progress::Watch {
            interval: self.cfg.transfer.progress_interval,
            stall: self.cfg.transfer.stall_timeout,
        }
    }

    pub(crate) fn unavailable(&self, op: &str, artifact: &str, e: impl std::fmt::Display) -> RegistryError {
        self.unavailable_by(op, artifact, e, None)
    }

    /// [`RegistryError::Unavailable`] saying `detail`, with the error it comes from.
    pub(crate) fn unavailable_by(
        &self,
        op: &str,
        artifact: &str,
        detail: impl std::fmt::Display,
        cause: Option<Cause>,
    ) -> RegistryError {
        RegistryError::Unavailable {
            op: op.to_string(),
            artifact: artifact.to_string(),
            registry: self.cfg.host.clone(),
            detail: detail.to_string(),
            cause,
        }
    }

    pub(crate) fn denied(&self, op: &str, artifact: &str, e: impl std::fmt::Display) -> RegistryError {
        self.denied_by(op, artifact, e, None)
    }

    /// [`RegistryError::Denied`] saying `detail`, with the error it comes from.
    pub(crate) fn denied_by(
        &self,
        op: &str,
        artifact: &str,
        detail: impl std::fmt::Display,
        cause: Option<Cause>,
    ) -> RegistryError {
        RegistryError::Denied {
            op: op.to_string(),
            artifact: artifact.to_string(),
            registry: self.cfg.host.clone(),
            detail: detail.to_string(),
            cause,
        }
    }

    /// Reads the manifest of `repo:tag`. A 404 is `Absent`; anything else that is not a manifest is an error.
    pub async fn manifest(&self, repo: &str, tag: &str) -> Result<ManifestLookup, RegistryError> {
        Ok(match self.fetch_manifest(repo, tag).await? {
            None => ManifestLookup::Absent,
            Some(f) => ManifestLookup::Found(ArtifactInfo {
                digest: f.digest,
                artifact_type: manifest::artifact_type(&f.manifest).map(str::to_string),
                annotations: manifest::annotations(&f.manifest),
            }),
        })
    }

    /// GET the manifest (tag or digest); `None` on 404. Its digest is the hash of its bytes, which
    /// must match the reference when that is a digest, and the registry's `Docker-Content-Digest`
    /// when it sent a sha256 one.
    pub(crate) async fn fetch_manifest(&self, repo: &str, reference: &str) -> Result<Option<Fetched>, RegistryError> {
        let artifact = format!("{repo}:{reference}");
        let Some(got) = self.get_manifest(repo, reference).await? else {
            tracing::debug!(%artifact, "manifest absent");
            return Ok(None);
        };
        let computed = manifest::sha256_digest(&got.bytes);
        let claimed = if reference.contains(':') {
            Some(reference.to_string())
        } else {
            got.digest_header.filter(|d| d.starts_with("sha256:"))
        };
        if let Some(claimed) = claimed.filter(|d| *d != computed) {
            return Err(RegistryError::Corrupt {
                artifact,
                digest: claimed,
                what: "manifest".into(),
                detail: format!("its bytes hash to {computed}"),
                cause: None,
            });
        }
        let m = manifest::parse_manifest(&got.bytes).map_err(|e| RegistryError::InvalidArtifact {
            artifact: artifact.clone(),
            detail: e.to_string(),
            cause: Some(Cause::new(e)),
        })?;
        Ok(Some(Fetched {
            digest: computed,
            manifest: m,
        }))
    }

    /// Resolves an index to its `linux/amd64` child; a manifest is returned as is. `None`: tag absent.
    pub(crate) async fn fetch_resolved(&self, repo: &str, tag: &str) -> Result<Option<Resolved>, RegistryError> {
        let Some(top) = self.fetch_manifest(repo, tag).await? else {
            return Ok(None);
        };
        let index = match top.manifest {
            OciManifest::Image(m) => {
                return Ok(Some(Resolved {
                    digest: top.digest,
                    manifest: m,
                    from_index: false,
                }));
            }
            OciManifest::ImageIndex(i) => i,
        };
        let child = manifest::resolve_index(&index).ok_or_else(|| RegistryError::InvalidArtifact {
            artifact: format!("{repo}:{tag}"),
            detail: "the image index has no linux/amd64 (or other known-architecture) manifest".into(),
            cause: None,
        })?;
        let digest = child.digest.clone();
        tracing::debug!(repo, tag, child = %digest, "resolved image index");
        match self.fetch_manifest(repo, &digest).await? {
            Some(Fetched {
                manifest: OciManifest::ImageIndex(_),
                ..
            }) => Err(RegistryError::InvalidArtifact {
                artifact: format!("{repo}:{tag}"),
                detail: "nested image indexes are not supported".into(),
                cause: None,
            }),
            Some(Fetched {
                digest,
                manifest: OciManifest::Image(m),
            }) => Ok(Some(Resolved {
                digest,
                manifest: m,
                from_index: true,
            })),
            None => Err(RegistryError::NotFound {
                artifact: format!("{repo}@{digest}"),
                registry: self.cfg.host.clone(),
                detail: format!(" (child of the index {repo}:{tag})"),
            }),
        }
    }

    /// The config blob of the snapshot at `repo:tag` (`None` = tag absent).
    pub async fn snapshot_config(&self, repo: &str, tag: &str) -> Result<Option<SnapshotConfig>, RegistryError> {
        let Some(r) = self.fetch_resolved(repo, tag).await? else {
            return Ok(None);
        };
        Ok(Some(self.fetch_snapshot_config(repo, tag, &r.manifest).await?))
    }

    pub(crate) async fn fetch_snapshot_config(
        &self,
        repo: &str,
        tag: &str,
        m: &OciImageManifest,
    ) -> Result<SnapshotConfig, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let kind = manifest::image_kind(m);
        if !kind.is_snapshot() {
            return Err(RegistryError::WrongKind {
                artifact,
                kind: kind.name().into(),
                expected: "snapshot".into(),
            });
        }
        let desc = &m.config;
        if desc.size < 0 || desc.size as u64 > manifest::MAX_CONFIG_BYTES {
            return Err(RegistryError::InvalidArtifact {
                artifact,
                detail: format!(
                    "the config blob is {} bytes (at most {} are read)",
                    desc.size,
                    manifest::MAX_CONFIG_BYTES
                ),
                cause: None,
            });
        }
        let bytes = self
            .fetch_small_blob(repo, tag, &desc.digest, desc.size as u64, "config")
            .await?;
        serde_json::from_slice(&bytes).map_err(|e| RegistryError::InvalidArtifact {
            artifact,
            detail: format!("the config blob is not a snapshot config: {e}"),
            cause: Some(Cause::new(e)),
        })
    }

    /// Reads a whole (small) blob, verifying size and digest.
    pub(crate) async fn fetch_small_blob(
        &self,
        repo: &str,
        tag: &str,
        digest: &str,
        size: u64,
        what: &str,
    ) -> Result<Vec<u8>, RegistryError> {
        let mut out = Vec::with_capacity(size as usize);
        let mut s = std::pin::pin!(self.blob_stream(repo, tag, digest, size, what).await?);
        while let Some(chunk) = s.next().await {
            out.extend_from_slice(&chunk?);
        }
        Ok(out)
    }
}

/// Credentials for `host` from the docker config (entries keyed `host`, `https://host` or `http://host`).
fn docker_auth(host: &str) -> RegistryAuth {
    auth_from(host, |key| docker_credential::get_credential(key).ok())
}

fn auth_from(host: &str, lookup: impl Fn(&str) -> Option<docker_credential::DockerCredential>) -> RegistryAuth {
    for key in [host.to_string(), format!("https://{host}"), format!("http://{host}")] {
        match lookup(&key) {
            Some(docker_credential::DockerCredential::UsernamePassword(u, p)) => return RegistryAuth::Basic(u, p),
            Some(docker_credential::DockerCredential::IdentityToken(t)) => return RegistryAuth::Bearer(t),
            None => continue,
        }
    }
    RegistryAuth::Anonymous
}

fn auth_kind(a: &RegistryAuth) -> &'static str {
    match a {
        RegistryAuth::Anonymous => "anonymous",
        RegistryAuth::Basic(..) => "basic",
        RegistryAuth::Bearer(_) => "bearer",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_config(json: &str, host: &str) -> RegistryAuth {
        auth_from(host, |key| {
            docker_credential::get_credential_from_reader(json.as_bytes(), key).ok()
        })
    }

    #[test]
    fn credentials_come_from_the_docker_config() {
        // "user:pass" base64-encoded, under the https:// form of the key.
        let cfg = r#"{"auths":{"https://reg.example.com":{"auth":"dXNlcjpwYXNz"},"127.0.0.1:5000":{"auth":"YTpi"}}}"#;
        assert!(matches!(from_config(cfg, "reg.example.com"), RegistryAuth::Basic(u, p) if u == "user" && p == "pass"));
        assert!(matches!(from_config(cfg, "127.0.0.1:5000"), RegistryAuth::Basic(u, p) if u == "a" && p == "b"));
        assert!(matches!(from_config(cfg, "other.example.com"), RegistryAuth::Anonymous));
        assert!(matches!(from_config("{}", "reg.example.com"), RegistryAuth::Anonymous));
    }
}
