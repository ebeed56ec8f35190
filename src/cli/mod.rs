//! Command-line interface of the `vk-cocoon` binary.

mod bench;
mod distribute;
mod policy;
mod replay;
mod run;
mod scaffold;
mod shutdown;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "vk-cocoon",
    version,
    about = "Kubernetes virtual-kubelet node daemon for cocoon microVMs"
)]
pub struct Cli {
    #[command(flatten)]
    pub logging: LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Tools for policy authors: create, test, evaluate and check policy components.
    #[command(subcommand)]
    Policy(policy::PolicyCommand),
    /// Run the node daemon. Every setting is an environment variable (or its flag); an empty
    /// variable counts as unset.
    Run(Box<run::RunArgs>),
}

/// Structured logs on stderr (every subcommand).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Log level, or tracing filter directives such as info,vk_cocoon::provider=debug
    #[arg(long, global = true, env = "VK_LOG_LEVEL", value_name = "FILTER", default_value = "info",
          value_parser = vk_cocoon::settings::parser("VK_LOG_LEVEL", "a log level or tracing filter such as info, debug or info,vk_cocoon::provider=debug",
              |v| tracing_subscriber::EnvFilter::try_new(v).map(|_| v.to_string()).map_err(|e| format!("not a log level or tracing filter ({e})"))))]
    pub log_level: String,
    /// text (ANSI colours only when stderr is a terminal) or json (one object per line, for log collectors)
    #[arg(long, global = true, env = "VK_LOG_FORMAT", value_name = "FORMAT", default_value = "text",
          value_parser = vk_cocoon::settings::parser("VK_LOG_FORMAT", "text or json", |v| match v {
              "text" | "json" => Ok(v.to_string()),
              _ => Err("not a log format".to_string()),
          }))]
    pub log_format: String,
}

/// The command line and the environment, read by clap with the settings' rules (an empty
/// variable counts as unset: `vk_cocoon::settings`). A value that does not parse ends the
/// process here with clap's message, which names the variable and what it accepts.
pub fn parse() -> Cli {
    use clap::{CommandFactory, FromArgMatches};
    let matches = vk_cocoon::settings::without_blank_env(Cli::command()).get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Installs the subscriber: the level and format were checked when the settings were parsed.
pub fn init_logging(args: &LogArgs) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .map_err(|e| anyhow::anyhow!("VK_LOG_LEVEL={:?}: {e}", args.log_level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if args.log_format == "json" {
        builder.json().try_init()
    } else {
        builder.with_ansi(std::io::stderr().is_terminal()).try_init()
    };
    Ok(())
}

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Policy(command) => policy::run(command),
        Command::Run(args) => run::run(*args),
    }
}
