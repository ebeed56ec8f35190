//! The `vk-cocoon` binary: the node daemon and the policy authors' tools.

use std::process::ExitCode;

mod cli;

fn main() -> ExitCode {
    let cli = cli::parse();
    if let Err(error) = cli::init_logging(&cli.logging) {
        eprintln!("error: {error:#}");
        return ExitCode::from(2);
    }
    match cli::run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}
