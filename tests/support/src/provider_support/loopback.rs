//! The suite's loopback guard: tests never send traffic off this machine. Every in-process test
//! daemon probes through a [`LoopbackGuard`]; a probe of an address outside `127.0.0.0/8` and
//! `::1` is not sent — the guard answers it with an error naming the address — and the test
//! fails: loudly on stderr at once, and with a panic naming every refused address when its
//! [`Env`](super::Env) is dropped.
//!
//! Why here and not in the daemon: the daemon's prober is a port (`Ports::prober`), and this is
//! where the tests inject it, so the guard wraps the real `NetProber` without a test-only branch
//! in the production build. It is deliberately independent of the daemon's own
//! `VK_PROBE_NETWORKS` scope (which guards the `vk-cocoon run` processes tests start, see
//! `tests/support/src/daemon.rs`): a bug in that production code must not switch this guard off.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use vk_cocoon::provider::probe::{ProbeError, Prober};

/// The only addresses a test may make the daemon contact.
pub fn is_test_address(ip: IpAddr) -> bool {
    // `Ipv4Addr::is_loopback` is 127.0.0.0/8, `Ipv6Addr::is_loopback` is ::1 only.
    ip.is_loopback()
}

/// The non-loopback targets refused during one test.
#[derive(Clone, Default)]
pub struct Refusals(Arc<Mutex<Vec<String>>>);

impl Refusals {
    fn record(&self, what: String) {
        eprintln!("LOOPBACK GUARD: {what}");
        self.0.lock().unwrap().push(what);
    }

    pub fn list(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// Panics with every refused target (the end-of-test check of [`Env`](super::Env)'s drop).
    pub fn assert_none(&self) {
        let refused = self.list();
        assert!(
            refused.is_empty(),
            "the daemon tried to contact addresses outside loopback (tests may only use 127.0.0.0/8 and ::1): {}",
            refused.join("; ")
        );
    }
}

/// A [`Prober`] that passes loopback targets to `inner` and refuses every other one.
pub struct LoopbackGuard {
    inner: Arc<dyn Prober>,
    refused: Refusals,
}

impl LoopbackGuard {
    pub fn new(inner: Arc<dyn Prober>, refused: Refusals) -> Self {
        Self { inner, refused }
    }

    fn admit(&self, ip: IpAddr, what: &str) -> Result<(), ProbeError> {
        if is_test_address(ip) {
            return Ok(());
        }
        let message = format!("refused to {what} {ip}: not a loopback address");
        self.refused.record(message.clone());
        Err(std::io::Error::new(std::io::ErrorKind::PermissionDenied, format!("test guard: {message}")).into())
    }
}

#[async_trait]
impl Prober for LoopbackGuard {
    async fn tcp(&self, addr: SocketAddr, timeout: Duration) -> Result<(), ProbeError> {
        self.admit(addr.ip(), &format!("TCP-probe port {} of", addr.port()))?;
        self.inner.tcp(addr, timeout).await
    }

    async fn ping(&self, ip: Ipv4Addr, timeout: Duration) -> Result<(), ProbeError> {
        self.admit(IpAddr::V4(ip), "ping")?;
        self.inner.ping(ip, timeout).await
    }

    async fn banner(&self, addr: SocketAddr, prefix: &str, timeout: Duration) -> Result<(), ProbeError> {
        self.admit(addr.ip(), &format!("read the banner of port {} of", addr.port()))?;
        self.inner.banner(addr, prefix, timeout).await
    }
}

// ---- `vk-cocoon run` processes ---------------------------------------------------------------

/// `VK_PROBE_NETWORKS` for every `vk-cocoon run` a test starts: the daemon's own probe scope
/// (`src/provider/probe_scope.rs`) then refuses any target off this machine, and logs one
/// `probe refused` line naming it.
pub const DAEMON_PROBE_NETWORKS: &str = "127.0.0.0/8,::1/128";

/// The `probe refused` lines of a `vk-cocoon run` log (each names the refused address).
pub fn probe_refusals(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("probe refused"))
        .map(str::to_string)
        .collect()
}
