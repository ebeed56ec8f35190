//! Policies from their authors' side: the sandbox against hostile guests, hot reload of a slot,
//! and the `vk-cocoon` command line (the policy tools and `run`'s settings).

mod cli;
mod reload;
mod sandbox;
