//! Answers read whole — manifests, token answers, the text of an error — held to a size and a time.
//! A registry (or the token service it names) decides how long an answer is and how fast it comes: an
//! answer read into memory without a bound is a way to exhaust the node's memory, and one waited for
//! without a deadline holds the operation forever. So a body read whole stops at the first byte past
//! its limit (and before any byte when its `Content-Length` already says more), and the caller runs the
//! whole exchange within a deadline.

use bytes::{Bytes, BytesMut};
use std::time::Duration;

use super::errors::Cause;

/// The most of an error answer kept for the message: enough for a registry's JSON error, short
/// enough for an Event.
pub(crate) const ERROR_TEXT_BYTES: usize = 2048;

/// Why an answer could not be read whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AnswerError {
    /// The answer is longer than the limit (it was not read further).
    #[error("the answer is longer than the {} read", size_text(*limit))]
    TooLarge { limit: usize },
    /// The connection failed while the body came: the HTTP client's error, kept as the source.
    #[error("the answer broke off: {0}")]
    Transport(#[source] Cause),
}

/// `4 MiB`, `1 KiB`, `12 bytes`: a limit as an operator reads it.
pub(crate) fn size_text(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

/// `2 s`: a deadline as an operator reads it.
pub(crate) fn secs_text(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// The body of `resp`, at most `limit` bytes. The caller bounds the time (the body may stall).
pub(crate) async fn read_whole(mut resp: reqwest::Response, limit: usize) -> Result<Bytes, AnswerError> {
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(AnswerError::TooLarge { limit });
    }
    let mut body = BytesMut::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| AnswerError::Transport(Cause::new(e)))? {
        if body.len() + chunk.len() > limit {
            return Err(AnswerError::TooLarge { limit });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// The start of an error answer's text (at most [`ERROR_TEXT_BYTES`], read within `deadline`), for a
/// message; whatever could not be read is left out.
pub(crate) async fn error_text(mut resp: reqwest::Response, deadline: Duration) -> String {
    let mut body = Vec::new();
    let read = async {
        while body.len() < ERROR_TEXT_BYTES {
            match resp.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(deadline, read).await;
    let cut = body.len().min(ERROR_TEXT_BYTES);
    let text = String::from_utf8_lossy(&body[..cut]);
    let text = text.trim();
    if body.len() > ERROR_TEXT_BYTES {
        format!("{text}…")
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_operators_write_them() {
        assert_eq!(size_text(4 << 20), "4 MiB");
        assert_eq!(size_text(2048), "2 KiB");
        assert_eq!(size_text(1000), "1000 bytes");
        assert_eq!(secs_text(Duration::from_secs(2)), "2 s");
        assert_eq!(secs_text(Duration::from_millis(1500)), "1.5 s");
    }
}
