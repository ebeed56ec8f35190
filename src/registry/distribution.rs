//! The distribution API requests of the client — manifests (GET, HEAD, PUT), blobs (HEAD, a streamed
//! and verified GET, a monolithic upload) — each through [`super::auth`], so every request answers
//! the registry's challenge the one way that keeps the node's credentials on the registry's host, and
//! each answer is held to its declared shape: a manifest or an error text is read to a limit within the
//! answer deadline (the stall timeout), and a blob's bytes are counted against its descriptor's size
//! and hashed as they come. (oci-client's own requests answer a challenge at whatever realm it names,
//! credentials included, and read every answer whole; its types are still the ones used here.)
//!
//! Every repository name and reference is checked against the distribution grammar before it goes
//! into a URL ([`super::names`]).

use super::answer::{self, AnswerError};
use super::auth::{HttpError, repository_scope};
use super::client::Registry;
use super::errors::{Cause, RegistryError};
use super::manifest::MAX_MANIFEST_BYTES;
use super::media;
use super::names;
use bytes::Bytes;
use futures::Stream;
use reqwest::StatusCode;
use sha2::Digest;
use std::future::Future;

/// What a request's token must allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Pull,
    Push,
    Delete,
}

impl Access {
    fn actions(self) -> &'static str {
        match self {
            Access::Pull => "pull",
            Access::Push => "pull,push",
            Access::Delete => "delete",
        }
    }
}

/// A repository of this registry, its name checked.
pub(crate) struct Repo {
    /// The full repository path (prefix included).
    pub path: String,
    /// `<scheme>://<host>/v2/<path>`.
    pub url: String,
}

impl Repo {
    pub fn scope(&self, access: Access) -> String {
        repository_scope(&self.path, access.actions())
    }
}

/// A manifest read whole.
pub(crate) struct ManifestBytes {
    pub bytes: Bytes,
    /// `Docker-Content-Digest`, when the registry sent one.
    pub digest_header: Option<String>,
}

impl Registry {
    /// The repository `repo` (under the prefix), refused when the name is outside the grammar.
    pub(crate) fn repo(&self, repo: &str) -> Result<Repo, RegistryError> {
        let path = self.cfg.repository(repo)?;
        Ok(Repo {
            url: format!("{}/v2/{path}", self.cfg.base_url()),
            path,
        })
    }

