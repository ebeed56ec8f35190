//! Command-line interface of the `vk-cocoon` binary.

mod bench;
mod distribute;
mod policy;
mod replay;
mod run;
mod scaffold;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "vk-cocoon",
    version,
    about = "Kubernetes virtual-kubelet node daemon for cocoon microVMs"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Tools for policy authors: create, test, evaluate and check policy components.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Run the node daemon (configuration from the environment).
    Run(run::RunArgs),
}

/// Structured logs on stderr; the level comes from `VK_LOG_LEVEL` (default `info`), which also
/// accepts `tracing` filter directives such as `vk_cocoon::policy=debug`.
pub fn init_logging() {
    let filter = std::env::var("VK_LOG_LEVEL").unwrap_or_else(|_| "info".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .try_init();
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Policy(command) => policy::run(command),
        Command::Run(args) => run::run(args),
    }
}
