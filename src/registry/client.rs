//! [`Registry`]: the OCI client (oci-client for manifests, blobs and auth; reqwest only for DELETE, which
//! oci-client does not offer), manifest reads with a typed outcome, config blobs, verified blob streams and
//! delete with the delete-by-digest fallback.

use super::config::RegistryConfig;
use super::errors::RegistryError;
use super::manifest::{self, RawManifest, SnapshotConfig};
use super::media;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
use sha2::Digest as _;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
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

/// A fetched manifest.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    pub raw: Bytes,
    pub digest: String,
    pub manifest: RawManifest,
}

/// A handle on the registry; cheap to share (`Arc<Registry>`).
pub struct Registry {
    pub(crate) cfg: RegistryConfig,
    pub(crate) node_name: String,
    pub(crate) client: Client,
    pub(crate) http: reqwest::Client,
    pub(crate) auth: RegistryAuth,
    /// At most `max_heavy_pulls` pulls of v2 / index artifacts at once.
    pub(crate) heavy_pulls: Arc<Semaphore>,
    /// Pulls in flight, by key: followers wait for the leader's outcome.
    pub(crate) flights:
        Mutex<HashMap<String, tokio::sync::watch::Receiver<Option<Result<super::PullReport, RegistryError>>>>>,
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
    /// credential helpers included), else anonymous. Bearer-token challenges are answered by oci-client.
    pub fn new(cfg: RegistryConfig, node_name: String) -> Result<Registry, RegistryError> {
        let protocol = if cfg.plain_http {
            ClientProtocol::HttpsExcept(vec![cfg.host.clone()])
        } else {
            ClientProtocol::Https
        };
        let client = Client::new(ClientConfig {
            protocol,
            connect_timeout: Some(Duration::from_secs(10)),
            // No read timeout: a long streamed PUT would trip it while the response is pending; stalled
            // transfers end with cocoon's transfer timeout instead.
            read_timeout: None,
            // One streamed PUT per blob (size known from the spool file): ~3x faster than 4 MiB PATCHes on
            // distribution, and still bounded memory.
            use_monolithic_push: true,
            ..Default::default()
        });
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| RegistryError::InvalidRequest(format!("building the HTTP client for {}: {e}", cfg.host)))?;
        // Pushes spool one tar entry at a time into this directory: make it now, so a path that
        // does not exist yet is created (or refused) at startup rather than failing every push.
        std::fs::create_dir_all(&cfg.spool_dir).map_err(|e| {
            RegistryError::InvalidRequest(format!(
                "creating the push spool directory {} (VK_REGISTRY_SPOOL_DIR): {e}",
                cfg.spool_dir.display()
            ))
        })?;
        let auth = docker_auth(&cfg.host);
        tracing::info!(registry = %cfg.host, prefix = %cfg.prefix, plain_http = cfg.plain_http, auth = auth_kind(&auth), "registry client ready");
        Ok(Registry {
            heavy_pulls: Arc::new(Semaphore::new(cfg.max_heavy_pulls.max(1))),
            cfg,
            node_name,
            client,
            http,
            auth,
            flights: Mutex::new(HashMap::new()),
        })
    }

    pub fn config(&self) -> &RegistryConfig {
        &self.cfg
    }

    /// The reference of `repo` at `tag_or_digest` (a `:` marks a digest).
    pub(crate) fn reference(&self, repo: &str, tag_or_digest: &str) -> Reference {
        if tag_or_digest.contains(':') {
            Reference::with_digest(
                self.cfg.host.clone(),
                self.cfg.repository(repo),
                tag_or_digest.to_string(),
            )
        } else {
            Reference::with_tag(
                self.cfg.host.clone(),
                self.cfg.repository(repo),
                tag_or_digest.to_string(),
            )
        }
    }

    pub(crate) fn unavailable(&self, op: &str, artifact: &str, e: impl std::fmt::Display) -> RegistryError {
        RegistryError::Unavailable {
            op: op.to_string(),
            artifact: artifact.to_string(),
            registry: self.cfg.host.clone(),
            detail: e.to_string(),
        }
    }

    pub(crate) async fn authenticate(
        &self,
        r: &Reference,
        op: RegistryOperation,
        artifact: &str,
    ) -> Result<(), RegistryError> {
        self.client
            .auth(r, &self.auth, op)
            .await
            .map(|_| ())
            .map_err(|e| self.unavailable("authenticating for", artifact, e))
    }

    /// Reads the manifest of `repo:tag`. A 404 is `Absent`; anything else that is not a manifest is an error.
    pub async fn manifest(&self, repo: &str, tag: &str) -> Result<ManifestLookup, RegistryError> {
        Ok(match self.fetch_manifest(repo, tag).await? {
            None => ManifestLookup::Absent,
            Some(f) => ManifestLookup::Found(ArtifactInfo {
                digest: f.digest,
                artifact_type: f.manifest.artifact_type.clone(),
                annotations: f.manifest.annotations.clone(),
            }),
        })
    }

    /// GET the manifest (tag or digest); `None` on 404. The bytes are checked against the digest when the
    /// reference is a digest.
    pub(crate) async fn fetch_manifest(&self, repo: &str, reference: &str) -> Result<Option<Fetched>, RegistryError> {
        let artifact = format!("{repo}:{reference}");
        let r = self.reference(repo, reference);
        let (raw, digest) = match self
            .client
            .pull_manifest_raw(&r, &self.auth, media::MANIFEST_ACCEPT)
            .await
        {
            Ok(x) => x,
            Err(e) if is_not_found(&e) => {
                tracing::debug!(%artifact, "manifest absent");
                return Ok(None);
            }
            Err(e) => return Err(self.unavailable("reading the manifest of", &artifact, e)),
        };
        let computed = manifest::sha256_digest(&raw);
        if reference.contains(':') && computed != reference {
            return Err(RegistryError::Corrupt {
                artifact,
                digest: reference.to_string(),
                what: "manifest".into(),
                detail: format!("its bytes hash to {computed}"),
            });
        }
        let m = RawManifest::parse(&raw).map_err(|detail| RegistryError::InvalidArtifact {
            artifact: artifact.clone(),
            detail,
        })?;
        let digest = if digest.is_empty() { computed } else { digest };
        Ok(Some(Fetched {
            raw,
            digest,
            manifest: m,
        }))
    }

    /// Resolves an index to its `linux/amd64` child; a manifest is returned as is. `None`: tag absent.
    pub(crate) async fn fetch_resolved(&self, repo: &str, tag: &str) -> Result<Option<(Fetched, bool)>, RegistryError> {
        let Some(top) = self.fetch_manifest(repo, tag).await? else {
            return Ok(None);
        };
        if !top.manifest.is_index() {
            return Ok(Some((top, false)));
        }
        let child = manifest::resolve_index(&top.manifest).ok_or_else(|| RegistryError::InvalidArtifact {
            artifact: format!("{repo}:{tag}"),
            detail: "the image index has no linux/amd64 (or other known-architecture) manifest".into(),
        })?;
        let digest = child.digest.clone();
        tracing::debug!(repo, tag, child = %digest, "resolved image index");
        match self.fetch_manifest(repo, &digest).await? {
            Some(c) if c.manifest.is_index() => Err(RegistryError::InvalidArtifact {
                artifact: format!("{repo}:{tag}"),
                detail: "nested image indexes are not supported".into(),
            }),
            Some(c) => Ok(Some((c, true))),
            None => Err(RegistryError::NotFound {
                artifact: format!("{repo}@{digest}"),
                registry: self.cfg.host.clone(),
                detail: format!(" (child of the index {repo}:{tag})"),
            }),
        }
    }

    /// The config blob of the snapshot at `repo:tag` (`None` = tag absent).
    pub async fn snapshot_config(&self, repo: &str, tag: &str) -> Result<Option<SnapshotConfig>, RegistryError> {
        let Some((f, _)) = self.fetch_resolved(repo, tag).await? else {
            return Ok(None);
        };
        Ok(Some(self.fetch_snapshot_config(repo, tag, &f.manifest).await?))
    }

    pub(crate) async fn fetch_snapshot_config(
        &self,
        repo: &str,
        tag: &str,
        m: &RawManifest,
    ) -> Result<SnapshotConfig, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let kind = m.kind();
        if !kind.is_snapshot() {
            return Err(RegistryError::WrongKind {
                artifact,
                kind: kind.name().into(),
                expected: "snapshot".into(),
            });
        }
        let desc = m.config.as_ref().ok_or_else(|| RegistryError::InvalidArtifact {
            artifact: artifact.clone(),
            detail: "the manifest has no config".into(),
        })?;
        if desc.size < 0 || desc.size as u64 > manifest::MAX_CONFIG_BYTES {
            return Err(RegistryError::InvalidArtifact {
                artifact,
                detail: format!(
                    "the config blob is {} bytes (at most {} are read)",
                    desc.size,
                    manifest::MAX_CONFIG_BYTES
                ),
            });
        }
        let bytes = self
            .fetch_small_blob(repo, tag, &desc.digest, desc.size as u64, "config")
            .await?;
        serde_json::from_slice(&bytes).map_err(|e| RegistryError::InvalidArtifact {
            artifact,
            detail: format!("the config blob is not a snapshot config: {e}"),
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

    /// A blob as a stream of chunks, verified: more bytes than `size` fail at once, and at the end the size
    /// and the sha256 must match, else [`RegistryError::Corrupt`]. Transport failures are `Unavailable`.
    pub(crate) async fn blob_stream(
        &self,
        repo: &str,
        tag: &str,
        digest: &str,
        size: u64,
        what: &str,
    ) -> Result<impl Stream<Item = Result<Bytes, RegistryError>> + Send + 'static, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let expected_hex = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| RegistryError::InvalidArtifact {
                artifact: artifact.clone(),
                detail: format!("{what}: unsupported digest {digest:?} (only sha256 is read)"),
            })?
            .to_ascii_lowercase();
        let r = self.reference(repo, tag);
        let desc = OciDescriptor {
            digest: digest.to_string(),
            size: size as i64,
            ..Default::default()
        };
        let sized = match self.client.pull_blob_stream(&r, &desc).await {
            Ok(s) => s,
            Err(e) if is_not_found(&e) => {
                return Err(RegistryError::NotFound {
                    artifact,
                    registry: self.cfg.host.clone(),
                    detail: format!(": blob {digest} ({what}) is missing"),
                });
            }
            Err(e) => return Err(self.unavailable(&format!("downloading blob {digest} ({what}) of"), &artifact, e)),
        };
        let registry = self.cfg.host.clone();
        let digest = digest.to_string();
        let what = what.to_string();
        let mut inner = sized.stream;
        Ok(async_stream::try_stream! {
            let mut hasher = sha2::Sha256::new();
            let mut seen = 0u64;
            let corrupt = |detail: String| RegistryError::Corrupt { artifact: artifact.clone(), digest: digest.clone(), what: what.clone(), detail };
            while let Some(chunk) = inner.next().await {
                let chunk = chunk.map_err(|e| {
                    // oci-client's own digest check surfaces as an I/O error.
                    let text = e.to_string();
                    if text.contains("Invalid digest") {
                        corrupt(text)
                    } else {
                        RegistryError::Unavailable { op: format!("downloading blob {digest} ({what}) of"), artifact: artifact.clone(), registry: registry.clone(), detail: text }
                    }
                })?;
                seen += chunk.len() as u64;
                if seen > size {
                    Err::<(), _>(corrupt(format!("more than the {size} bytes of its descriptor")))?;
                }
                hasher.update(&chunk);
                yield chunk;
            }
            if seen != size {
                Err::<(), _>(corrupt(format!("{seen} bytes instead of the {size} of its descriptor")))?;
            }
            let got = hex::encode(hasher.finalize());
            if got != expected_hex {
                Err::<(), _>(corrupt(format!("its bytes hash to sha256:{got}")))?;
            }
        })
    }

    /// Deletes the manifest `repo:tag` (hibernate compensation). Tries DELETE by tag; where the registry
    /// refuses that (distribution 2.x: 400 `DIGEST_INVALID`, 405 `UNSUPPORTED`, any 4xx but 404) it resolves
    /// the tag's digest and deletes by digest. 404 at any step counts as done.
    pub async fn delete_manifest(&self, repo: &str, tag: &str) -> Result<(), RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let r = self.reference(repo, tag);
        self.authenticate(&r, RegistryOperation::Push, &artifact).await?;
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
        let digest = match self.client.fetch_manifest_digest(&r, &self.auth).await {
            Ok(d) => d,
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => return Err(self.unavailable("resolving the digest (to delete) of", &artifact, e)),
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
        let url = format!(
            "{}/v2/{}/manifests/{}",
            self.cfg.base_url(),
            self.cfg.repository(repo),
            reference
        );
        let mut req = self.http.delete(&url);
        match &self.auth {
            RegistryAuth::Basic(u, p) => req = req.basic_auth(u, Some(p)),
            RegistryAuth::Bearer(t) => req = req.bearer_auth(t),
            RegistryAuth::Anonymous => {}
        }
        let resp = req
            .send()
            .await
            .map_err(|e| self.unavailable("deleting", artifact, e))?;
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        Ok(match status.as_u16() {
            200..=299 => DeleteOutcome::Deleted,
            404 => DeleteOutcome::Absent,
            401 | 403 => {
                return Err(self.unavailable(
                    "deleting",
                    artifact,
                    format!(
                        "DELETE {url} answered {status} (credentials lack delete rights): {}",
                        body.trim()
                    ),
                ));
            }
            400..=499 => DeleteOutcome::Refused(format!("DELETE {url} answered {status}: {}", body.trim())),
            _ => {
                return Err(self.unavailable(
                    "deleting",
                    artifact,
                    format!("DELETE {url} answered {status}: {}", body.trim()),
                ));
            }
        })
    }
}

