//! Peer authentication: a token shared by the nodes (`VK_PEER_TOKEN_FILE`), sent as
//! `Authorization: Bearer <token>` and compared in constant time. The Go daemon served any
//! guest's memory to whoever reached the port; this one answers 401 to a caller without the token.

use std::path::Path;

use subtle::ConstantTimeEq;

/// Shorter tokens are refused at start: they can be guessed.
pub const MIN_TOKEN_LEN: usize = 16;

/// The shared peer token.
#[derive(Clone)]
pub struct PeerToken(String);

impl std::fmt::Debug for PeerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerToken(<redacted>)")
    }
}

impl PeerToken {
    /// The token in `text` (surrounding whitespace, e.g. a trailing newline, is not part of it).
    pub fn new(text: &str) -> Result<Self, String> {
        let t = text.trim();
        if t.len() < MIN_TOKEN_LEN {
            return Err(format!(
                "the peer token has {} characters; use at least {MIN_TOKEN_LEN} (e.g. `head -c 32 /dev/urandom | base64`)",
                t.len()
            ));
        }
        if t.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("the peer token contains whitespace or control characters".into());
        }
        Ok(Self(t.to_string()))
    }

    /// The token in `path`, a file only the daemon's user may read: the token reads every
    /// hibernated guest of the fleet, so a file the node's other users can read is refused.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).map_err(|e| format!("VK_PEER_TOKEN_FILE {}: {e}", path.display()))?;
        let mode = meta.mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "VK_PEER_TOKEN_FILE {} has mode {mode:o}: its group or others may read the fleet's peer token; `chmod 600 {}` (a Kubernetes Secret volume: defaultMode 0600)",
                path.display(),
                path.display()
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("VK_PEER_TOKEN_FILE {}: {e}", path.display()))?;
        Self::new(&text).map_err(|e| format!("VK_PEER_TOKEN_FILE {}: {e}", path.display()))
    }

    /// The `Authorization` header value a client sends.
    pub fn header(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Whether an `Authorization` header value carries this token.
    pub fn admits(&self, header: Option<&str>) -> bool {
        let Some(presented) = header.and_then(|h| h.strip_prefix("Bearer ")) else {
            return false;
        };
        presented.as_bytes().ct_eq(self.0.as_bytes()).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_bearer_token_is_admitted() {
        let t = PeerToken::new("0123456789abcdef-peer\n").unwrap();
        assert!(t.admits(Some("Bearer 0123456789abcdef-peer")));
        assert!(t.admits(Some(&t.header())));
        for bad in [
            None,
            Some(""),
            Some("Bearer "),
            Some("0123456789abcdef-peer"),
            Some("Basic 0123456789abcdef-peer"),
            Some("Bearer 0123456789abcdef-pee"),
            Some("Bearer 0123456789abcdef-peerX"),
        ] {
            assert!(!t.admits(bad), "{bad:?}");
        }
        assert!(!format!("{t:?}").contains("0123"));
    }

    #[test]
    fn weak_tokens_are_refused_at_start() {
        assert!(PeerToken::new("short").unwrap_err().contains("at least 16"));
        assert!(PeerToken::new("   \n").is_err());
        assert!(PeerToken::new("0123456789 abcdef").unwrap_err().contains("whitespace"));
        let dir = tempfile::tempdir().unwrap();
        let err = PeerToken::from_file(&dir.path().join("missing")).unwrap_err();
        assert!(err.contains("VK_PEER_TOKEN_FILE"), "{err}");
    }

    #[test]
    fn a_token_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peer-token");
        std::fs::write(&path, "0123456789abcdef-peer\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let error = PeerToken::from_file(&path).expect_err("a world-readable token file is refused");
        assert!(error.contains("chmod 600"), "{error}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(PeerToken::from_file(&path).is_ok());
    }
}
