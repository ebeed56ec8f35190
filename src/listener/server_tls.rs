//! The TLS configuration a listener gives each new connection, in one swappable cell: a
//! configuration rebuilt for a rotated CA applies from the next handshake, while connections
//! already open keep the one they began with.

use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::ServerConfig;

/// A shared handle on a listener's current TLS configuration.
#[derive(Clone)]
pub struct ServerTls(Arc<ArcSwap<ServerConfig>>);

impl ServerTls {
    pub fn new(config: Arc<ServerConfig>) -> Self {
        Self(Arc::new(ArcSwap::new(config)))
    }

    /// The configuration for a connection accepted now.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.0.load_full()
    }

    /// Hands `config` to every connection accepted from now on.
    pub fn replace(&self, config: Arc<ServerConfig>) {
        self.0.store(config);
    }
}

impl From<Arc<ServerConfig>> for ServerTls {
    fn from(config: Arc<ServerConfig>) -> Self {
        Self::new(config)
    }
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}
