//! The cocoon version floor. Builds before the verbs and flags the daemon sends
//! (`vm reconcile-stale-create`, `vm exec`, `vm net`, `--restore-mode`, the cgroup flags,
//! `--from-dir`) answer them with `unknown flag` / `unknown command`, which would fail every
//! clone of every pod; the daemon checks `cocoon version` once at startup instead and stops
//! with the minimum named.

use super::client::CocoonCli;
use super::errors::RuntimeError;

/// The oldest cocoon the daemon works with: `vm reconcile-stale-create` (the startup reconcile's
/// verb) first shipped after v0.5.7 (vk-cocoon's docs: "needs cocoon > v0.5.7").
pub const MINIMUM: Release = Release {
    major: 0,
    minor: 5,
    patch: 8,
};

/// A cocoon release number (`git describe --tags`: `v0.5.8`, `v0.5.8-3-g4feeddc`, `0.6.0-rc1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Release {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl std::fmt::Display for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// What `cocoon version` said about the build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reported {
    /// A release (or a commit after one: `git describe` counts from the last tag).
    Release(Release),
    /// A build without a release number (`unknown`: built without the Makefile's ldflags, or
    /// from a tree without tags) — nothing to compare.
    Unnumbered(String),
}

/// The `Version:` line of `cocoon version` (cocoon's `version.String()`).
pub fn parse_report(stdout: &str) -> Option<Reported> {
    let value = version_line(stdout)?;
    Some(match parse_release(value) {
        Some(release) => Reported::Release(release),
        None => Reported::Unnumbered(value.to_string()),
    })
}

fn version_line(stdout: &str) -> Option<&str> {
    stdout
        .lines()
        .find_map(|line| line.trim().strip_prefix("Version:"))
        .map(str::trim)
}

fn parse_release(text: &str) -> Option<Release> {
    let text = text.strip_prefix('v').unwrap_or(text);
    // `0.5.8-3-g4feeddc` (three commits after v0.5.8) and `0.6.0-rc1` keep their base number.
    let base = text.split(['-', '+']).next()?;
    let mut parts = base.split('.');
    let mut number = || parts.next().and_then(|p| p.parse::<u64>().ok());
    let release = Release {
        major: number()?,
        minor: number()?,
        patch: number()?,
    };
    parts.next().is_none().then_some(release)
}

/// Why the daemon cannot use this cocoon.
#[derive(Debug, thiserror::Error)]
pub enum FloorError {
    #[error(
        "cocoon at {bin} is {reported}, older than {min}, the oldest release with the verbs and flags vk-cocoon sends (vm reconcile-stale-create, vm exec, vm net, --restore-mode, the cgroup flags, --from-dir): every clone would fail with `unknown flag`; install cocoon {min} or newer (or point VK_COCOON_BIN at one)",
        min = MINIMUM
    )]
    TooOld { bin: String, reported: String },
    #[error(
        "cannot tell which cocoon {bin} is: `cocoon version` failed ({source}); vk-cocoon needs cocoon {min} or newer: check VK_COCOON_BIN (and VK_COCOON_SUDO) and that `{bin} version` works",
        min = MINIMUM
    )]
    Unreadable { bin: String, source: RuntimeError },
    #[error(
        "cannot tell which cocoon {bin} is: `cocoon version` printed no Version: line; vk-cocoon needs cocoon {min} or newer: check that VK_COCOON_BIN is cocoon",
        min = MINIMUM
    )]
    NotCocoon { bin: String },
}

/// Checks the floor: `Ok(Reported)` when the daemon may run with this cocoon (an unnumbered build
/// is allowed, and said by the caller), an error naming the minimum otherwise.
pub async fn check(cli: &CocoonCli) -> Result<Reported, FloorError> {
    let bin = cli.config().bin.display().to_string();
    let stdout = cli.version().await.map_err(|source| FloorError::Unreadable {
        bin: bin.clone(),
        source,
    })?;
    match parse_report(&stdout) {
        None => Err(FloorError::NotCocoon { bin }),
        Some(Reported::Release(found)) if found < MINIMUM => Err(FloorError::TooOld {
            bin,
            reported: version_line(&stdout).unwrap_or_default().to_string(),
        }),
        Some(reported) => Ok(reported),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(text: &str) -> Option<Release> {
        match parse_report(&format!(
            "Version:        {text}\nGit hash:       HEAD\nBuilt:          now\n"
        ))? {
            Reported::Release(r) => Some(r),
            Reported::Unnumbered(_) => None,
        }
    }

    #[test]
    fn the_version_line_is_a_release_or_unnumbered() {
        let r = |major, minor, patch| Some(Release { major, minor, patch });
        assert_eq!(release("v0.5.8"), r(0, 5, 8));
        assert_eq!(release("0.6.12"), r(0, 6, 12));
        assert_eq!(
            release("v0.5.7-14-g4feeddc"),
            r(0, 5, 7),
            "commits after v0.5.7 are not v0.5.8"
        );
        assert_eq!(release("v1.0.0-rc1"), r(1, 0, 0));
        assert_eq!(release("unknown"), None);
        assert_eq!(release("v0.5"), None);
        assert_eq!(release("v0.5.8.1"), None);
        assert_eq!(
            parse_report("Version:        unknown\n"),
            Some(Reported::Unnumbered("unknown".into()))
        );
        assert_eq!(parse_report("cocoon 0.6\n"), None, "no Version: line");
    }

    #[test]
    fn releases_order_by_number_not_text() {
        let v = |t| release(t).unwrap();
        assert!(v("v0.5.7") < MINIMUM);
        assert!(v("v0.5.8") >= MINIMUM);
        assert!(v("v0.5.10") > v("v0.5.9"));
        assert!(v("v0.10.0") > v("v0.9.9"));
        assert_eq!(MINIMUM.to_string(), "v0.5.8");
    }
}
