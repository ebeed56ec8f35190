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

/// Structured logs on stderr. The level comes from `VK_LOG_LEVEL` (default `info`), which also
/// accepts `tracing` filter directives such as `vk_cocoon::policy=debug`; a value that does not
/// parse is an error, not a silent `info`. `VK_LOG_FORMAT` is `text` (the default; ANSI colours
/// only when stderr is a terminal) or `json` (one object per line, for log collectors).
pub fn init_logging() -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let level = std::env::var("VK_LOG_LEVEL").unwrap_or_else(|_| "info".into());
    let filter = tracing_subscriber::EnvFilter::try_new(&level).map_err(|e| {
        anyhow::anyhow!("VK_LOG_LEVEL={level:?} is not a log level or tracing filter ({e}); use e.g. info, debug or info,vk_cocoon::provider=debug")
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match std::env::var("VK_LOG_FORMAT").as_deref() {
        Err(_) | Ok("" | "text") => builder.with_ansi(std::io::stderr().is_terminal()).try_init(),
        Ok("json") => builder.json().try_init(),
        Ok(other) => anyhow::bail!("VK_LOG_FORMAT={other:?} is not a log format; use text or json"),
    };
    Ok(())
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Policy(command) => policy::run(command),
        Command::Run(args) => run::run(args),
    }
}