enum DeleteOutcome {
    Deleted,
    Absent,
    Refused(String),
}

/// A 404-like answer: `ManifestUnknown`, `NameUnknown`, `BlobUnknown`, `NotFound`, or a plain 404.
pub(crate) fn is_not_found(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::ImageManifestNotFoundError(_) => true,
        OciDistributionError::ServerError { code, .. } => *code == 404,
        OciDistributionError::RegistryError { envelope, .. } => {
            !envelope.errors.is_empty()
                && envelope.errors.iter().all(|x| {
                    matches!(
                        x.code,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::BlobUnknown
                            | OciErrorCode::NotFound
                    )
                })
        }
        OciDistributionError::RequestError(r) => r.status().map(|s| s.as_u16()) == Some(404),
        _ => false,
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

    #[test]
    fn not_found_answers_are_recognised() {
        use oci_client::errors::{OciEnvelope, OciError};
        let env = |code| OciDistributionError::RegistryError {
            envelope: OciEnvelope {
                errors: vec![OciError {
                    code,
                    message: String::new(),
                    detail: serde_json::Value::Null,
                }],
            },
            url: String::new(),
        };
        assert!(is_not_found(&env(OciErrorCode::ManifestUnknown)));
        assert!(is_not_found(&env(OciErrorCode::NameUnknown)));
        assert!(is_not_found(&env(OciErrorCode::BlobUnknown)));
        assert!(!is_not_found(&env(OciErrorCode::Denied)));
        assert!(!is_not_found(&env(OciErrorCode::Unauthorized)));
        assert!(is_not_found(&OciDistributionError::ServerError {
            code: 404,
            url: String::new(),
            message: String::new()
        }));
        assert!(!is_not_found(&OciDistributionError::ServerError {
            code: 503,
            url: String::new(),
            message: String::new()
        }));
        assert!(!is_not_found(&OciDistributionError::UnauthorizedError {
            url: String::new()
        }));
    }
}
