//! The cocoon runtime client against the simulator: every verb, the error classes, the event stream.

mod client;
mod errors;
mod events;
