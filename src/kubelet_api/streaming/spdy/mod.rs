//! SPDY/3.1, as the Kubernetes API server speaks it to a kubelet for exec, attach and
//! port-forward (the `SPDY/3.1` upgrade of `k8s.io/apimachinery/pkg/util/httpstream/spdy`, with
//! the kubelet's sub-protocols on top). No maintained Rust crate serves it, so it lives here:
//! [`codec`] is the wire format (pure, fuzzed by `tests/fuzz`), [`session`] the multiplexer over
//! one upgraded connection (streams, SYN_REPLY, PING, GOAWAY, idle timeout), [`flow`] the
//! flow-control windows, [`stream`] a stream as tokio I/O.

pub mod codec;
pub mod flow;
pub mod session;
pub mod stream;

pub use session::{Session, SessionConfig, serve};
pub use stream::{Stream, StreamReader, StreamWriter};

#[cfg(test)]
mod tests;
