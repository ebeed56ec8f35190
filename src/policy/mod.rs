//! The WebAssembly policy engine.
