//! Lexical path cleaning, as Go's `filepath.Clean` does it, for validating
//! `vm.cocoonstack.io/clone-from-dir` (it must be absolute and already clean).

use alloc::string::String;
use alloc::vec::Vec;

/// The shortest lexically equivalent form of `path`: repeated slashes collapse, `.` elements go,
/// `..` removes the element before it (and is dropped at the root), no trailing slash.
pub fn clean(path: &str) -> String {
    if path.is_empty() {
        return String::from(".");
    }
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for element in path.split('/') {
        match element {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|last| *last != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => {
            let mut out = String::from("/");
            out.push_str(&joined);
            out
        }
        (false, true) => String::from("."),
        (false, false) => joined,
    }
}

/// True when `path` is absolute and equal to its cleaned form.
pub fn is_absolute_and_clean(path: &str) -> bool {
    path.starts_with('/') && clean(path) == path
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_matches_go_filepath_clean() {
        for (input, want) in [
            ("", "."),
            ("/", "/"),
            ("/a/b", "/a/b"),
            ("/a/b/", "/a/b"),
            ("/a//b", "/a/b"),
            ("/a/./b", "/a/b"),
            ("/a/../b", "/b"),
            ("/../a", "/a"),
            ("a/../..", ".."),
            ("a/b/../../c", "c"),
        ] {
            assert_eq!(clean(input), want, "clean({input:?})");
        }
    }

    #[test]
    fn only_absolute_clean_paths_pass() {
        assert!(is_absolute_and_clean("/var/lib/cocoon/export"));
        assert!(!is_absolute_and_clean("var/lib"));
        assert!(!is_absolute_and_clean("/var/lib/"));
        assert!(!is_absolute_and_clean("/var/../lib"));
        assert!(!is_absolute_and_clean("/var//lib"));
    }
}
