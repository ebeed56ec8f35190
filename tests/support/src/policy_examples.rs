//! The example policies in Python and JavaScript (`policies/examples/build.sh` builds them into
//! `target/policy-examples`, or `VK_POLICY_EXAMPLES_DIR`): their toolchains are large, so a
//! developer may run the suite without them; CI may not.

use std::path::PathBuf;

/// The examples' directory when every one of `files` is in it; `None` (the test then says it is
/// skipped) when one is missing, except under `CI=true`, where that fails the test.
pub fn dir_with(files: &[&str]) -> Option<PathBuf> {
    let dir = std::env::var_os("VK_POLICY_EXAMPLES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("target/policy-examples"));
    if files.iter().all(|f| dir.join(f).exists()) {
        return Some(dir);
    }
    assert_ne!(
        std::env::var("CI").as_deref(),
        Ok("true"),
        "CI=true, but the example policies are not built in {} (policies/examples/build.sh)",
        dir.display()
    );
    eprintln!(
        "skipped: no example policies in {}; run policies/examples/build.sh",
        dir.display()
    );
    None
}
