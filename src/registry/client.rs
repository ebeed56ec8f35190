//! [`Registry`]: the OCI client — oci-client for manifests, blobs and auth; [`super::auth`] for the requests
//! oci-client does not make — with manifest reads of a typed outcome, config blobs and verified blob streams.

use super::auth::AuthedHttp;
use super::config::RegistryConfig;
use super::errors::RegistryError;
use super::manifest::{self, OciImageManifest, OciManifest, SnapshotConfig};
use super::media;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};
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
    pub(crate) client: Client,
    pub(crate) http: AuthedHttp,
    pub(crate) auth: RegistryAuth,
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
        let protocol = if cfg.plain_http {
            ClientProtocol::HttpsExcept(vec![cfg.host.clone()])
        } else {
            ClientProtocol::Https
        };
        let client = Client::new(ClientConfig {
            protocol,
            connect_timeout: Some(Duration::from_secs(10)),
            // No read timeout: a long streamed body would trip it while the response is pending; a
            // transfer that stops moving bytes is ended by the transfer's stall timeout instead.
            read_timeout: None,
            // Small blobs (config, small files) go up in one PUT.
            use_monolithic_push: true,
            ..Default::default()
        });
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| RegistryError::InvalidRequest(format!("building the HTTP client for {}: {e}", cfg.host)))?;
        tracing::info!(registry = %cfg.host, prefix = %cfg.prefix, plain_http = cfg.plain_http, auth = auth_kind(&auth), "registry client ready");
        Ok(Registry {
            heavy_pulls: Arc::new(Semaphore::new(cfg.max_heavy_pulls.max(1))),
            http: AuthedHttp::new(http, auth.clone()),
            cfg,
            node_name,
            client,
            auth,
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

    /// The typed error of a failed oci-client call: refused credentials are `Denied`, the rest `Unavailable`.
    pub(crate) fn oci_error(&self, op: &str, artifact: &str, e: OciDistributionError) -> RegistryError {
        if is_denied(&e) {
            RegistryError::Denied {
                op: op.to_string(),
                artifact: artifact.to_string(),
                registry: self.cfg.host.clone(),
                detail: e.to_string(),
            }
        } else {
            self.unavailable(op, artifact, e)
        }
    }

    /// The progress cadence and stall limit of this client's transfers.
    pub(crate) fn watch(&self) -> super::progress::Watch {
        super::progress::Watch {
            interval: self.cfg.transfer.progress_interval,
            stall: self.cfg.transfer.stall_timeout,
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

    pub(crate) fn denied(&self, op: &str, artifact: &str, e: impl std::fmt::Display) -> RegistryError {
        RegistryError::Denied {
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
            .map_err(|e| self.oci_error("authenticating for", artifact, e))
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
            Err(e) => return Err(self.oci_error("reading the manifest of", &artifact, e)),
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
        let m = manifest::parse_manifest(&raw).map_err(|detail| RegistryError::InvalidArtifact {
            artifact: artifact.clone(),
            detail,
        })?;
        let digest = if digest.is_empty() { computed } else { digest };
        Ok(Some(Fetched { digest, manifest: m }))
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
    /// and the sha256 must match, else [`RegistryError::Corrupt`]. The digest is checked by oci-client's
    /// verifying stream (one SHA-256 pass); the size here. Transport failures are `Unavailable`.
    pub(crate) async fn blob_stream(
        &self,
        repo: &str,
        tag: &str,
        digest: &str,
        size: u64,
        what: &str,
    ) -> Result<impl Stream<Item = Result<Bytes, RegistryError>> + Send + 'static, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .ok_or_else(|| RegistryError::InvalidArtifact {
                artifact: artifact.clone(),
                detail: format!("{what}: unsupported digest {digest:?} (only sha256 is read)"),
            })?;
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
            Err(e) => return Err(self.oci_error(&format!("downloading blob {digest} ({what}) of"), &artifact, e)),
        };
        let registry = self.cfg.host.clone();
        let digest = digest.to_string();
        let what = what.to_string();
        let mut inner = sized.stream;
        Ok(async_stream::try_stream! {
            let mut seen = 0u64;
            let corrupt = |detail: String| RegistryError::Corrupt { artifact: artifact.clone(), digest: digest.clone(), what: what.clone(), detail };
            while let Some(chunk) = inner.next().await {
                let chunk = chunk.map_err(|e| {
                    // oci-client's digest check ends the stream with its `DigestError` (a private type:
                    // recognised by its text, "Invalid digest. Expected …, got …").
                    let text = e.to_string();
                    if text.starts_with("Invalid digest") {
                        if seen == size { corrupt(text) } else { corrupt(format!("{seen} bytes instead of the {size} of its descriptor ({text})")) }
                    } else {
                        RegistryError::Unavailable { op: format!("downloading blob {digest} ({what}) of"), artifact: artifact.clone(), registry: registry.clone(), detail: text }
                    }
                })?;
                seen += chunk.len() as u64;
                if seen > size {
                    Err::<(), _>(corrupt(format!("more than the {size} bytes of its descriptor")))?;
                }
                yield chunk;
            }
            if seen != size {
                Err::<(), _>(corrupt(format!("{seen} bytes instead of the {size} of its descriptor")))?;
            }
        })
    }
}

/// Refused credentials or rights: 401 / 403 in any of oci-client's shapes.
pub(crate) fn is_denied(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::UnauthorizedError { .. } | OciDistributionError::AuthenticationFailure(_) => true,
        OciDistributionError::ServerError { code, .. } => *code == 401 || *code == 403,
        OciDistributionError::RegistryError { envelope, .. } => envelope
            .errors
            .iter()
            .any(|x| matches!(x.code, OciErrorCode::Unauthorized | OciErrorCode::Denied)),
        OciDistributionError::RequestError(r) => matches!(r.status().map(|s| s.as_u16()), Some(401 | 403)),
        _ => false,
    }
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
