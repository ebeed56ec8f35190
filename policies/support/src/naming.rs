//! Snapshot naming rules, as cocoon-common names them: the tag-aware local name, the fork snapshot,
//! the hibernate import.

use alloc::format;
use alloc::string::String;
use sha2::{Digest, Sha256};

/// Registry tag of the snapshot pushed when a pod is deleted.
pub const DEFAULT_SNAPSHOT_TAG: &str = "latest";
/// Registry tag of a hibernated guest.
pub const HIBERNATE_SNAPSHOT_TAG: &str = "hibernate";
/// Longest local snapshot name cocoon accepts.
const MAX_LOCAL_NAME: usize = 63;
/// Characters of the original name kept before the digest suffix of a shortened name.
const KEPT_PREFIX: usize = 50;

/// Splits `repo[:tag]` at the first colon (cocoon-common `ParseRef`): `a:` has tag "", and a
/// ref without a colon (or with an empty name part) has tag `latest`.
pub fn parse_ref(reference: &str) -> (&str, &str) {
    match reference.split_once(':') {
        Some((name, tag)) if !name.is_empty() => (name, tag),
        _ => (reference, DEFAULT_SNAPSHOT_TAG),
    }
}

/// Tag-aware local snapshot name: bare `repo` for "" and `latest` (backward compatible),
/// `repo:tag` otherwise; names over 63 characters keep a 50-character prefix plus `-` and the
/// first 12 hex digits of the full name's SHA-256, which stays deterministic and distinct per ref.
pub fn local_snapshot_name(repo: &str, tag: &str) -> String {
    let name = if tag.is_empty() || tag == DEFAULT_SNAPSHOT_TAG {
        String::from(repo)
    } else {
        format!("{repo}:{tag}")
    };
    if name.len() <= MAX_LOCAL_NAME {
        return name;
    }
    let digest = hex_prefix(&name, 12);
    let mut cut = KEPT_PREFIX;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}-{}", &name[..cut], digest)
}

/// Name of the shared snapshot every fork of `source_vm` clones from.
pub fn fork_snapshot_name(source_vm: &str) -> String {
    format!("fork-{source_vm}")
}

/// First `digits` hex digits of SHA-256(`text`).
pub fn hex_prefix(text: &str, digits: usize) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(text.as_bytes());
    let mut out = String::with_capacity(digits);
    for byte in digest.iter() {
        if out.len() >= digits {
            break;
        }
        out.push(HEX[(byte >> 4) as usize] as char);
        if out.len() < digits {
            out.push(HEX[(byte & 0xf) as usize] as char);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_ref_splits_at_the_first_colon() {
        assert_eq!(parse_ref("myvm"), ("myvm", "latest"));
        assert_eq!(parse_ref("myvm:v2"), ("myvm", "v2"));
        assert_eq!(parse_ref("a:"), ("a", ""));
        assert_eq!(parse_ref(":x"), (":x", "latest"));
        assert_eq!(parse_ref("org/repo:snap:1"), ("org/repo", "snap:1"));
    }

    #[test]
    fn local_names_follow_the_spec_examples() {
        assert_eq!(local_snapshot_name("myvm", "latest"), "myvm");
        assert_eq!(local_snapshot_name("myvm", ""), "myvm");
        assert_eq!(local_snapshot_name("myvm", "v2"), "myvm:v2");
        assert_eq!(local_snapshot_name("org/repo", "snapshot-v1"), "org/repo:snapshot-v1");
    }

    #[test]
    fn long_names_are_shortened_deterministically_and_distinctly() {
        let repo = "registry.example/a-very-long/organisation/name/for/one/snapshot/repo";
        let a = local_snapshot_name(repo, "v1");
        let b = local_snapshot_name(repo, "v2");
        assert_eq!(a.len(), 63);
        assert_eq!(&a[..50], &format!("{repo}:v1")[..50]);
        assert_eq!(a.as_bytes()[50], b'-');
        assert_ne!(a, b);
        assert_eq!(a, local_snapshot_name(repo, "v1"));
        assert_eq!(&a[51..], hex_prefix(&format!("{repo}:v1"), 12));
    }

    #[test]
    fn hex_prefix_matches_sha256() {
        // sha256("abc") = ba7816bf8f01cfea...
        assert_eq!(hex_prefix("abc", 12), "ba7816bf8f01");
        assert_eq!(hex_prefix("abc", 5), "ba781");
    }
}
