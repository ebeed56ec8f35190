//! `cocoon-macos-sim`: answers the `cocoon-macos` CLI's argv over a state directory
//! (`--state-dir`, else `COCOON_MACOS_HOME`).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The "qemu" of a running VM (started by `vm run` / `vm start`).
    if args.first().map(String::as_str) == Some("__qemu") {
        std::process::exit(cocoon_sim::macos::qemu::main(&args[1..]));
    }
    std::process::exit(cocoon_sim::macos::run(args));
}
