//! `cocoon-sim`: answers the `cocoon` CLI's argv over a state directory (`COCOON_SIM_ROOT`).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(cocoon_sim::cli::run(args));
}
