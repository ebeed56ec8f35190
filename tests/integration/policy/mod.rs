//! Policies from their authors' side: the sandbox against hostile guests, hot reload of a slot,
//! the daemon's compile worker, and the `vk-cocoon` command line (the policy tools and `run`'s settings).

mod cli;
mod compile_worker;
mod languages;
mod reload;
mod sandbox;
mod scaffold;
