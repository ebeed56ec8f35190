//! `cocoon-sim`: answers the `cocoon` CLI's argv over a state directory (`COCOON_SIM_ROOT`).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The VMM of a running VM (started by `vm run` / `vm clone` / `vm start`).
    if args.first().map(String::as_str) == Some("__vmm") {
        std::process::exit(cocoon_sim::vmm::main(&args[1..]));
    }
    std::process::exit(cocoon_sim::cli::run(args));
}
