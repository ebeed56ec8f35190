//! The cocoon CLI's settings: which binary, how it is run, and cocoon's root directory (which
//! the node, the stats, the provider and the peer tier read below).

use std::path::PathBuf;

use super::client::CocoonCliConfig;
use super::macos::MacosCliConfig;
use crate::settings::{self, parser};

/// `COCOON_ROOT_DIR`: cocoon's data root. One owner (here); the others are handed the value.
#[derive(Debug, Clone, clap::Args)]
pub struct RootArgs {
    /// cocoon's data root: ephemeral-storage is its filesystem, and the run dir, the staging and snapshot dirs default under it
    #[arg(long = "cocoon-root-dir", env = "COCOON_ROOT_DIR", value_name = "DIR", default_value = "/var/lib/cocoon",
          value_parser = parser("COCOON_ROOT_DIR", "an absolute directory path", settings::absolute_path))]
    pub root_dir: PathBuf,
}

/// How the daemon runs cocoon.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "cocoon")]
pub struct CocoonArgs {
    /// The cocoon CLI (run with an argv, never a shell; it must be v0.5.8 or newer)
    #[arg(
        long = "cocoon-bin",
        env = "VK_COCOON_BIN",
        value_name = "PATH",
        default_value = "/usr/local/bin/cocoon"
    )]
    pub bin: PathBuf,
    /// Run cocoon as `sudo -n cocoon …`
    #[arg(long = "cocoon-sudo", env = "VK_COCOON_SUDO", value_name = "BOOL", default_value = "false", action = clap::ArgAction::Set,
          value_parser = parser("VK_COCOON_SUDO", "true or false", settings::boolean))]
    pub sudo: bool,
    /// The cocoon-macos CLI for `os=macos` pods (v0.1.8 or newer; run with the same sudo rule)
    #[arg(
        long = "cocoon-macos-bin",
        env = "VK_COCOON_MACOS_BIN",
        value_name = "PATH",
        default_value = "/usr/local/bin/cocoon-macos"
    )]
    pub macos_bin: PathBuf,
    #[command(flatten)]
    pub root: RootArgs,
}

impl CocoonCliConfig {
    /// The client's configuration from its settings (timeouts and retries keep their defaults).
    pub fn from_args(args: &CocoonArgs) -> Self {
        CocoonCliConfig {
            bin: args.bin.clone(),
            sudo: args.sudo,
            ..CocoonCliConfig::default()
        }
    }
}

impl MacosCliConfig {
    /// The cocoon-macos client's configuration (timeouts keep their defaults).
    pub fn from_args(args: &CocoonArgs) -> Self {
        MacosCliConfig {
            bin: args.macos_bin.clone(),
            sudo: args.sudo,
            ..MacosCliConfig::default()
        }
    }
}
