//! How the daemon starts a CLI it drives (cocoon, cocoon-macos): the binary, under `sudo -n`
//! when configured (never a password prompt), with its extra environment, no stdin, and stdout
//! and stderr piped for the caller to read.

use std::path::Path;
use std::process::Stdio;
use tokio::process::Command;

/// `bin args…` (or `sudo -n bin args…`) with `env` added to the daemon's environment.
pub(crate) fn cli_command(bin: &Path, sudo: bool, env: &[(String, String)], args: &[String]) -> Command {
    let mut cmd = if sudo {
        let mut c = Command::new("sudo");
        c.arg("-n").arg(bin);
        c
    } else {
        Command::new(bin)
    };
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}
