//! Blob uploads of a push. A blob whose digest is known before its first byte (a small file, a v2 chunk)
//! is checked with `HEAD` and sent with one PUT (`super::distribution`). A big file is streamed as it is read
//! from the export — spooling it to learn its digest first would write and re-read every byte, and the
//! digest is only needed at the end: one upload session (`POST`), one `PATCH` whose body is the stream,
//! then `PUT ?digest=` with the digest the reader computed along the way (distribution spec, "streamed
//! upload").

use super::client::Registry;
use super::distribution::Access;
use super::errors::{Cause, RegistryError};
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
        if self.blob_exists(repo, tag, digest, what, Access::Push).await? {
            tracing::debug!(%artifact, what, %digest, "blob already present");
            return Ok(0);
        }
        let n = data.len() as u64;
        self.put_blob(repo, tag, digest, data, what).await?;
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
        let target = self.repo(repo)?;
        let scope = target.scope(Access::Push);
        let op = format!("uploading {what} of");
        let start = format!("{}/blobs/uploads/", target.url);
        let resp = self
            .within_deadline(&op, artifact, async {
                self.http
                    .send(&scope, |c| c.post(&start).header(reqwest::header::CONTENT_LENGTH, 0))
                    .await
                    .map_err(|e| self.http_error(&op, artifact, e))
            })
            .await?;
        let location = self
            .upload_location(resp, &op, artifact, "the POST of the upload session")
            .await?;

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
            .map_err(|e| self.unavailable_by(&op, artifact, stream_error(&e), Some(Cause::new(e))))?;
        let location = self
            .upload_location(resp, &op, artifact, "the PATCH of the upload session")
            .await?;

        // The reader computed the digest while the body went by; without one the body failed.
        let Some(digest) = digest.await else {
            return Err(self.unavailable(&op, artifact, "the body ended before its digest was known"));
        };
        let mut url = reqwest::Url::parse(&location).map_err(|e| {
            self.unavailable_by(
                &op,
                artifact,
                format!("upload location {location:?}: {e}"),
                Some(Cause::new(e)),
            )
        })?;
        url.query_pairs_mut().append_pair("digest", &digest);
        let resp = self
            .within_deadline(&op, artifact, async {
                self.http
                    .send(&scope, |c| {
                        c.put(url.clone()).header(reqwest::header::CONTENT_LENGTH, 0)
                    })
                    .await
                    .map_err(|e| self.http_error(&op, artifact, e))
            })
            .await?;
        if resp.status() != StatusCode::CREATED {
            return Err(self
                .status_error(&op, artifact, "the PUT of the upload session", resp)
                .await);
        }
        Ok(digest)
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
