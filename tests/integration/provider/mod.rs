//! The cocoon provider end to end: the daemon on the fake apiserver drives the cocoon (and
//! cocoon-macos) simulator, with a real loopback registry and the default policies.

mod create;
mod delete;
pub(crate) mod hibernate;
mod macos;
mod network;
mod policy;
mod readiness;
mod restart;
mod sac;
mod tenancy;
mod watcher;
