//! `oci://HOST[:PORT]/REPOSITORY@sha256:HEX` (or `:TAG` where tags are allowed): where a slot's
//! component lives in a registry.

use std::fmt;

/// A policy artifact in a registry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PolicyRef {
    /// `host[:port]`.
    pub registry: String,
    /// The repository path inside the registry.
    pub repository: String,
    pub pin: Pin,
}

/// How the reference names the artifact.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pin {
    /// `sha256:<64 hex>`: content-addressed, never changes.
    Digest(String),
    /// A tag: movable, resolved to a digest once per (re)load, and only when allowed.
    Tag(String),
}

pub const SCHEME: &str = "oci://";

impl PolicyRef {
    /// Parses `oci://host[:port]/repo[/more]@sha256:<hex>` or `…/repo:tag`.
    pub fn parse(text: &str) -> Result<PolicyRef, String> {
        let bad = |why: &str| {
            format!("{text:?} is not a policy reference ({SCHEME}HOST[:PORT]/REPOSITORY@sha256:DIGEST): {why}")
        };
        let rest = text
            .trim()
            .strip_prefix(SCHEME)
            .ok_or_else(|| bad("it must start with oci://"))?;
        let (name, pin) = match rest.split_once('@') {
            Some((name, digest)) => {
                let hex = digest
                    .strip_prefix("sha256:")
                    .ok_or_else(|| bad("only sha256 digests are understood"))?;
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
                    return Err(bad("the digest must be sha256: and 64 lower-case hex digits"));
                }
                (name, Pin::Digest(digest.to_string()))
            }
            None => {
                let slash = rest.rfind('/').ok_or_else(|| bad("it names no repository"))?;
                match rest[slash..].rfind(':') {
                    Some(colon) => {
                        let at = slash + colon;
                        (&rest[..at], Pin::Tag(rest[at + 1..].to_string()))
                    }
                    None => return Err(bad("it names neither a digest nor a tag")),
                }
            }
        };
        let (registry, repository) = name.split_once('/').ok_or_else(|| bad("it names no repository"))?;
        if registry.is_empty() || registry.contains(char::is_whitespace) {
            return Err(bad("the registry host is empty or has spaces"));
        }
        let repo_ok = !repository.is_empty()
            && repository.split('/').all(|part| {
                !part.is_empty()
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
            });
        if !repo_ok {
            return Err(bad("the repository must be a lower-case path (a-z 0-9 . _ - /)"));
        }
        if let Pin::Tag(tag) = &pin {
            let tag_ok = !tag.is_empty()
                && tag.len() <= 128
                && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
            if !tag_ok {
                return Err(bad("the tag must be 1-128 of A-Z a-z 0-9 . _ -"));
            }
        }
        Ok(PolicyRef {
            registry: registry.to_ascii_lowercase(),
            repository: repository.to_string(),
            pin,
        })
    }

    /// The same artifact pinned at `digest`.
    pub fn at_digest(&self, digest: &str) -> PolicyRef {
        PolicyRef {
            pin: Pin::Digest(digest.to_string()),
            ..self.clone()
        }
    }

    /// The digest, when the reference is pinned by one.
    pub fn digest(&self) -> Option<&str> {
        match &self.pin {
            Pin::Digest(d) => Some(d),
            Pin::Tag(_) => None,
        }
    }
}

impl fmt::Display for PolicyRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pin {
            Pin::Digest(d) => write!(f, "{SCHEME}{}/{}@{d}", self.registry, self.repository),
            Pin::Tag(t) => write!(f, "{SCHEME}{}/{}:{t}", self.registry, self.repository),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn digests_and_tags_parse_and_print_back() {
        let text = format!("oci://127.0.0.1:5000/policies/bring-up@sha256:{HEX}");
        let r = PolicyRef::parse(&text).unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "policies/bring-up");
        assert_eq!(r.digest(), Some(format!("sha256:{HEX}").as_str()));
        assert_eq!(r.to_string(), text);
        let t = PolicyRef::parse("oci://localhost:5000/p/admit:v1.2").unwrap();
        assert_eq!(t.pin, Pin::Tag("v1.2".into()));
        assert_eq!(t.repository, "p/admit");
        assert_eq!(t.to_string(), "oci://localhost:5000/p/admit:v1.2");
        assert_eq!(t.at_digest(&format!("sha256:{HEX}")).digest().map(str::len), Some(71));
    }

    #[test]
    fn malformed_references_say_what_is_wrong() {
        for (text, why) in [
            ("/etc/p.wasm", "oci://"),
            ("oci://host/repo", "neither a digest nor a tag"),
            ("oci://host/repo@md5:abc", "only sha256"),
            ("oci://host/repo@sha256:abc", "64 lower-case hex"),
            ("oci://host:5000", "no repository"),
            ("oci://host/Repo@sha256:0", "64 lower-case"),
            ("oci://host/Repo:v1", "lower-case path"),
            ("oci://host/repo:v 1", "tag must be"),
        ] {
            let error = PolicyRef::parse(text).unwrap_err();
            assert!(error.contains(why), "{text}: {error}");
        }
    }
}
