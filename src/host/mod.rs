//! The host kernel, read and asked through the few calls `std` does not offer: filesystem space,
//! data extents of sparse files, memory, CPUs, process signals and limits, the clock of one
//! thread, the host's addresses.
//!
//! The one module of the crate allowed `unsafe` (the crate denies it everywhere else, see
//! `[workspace.lints]`): every foreign call sits here behind a safe function, with the reason it
//! is sound beside it, so a reviewer reads the daemon's contact with libc in one place.
//! Calls `rustix` wraps safely go through it; the rest are `libc` calls of a few lines each.
//! Pure parsing of what the kernel wrote (`/proc` text) lives here too, beside the reads.

#![allow(unsafe_code)]

pub mod cpu;
pub mod fs;
pub mod memory;
pub mod net;
pub mod process;
