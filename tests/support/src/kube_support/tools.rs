//! The project's tools folder beside the repository (`../shared/tools/`): where each tool is,
//! its binaries unpacked once into the build tree, and a watchdog that stops a tool's process
//! when the test binary ends however it ends.
//!
//! It depends on std only (the fake apiserver's semantics tests use `kube_support` too).

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};

use crate::repo_root;

/// Overrides where the Kubernetes tools are (default: `<repo>/../shared/tools/kubernetes`).
pub const KUBE_TOOLS_ENV: &str = "VK_KUBE_TOOLS_DIR";

/// The Kubernetes tools folder and where that came from (for messages): `$VK_KUBE_TOOLS_DIR`,
/// else `../shared/tools/kubernetes` beside the repository.
pub fn kube_tools_dir() -> (PathBuf, String) {
    match std::env::var_os(KUBE_TOOLS_ENV).filter(|v| !v.is_empty()) {
        Some(dir) => (PathBuf::from(dir), format!("${KUBE_TOOLS_ENV}")),
        None => (
            repo_root().join("../shared/tools/kubernetes"),
            "../shared/tools/kubernetes beside the repository".to_string(),
        ),
    }
}

/// A sibling of the Kubernetes tools folder (`registry`, `cocoon-operator`): `$env` when set,
/// else `<kube tools>/../<name>` — so one `VK_KUBE_TOOLS_DIR` finds them all.
pub fn sibling_tool_dir(env: &str, name: &str) -> PathBuf {
    match std::env::var_os(env).filter(|v| !v.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => kube_tools_dir().0.join("..").join(name),
    }
}

/// Overrides where CNCF Distribution v3 is (`registry.xz`; default: the `registry` folder beside
/// the Kubernetes tools).
pub const REGISTRY_TOOLS_ENV: &str = "VK_REGISTRY_TOOLS_DIR";

/// The CNCF Distribution v3 registry binary (`registry.xz` unpacked), or why there is none.
pub fn registry_v3_binary() -> Result<PathBuf, String> {
    let archive = sibling_tool_dir(REGISTRY_TOOLS_ENV, "registry").join("registry.xz");
    if !archive.is_file() {
        return Err(format!(
            "no CNCF Distribution v3 registry at {} (set {REGISTRY_TOOLS_ENV} to the folder with registry.xz)",
            archive.display()
        ));
    }
    unpacked(&archive)
}

/// `ARCHIVE` (`NAME.xz`) unpacked once into the build tree (`target/<profile>/kube-tools/`),
/// keyed by the archive's size and mtime; concurrent test binaries race safely (write, then
/// rename).
pub fn unpacked(archive: &Path) -> Result<PathBuf, String> {
    let name = archive
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .ok_or_else(|| format!("{}: not an archive name", archive.display()))?;
    let meta = std::fs::metadata(archive).map_err(|e| format!("{}: {e}", archive.display()))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    // Test binaries live in target/<profile>/deps/.
    let cache = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("kube-tools")))
        .unwrap_or_else(|| std::env::temp_dir().join("vk-kube-tools"));
    let target = cache.join(format!("{name}-{}-{mtime}", meta.len()));
    if target.is_file() {
        return Ok(target);
    }
    std::fs::create_dir_all(&cache).map_err(|e| format!("creating {}: {e}", cache.display()))?;
    let tmp = cache.join(format!("{name}.{}.tmp", std::process::id()));
    let file = std::fs::File::create(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    let status = Command::new("xz")
        .arg("-dc")
        .arg(archive)
        .stdout(file)
        .status()
        .map_err(|e| format!("running xz (install xz-utils): {e}"))?;
    if !status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("xz -dc {} failed: {status}", archive.display()));
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .and_then(|()| std::fs::rename(&tmp, &target))
        .map_err(|e| format!("installing {}: {e}", target.display()))?;
    Ok(target)
}

/// A `sh` waiting on a pipe from this process: when the pipe closes — the watchdog dropped, or
/// this process exiting, crashing or killed with SIGKILL — it runs its script. A process kept
/// in a `static` (never dropped) is stopped that way when the test binary ends.
pub struct Watchdog {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Watchdog {
    /// Runs `script` (`sh -c`, with `args` as `$0`, `$1`, …) when the pipe closes.
    pub fn run_on_close(script: &str, args: &[&std::ffi::OsStr]) -> Result<Watchdog, String> {
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("trap '' INT TERM HUP; read _ignored; {script}"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting a watchdog: {e}"))?;
        let stdin = child.stdin.take();
        Ok(Watchdog { child, stdin })
    }

    /// SIGTERM to `process` when the pipe closes — only while that pid is still the process
    /// of `exe` (a pid reused by another program after it ended is left alone), SIGKILL if it
    /// is still there 10 s later — then removes `dir` (its state, which a `static` never
    /// removes).
    pub fn terminate(process: &Child, exe: &Path, dir: &Path) -> Result<Watchdog, String> {
        let pid = process.id().to_string();
        Watchdog::run_on_close(
            // Named first: inside a function, $1 and $2 are the function's own arguments.
            r#"pid="$0" exe="$1" dir="$2"
               alive() { [ "$(readlink "/proc/$pid/exe")" = "$exe" ]; }
               if alive; then
                 kill -TERM "$pid"
                 i=0; while alive && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
                 alive && kill -KILL "$pid"
               fi
               rm -rf "$dir""#,
            &[pid.as_ref(), exe.as_os_str(), dir.as_os_str()],
        )
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}
