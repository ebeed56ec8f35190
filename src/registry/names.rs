//! The OCI distribution grammar of repository names, tags and digests, checked before a name goes into
//! a URL path. A name that is not in the grammar is refused, not escaped: the `url` crate resolves
//! `..` (and `%2e%2e`) segments, so `team/../other` or a tag `../../other/manifests/t` would reach
//! another repository than the one the node's `OCI_REGISTRY` prefix allows — the grammar has no `.`
//! segment, no `%` and no empty segment, so nothing in it can leave its place in the path.

use regex::Regex;
use std::sync::OnceLock;

/// The distribution spec's name grammar: path components of lower-case alphanumerics joined by
/// `.`, `_`, `__` or runs of `-`, separated by `/`.
const NAME: &str = r"^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*$";
/// The spec's tag grammar.
const TAG: &str = r"^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$";
/// The OCI image spec's digest grammar (`algorithm:encoded`).
const DIGEST: &str = r"^[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$";
/// Registries (and the spec's clients) cap a repository name at 255 bytes.
const NAME_MAX: usize = 255;

fn matcher(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("a valid constant pattern"))
}

/// Why `name` is not a repository name, if it is not.
pub fn repository_problem(name: &str) -> Option<String> {
    static RE: OnceLock<Regex> = OnceLock::new();
    if name.len() > NAME_MAX {
        return Some(format!(
            "it is {} bytes long, more than the {NAME_MAX} allowed",
            name.len()
        ));
    }
    (!matcher(&RE, NAME).is_match(name)).then(|| {
        "a repository name is lower-case path components of a-z and 0-9, joined by '.', '_', '__' or '-' and separated by single '/'".to_string()
    })
}

/// Why `reference` is neither a tag nor a digest, if it is not. A reference with a `:` is a digest.
pub fn reference_problem(reference: &str) -> Option<String> {
    static TAG_RE: OnceLock<Regex> = OnceLock::new();
    static DIGEST_RE: OnceLock<Regex> = OnceLock::new();
    if reference.contains(':') {
        (!matcher(&DIGEST_RE, DIGEST).is_match(reference))
            .then(|| "a digest is algorithm:encoded (e.g. sha256:<64 hex digits>)".to_string())
    } else {
        (!matcher(&TAG_RE, TAG).is_match(reference))
            .then(|| "a tag is 1 to 128 of A-Z a-z 0-9 '_' '.' '-', and does not start with '.' or '-'".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_names_follow_the_distribution_grammar() {
        for ok in [
            "vm",
            "cocoon/vk-default-demo-0",
            "a/b/c",
            "policies/bring-up",
            "a__b",
            "a.b_c--d",
            "0",
        ] {
            assert_eq!(repository_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            "..",
            "../other",
            "team/../other",
            "x/./y",
            "%2e%2e/other",
            "a//b",
            "/a",
            "a/",
            "Other",
            "a b",
            "a___b",
            "-a",
            "a-",
            "a/.hidden",
            "a?b",
            "a#b",
            "a\\b",
        ] {
            assert!(repository_problem(bad).is_some(), "{bad:?} accepted");
        }
        assert!(repository_problem(&"a".repeat(256)).unwrap().contains("255"));
        assert_eq!(repository_problem(&"a".repeat(255)), None);
    }

    #[test]
    fn tags_and_digests_follow_their_grammars() {
        let digest = format!("sha256:{}", "a".repeat(64));
        for ok in ["latest", "hibernate", "v1.2.3", "_x", "A-b_c.d", digest.as_str()] {
            assert_eq!(reference_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "../../other/manifests/t",
            "-x",
            ".x",
            "a/b",
            "a%2fb",
            "a b",
            "sha256:",
            ":abc",
            "sha256:../x",
            "sha256:a/b",
        ] {
            assert!(reference_problem(bad).is_some(), "{bad:?} accepted");
        }
        assert!(reference_problem(&"a".repeat(129)).is_some());
        assert_eq!(reference_problem(&"a".repeat(128)), None);
    }
}
