//! Blob uploads of a push. A blob whose digest is known before its first byte (a small file, a v2 chunk)
//! is checked with `HEAD` and sent with one PUT through oci-client. A big file is streamed as it is read
//! from the export — spooling it to learn its digest first would write and re-read every byte, and the
//! digest is only needed at the end: one upload session (`POST`), one `PATCH` whose body is the stream,
//! then `PUT ?digest=` with the digest the reader computed along the way (distribution spec, "streamed
//! upload"). oci-client has no streamed session with a digest known late (its chunked mode sends one
//! request per 4 MiB), so the session goes through [`super::auth`].

use super::auth::{HttpError, repository_scope};
use super::client::Registry;
use super::errors::RegistryError;
use bytes::Bytes;
use futures::Stream;
use reqwest::StatusCode;

impl Registry {
    /// `HEAD`, then one PUT unless the registry has the blob. Returns the bytes sent.
    pub(crate) async fn upload_known(
        &self,
        repo: &str,
        tag: &str,
        what: &str,
        data: Bytes,
        digest: &str,
    ) -> Result<u64, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let r = self.reference(repo, tag);
        if self
            .client
            .blob_exists(&r, digest)
            .await
            .map_err(|e| self.oci_error(&format!("checking blob {digest} ({what}) of"), &artifact, e))?
        {
            tracing::debug!(%artifact, what, %digest, "blob already present");
            return Ok(0);
        }
        let n = data.len() as u64;
        if data.is_empty() {
            // oci-client refuses to push an empty blob; a session with an empty PUT is what the spec says.
            self.upload_session(repo, &artifact, what, None, futures::stream::empty(), async {
                Some(digest.to_string())
            })
            .await?;
            return Ok(0);
        }
        self.client
            .push_blob(&r, data, digest)
            .await
            .map_err(|e| self.oci_error(&format!("uploading blob {digest} ({what}, {n} bytes) of"), &artifact, e))?;
        Ok(n)
    }

    /// One upload session: `POST`, a `PATCH` streaming `body` (`length` bytes when known), then
    /// `PUT ?digest=` with the digest `digest` yields once the body is through. Returns the digest.
    pub(crate) async fn upload_session<S>(
        &self,
        repo: &str,
        artifact: &str,
        what: &str,
        length: Option<u64>,
        body: S,
        digest: impl std::future::Future<Output = Option<String>>,
    ) -> Result<String, RegistryError>
    where
        S: Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
    {
        let repository = self.cfg.repository(repo);
        let scope = repository_scope(&repository, "pull,push");
        let op = format!("uploading {what} of");
        let http_err = |e: HttpError| match e {
            HttpError::Transport(d) => self.unavailable(&op, artifact, d),
            HttpError::Denied(d) => self.denied(&op, artifact, d),
        };
        let status_err = |step: &str, status: StatusCode, body: String| {
            let detail = format!("{step} answered {status}: {}", body.trim());
            if matches!(status.as_u16(), 401 | 403) {
                self.denied(&op, artifact, detail)
            } else {
                self.unavailable(&op, artifact, detail)
            }
        };
        let base = self.cfg.base_url();
        let start = format!("{base}/v2/{repository}/blobs/uploads/");
        let resp = self
            .http
            .send(&scope, |c| c.post(&start).header(reqwest::header::CONTENT_LENGTH, 0))
            .await
            .map_err(http_err)?;
        let location = self.location(resp, "POST of the upload session", &status_err).await?;

        let mut patch = self
            .http
            .authorize(&scope, self.http.client().patch(&location))
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(reqwest::Body::wrap_stream(body));
        if let Some(n) = length {
            patch = patch.header(reqwest::header::CONTENT_LENGTH, n);
        }
        let resp = patch
            .send()
            .await
            .map_err(|e| self.unavailable(&op, artifact, stream_error(&e)))?;
        let location = self.location(resp, "PATCH of the upload session", &status_err).await?;

        // The reader computed the digest while the body went by; without one the body failed.
        let Some(digest) = digest.await else {
            return Err(self.unavailable(&op, artifact, "the body ended before its digest was known"));
        };
        let mut url = reqwest::Url::parse(&location)
            .map_err(|e| self.unavailable(&op, artifact, format!("upload location {location:?}: {e}")))?;
        url.query_pairs_mut().append_pair("digest", &digest);
        let resp = self
            .http
            .send(&scope, |c| {
                c.put(url.clone()).header(reqwest::header::CONTENT_LENGTH, 0)
            })
            .await
            .map_err(http_err)?;
        let status = resp.status();
        if status != StatusCode::CREATED {
            let body = resp.text().await.unwrap_or_default();
            return Err(status_err("PUT of the upload session", status, body));
        }
        Ok(digest)
    }

    /// The absolute `Location` of an accepted (202) upload step.
    async fn location(
        &self,
        resp: reqwest::Response,
        step: &str,
        status_err: &impl Fn(&str, StatusCode, String) -> RegistryError,
    ) -> Result<String, RegistryError> {
        let status = resp.status();
        if status != StatusCode::ACCEPTED {
            let body = resp.text().await.unwrap_or_default();
            return Err(status_err(step, status, body));
        }
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let base = reqwest::Url::parse(&self.cfg.base_url())
            .map_err(|e| status_err(step, status, format!("base URL: {e}")))?;
        base.join(&location)
            .map(|u| u.to_string())
            .map_err(|e| status_err(step, status, format!("no usable Location ({location:?}): {e}")))
    }
}

/// The innermost cause of a failed streamed request: a body error is the reader's (the export failed), not
/// the network's, and says so.
fn stream_error(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}