    /// The reference (tag or digest) `reference`, refused when it is outside the grammar.
    pub(crate) fn checked_reference<'r>(&self, reference: &'r str) -> Result<&'r str, RegistryError> {
        match names::reference_problem(reference) {
            None => Ok(reference),
            Some(reason) => Err(RegistryError::InvalidName {
                what: if reference.contains(':') { "digest" } else { "tag" },
                name: reference.to_string(),
                reason,
            }),
        }
    }

    /// The typed error of a request that got no answer to interpret.
    pub(crate) fn http_error(&self, op: &str, artifact: &str, e: HttpError) -> RegistryError {
        match e {
            HttpError::Transport(d, cause) => self.unavailable_by(op, artifact, d, cause),
            HttpError::Denied(d, cause) => self.denied_by(op, artifact, d, cause),
            HttpError::UntrustedRealm { realm, reason } => RegistryError::UntrustedRealm {
                op: op.to_string(),
                artifact: artifact.to_string(),
                registry: self.cfg.host.clone(),
                realm,
                reason: reason.to_string(),
            },
        }
    }

    /// The typed error of an answer with an unexpected status: refused credentials are `Denied`, the
    /// rest `Unavailable`. The answer's text (its start) goes into the message.
    pub(crate) async fn status_error(
        &self,
        op: &str,
        artifact: &str,
        what: &str,
        resp: reqwest::Response,
    ) -> RegistryError {
        let status = resp.status();
        let text = answer::error_text(resp, self.answer_deadline()).await;
        let detail = format!("{what} answered {status}: {text}");
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            self.denied(op, artifact, detail)
        } else {
            self.unavailable(op, artifact, detail)
        }
    }

    /// How long an exchange whose answer is read whole may take: the transfers' stall limit.
    pub(crate) fn answer_deadline(&self) -> std::time::Duration {
        self.cfg.transfer.stall_timeout
    }

    /// Runs `exchange` within the answer deadline; past it, the registry is `Unavailable`.
    pub(crate) async fn within_deadline<T>(
        &self,
        op: &str,
        artifact: &str,
        exchange: impl Future<Output = Result<T, RegistryError>>,
    ) -> Result<T, RegistryError> {
        let deadline = self.answer_deadline();
        tokio::time::timeout(deadline, exchange).await.unwrap_or_else(|_| {
            Err(self.unavailable(
                op,
                artifact,
                format!(
                    "no complete answer within {} (SNAPSHOT_STALL_TIMEOUT_SECONDS)",
                    answer::secs_text(deadline)
                ),
            ))
        })
    }

    /// `GET` the manifest `repo:reference`, read whole (at most [`MAX_MANIFEST_BYTES`]) within the
    /// answer deadline. `None`: the registry answered 404.
    pub(crate) async fn get_manifest(
        &self,
        repo: &str,
        reference: &str,
    ) -> Result<Option<ManifestBytes>, RegistryError> {
        let artifact = format!("{repo}:{reference}");
        let op = "reading the manifest of";
        let target = self.repo(repo)?;
        let url = format!("{}/manifests/{}", target.url, self.checked_reference(reference)?);
        let accept = media::MANIFEST_ACCEPT.join(", ");
        let exchange = async {
            let resp = self
                .http
                .send(&target.scope(Access::Pull), |c| {
                    c.get(&url).header(reqwest::header::ACCEPT, &accept)
                })
                .await
                .map_err(|e| self.http_error(op, &artifact, e))?;
            match resp.status() {
                StatusCode::NOT_FOUND => return Ok(None),
                s if s.is_success() => {}
                _ => return Err(self.status_error(op, &artifact, "the manifest GET", resp).await),
            }
            let digest_header = resp
                .headers()
                .get("docker-content-digest")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let bytes = answer::read_whole(resp, MAX_MANIFEST_BYTES)
                .await
                .map_err(|e| match e {
                    AnswerError::TooLarge { .. } => RegistryError::InvalidArtifact {
                        artifact: artifact.clone(),
                        detail: format!("the manifest: {e}; a manifest this large is not read"),
                        cause: None,
                    },
                    AnswerError::Transport(ref cause) => {
                        let cause = Some(cause.clone());
                        self.unavailable_by(op, &artifact, e, cause)
                    }
                })?;
            Ok(Some(ManifestBytes { bytes, digest_header }))
        };
        self.within_deadline(op, &artifact, exchange).await
    }

    /// `PUT` the manifest `body` (of `media_type`) under `repo:tag`.
    pub(crate) async fn put_manifest(
        &self,
        repo: &str,
        tag: &str,
        body: Vec<u8>,
        media_type: &str,
    ) -> Result<(), RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let op = "writing the manifest of";
        let target = self.repo(repo)?;
        let url = format!("{}/manifests/{}", target.url, self.checked_reference(tag)?);
        let body = Bytes::from(body);
        let exchange = async {
            let resp = self
                .http
                .send(&target.scope(Access::Push), |c| {
                    c.put(&url)
                        .header(reqwest::header::CONTENT_TYPE, media_type)
                        .body(body.clone())
                })
                .await
                .map_err(|e| self.http_error(op, &artifact, e))?;
            if resp.status().is_success() {
                Ok(())
            } else {
                Err(self.status_error(op, &artifact, "the manifest PUT", resp).await)
            }
        };
        self.within_deadline(op, &artifact, exchange).await
    }

    /// The digest of the manifest `repo:tag` (`HEAD`; the registry's `Docker-Content-Digest`, else the
    /// hash of the manifest read whole). `None`: the registry answered 404.
    pub(crate) async fn manifest_digest(&self, repo: &str, tag: &str) -> Result<Option<String>, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let op = "resolving the digest of";
        let target = self.repo(repo)?;
        let url = format!("{}/manifests/{}", target.url, self.checked_reference(tag)?);
        let accept = media::MANIFEST_ACCEPT.join(", ");
        let exchange = async {
            let resp = self
                .http
                .send(&target.scope(Access::Pull), |c| {
                    c.head(&url).header(reqwest::header::ACCEPT, &accept)
                })
                .await
                .map_err(|e| self.http_error(op, &artifact, e))?;
            match resp.status() {
                StatusCode::NOT_FOUND => Ok(None),
                s if s.is_success() => Ok(resp
                    .headers()
                    .get("docker-content-digest")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)),
                _ => Err(self.status_error(op, &artifact, "the manifest HEAD", resp).await),
            }
        };
        match self.within_deadline(op, &artifact, exchange).await? {
            Some(digest) => Ok(Some(digest)),
            None => Ok(self
                .get_manifest(repo, tag)
                .await?
                .map(|m| super::manifest::sha256_digest(&m.bytes))),
        }
    }

    /// Whether the registry holds the blob `digest` of `repo` (`HEAD`), with a token for `access`.
    pub(crate) async fn blob_exists(
        &self,
        repo: &str,
        tag: &str,
        digest: &str,
        what: &str,
        access: Access,
    ) -> Result<bool, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let op = format!("checking blob {digest} ({what}) of");
        let target = self.repo(repo)?;
        let url = format!("{}/blobs/{}", target.url, self.checked_reference(digest)?);
        let exchange = async {
            let resp = self
                .http
                .send(&target.scope(access), |c| c.head(&url))
                .await
                .map_err(|e| self.http_error(&op, &artifact, e))?;
            match resp.status() {
                StatusCode::NOT_FOUND => Ok(false),
                s if s.is_success() => Ok(true),
                _ => Err(self.status_error(&op, &artifact, "the blob HEAD", resp).await),
            }
        };
        self.within_deadline(&op, &artifact, exchange).await
    }

    /// Uploads `data` as the blob `digest` of `repo` in one request (`POST` a session, `PUT` the bytes
    /// with the digest).
    pub(crate) async fn put_blob(
        &self,
        repo: &str,
        tag: &str,
        digest: &str,
        data: Bytes,
        what: &str,
    ) -> Result<(), RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let op = format!("uploading blob {digest} ({what}, {} bytes) of", data.len());
        let target = self.repo(repo)?;
        let scope = target.scope(Access::Push);
        let start = format!("{}/blobs/uploads/", target.url);
        let resp = self
            .within_deadline(&op, &artifact, async {
                self.http
                    .send(&scope, |c| c.post(&start).header(reqwest::header::CONTENT_LENGTH, 0))
                    .await
                    .map_err(|e| self.http_error(&op, &artifact, e))
            })
            .await?;
        let location = self
            .upload_location(resp, &op, &artifact, "the POST of the upload session")
            .await?;
        let mut url = reqwest::Url::parse(&location).map_err(|e| {
            self.unavailable_by(
                &op,
                &artifact,
                format!("upload location {location:?}: {e}"),
                Some(Cause::new(e)),
            )
        })?;
        url.query_pairs_mut().append_pair("digest", digest);
        let resp = self
            .http
            .send(&scope, |c| {
                c.put(url.clone())
                    .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                    .body(data.clone())
            })
            .await
            .map_err(|e| self.http_error(&op, &artifact, e))?;
        if resp.status() == StatusCode::CREATED {
            Ok(())
        } else {
            Err(self
                .status_error(&op, &artifact, "the PUT of the upload session", resp)
                .await)
        }
    }

    /// The absolute `Location` of an accepted (202) upload step, resolved against the registry's URL.
    /// It must stay on the registry's origin: the next step goes out with the registry's credentials
    /// (or its token), which another host must not get.
    pub(crate) async fn upload_location(
        &self,
        resp: reqwest::Response,
        op: &str,
        artifact: &str,
        step: &str,
    ) -> Result<String, RegistryError> {
        if resp.status() != StatusCode::ACCEPTED {
            return Err(self.status_error(op, artifact, step, resp).await);
        }
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let base = reqwest::Url::parse(&self.cfg.base_url())
            .map_err(|e| self.unavailable_by(op, artifact, format!("{step}: base URL: {e}"), Some(Cause::new(e))))?;
        let url = base.join(&location).map_err(|e| {
            self.unavailable_by(
                op,
                artifact,
                format!("{step}: no usable Location ({location:?}): {e}"),
                Some(Cause::new(e)),
            )
        })?;
        if url.origin() != base.origin() {
            return Err(self.unavailable(
                op,
                artifact,
                format!(
                    "{step} sent the upload to {url}, off the registry's origin {}; the node sends its credentials only to the registry, so the upload was not continued there",
                    base.origin().ascii_serialization()
                ),
            ));
        }
        Ok(url.to_string())
    }

    /// A blob as a stream of chunks, verified: more bytes than `size` fail at once, and at the end the
    /// size and the sha256 must match, else [`RegistryError::Corrupt`]. The answer must start, and each
    /// chunk arrive, within the answer deadline. Transport failures are `Unavailable`.
    pub(crate) async fn blob_stream(
        &self,
        repo: &str,
        tag: &str,
        digest: &str,
        size: u64,
        what: &str,
    ) -> Result<impl Stream<Item = Result<Bytes, RegistryError>> + Send + 'static, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let expected = digest
            .strip_prefix("sha256:")
            .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
            .map(str::to_ascii_lowercase)
            .ok_or_else(|| RegistryError::InvalidArtifact {
                artifact: artifact.clone(),
                detail: format!("{what}: unsupported digest {digest:?} (only sha256 is read)"),
                cause: None,
            })?;
        let target = self.repo(repo)?;
        let url = format!("{}/blobs/{digest}", target.url);
        let op = format!("downloading blob {digest} ({what}) of");
        let resp = self
            .within_deadline(&op, &artifact, async {
                self.http
                    .send(&target.scope(Access::Pull), |c| c.get(&url))
                    .await
                    .map_err(|e| self.http_error(&op, &artifact, e))
            })
            .await?;
        match resp.status() {
            s if s.is_success() => {}
            StatusCode::NOT_FOUND => {
                return Err(RegistryError::NotFound {
                    artifact,
                    registry: self.cfg.host.clone(),
                    detail: format!(": blob {digest} ({what}) is missing"),
                });
            }
            _ => return Err(self.status_error(&op, &artifact, "the blob GET", resp).await),
        }
        let registry = self.cfg.host.clone();
        let digest = digest.to_string();
        let what = what.to_string();
        let idle = self.answer_deadline();
        let mut resp = resp;
        Ok(async_stream::try_stream! {
            let mut seen = 0u64;
            let mut hasher = sha2::Sha256::new();
            let corrupt = |detail: String| RegistryError::Corrupt { artifact: artifact.clone(), digest: digest.clone(), what: what.clone(), detail, cause: None, };
            let unavailable = |detail: String, cause: Option<Cause>| RegistryError::Unavailable { op: op.clone(), artifact: artifact.clone(), registry: registry.clone(), detail, cause };
            loop {
                let chunk = match tokio::time::timeout(idle, resp.chunk()).await {
                    Err(_) => Err(unavailable(format!("no byte for {} (SNAPSHOT_STALL_TIMEOUT_SECONDS)", answer::secs_text(idle)), None))?,
                    Ok(Err(e)) => Err(unavailable(e.to_string(), Some(Cause::new(e))))?,
                    Ok(Ok(None)) => break,
                    Ok(Ok(Some(chunk))) => chunk,
                };
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
            if got != expected {
                Err::<(), _>(corrupt(format!("its bytes hash to sha256:{got}")))?;
            }
        })
    }
}
