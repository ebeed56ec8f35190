//! The peer snapshot tier (the wake's middle tier, between a verified local snapshot and a registry
//! pull): a guest hibernated on node A and woken on node B is restored from A's raw
//! snapshot files instead of the registry when A is up, then cloned with `--from-dir`.
//!
//! Layout: [`protocol`] (documents and the checks both ends make) and [`extents`] (which ranges
//! to send) are pure; [`server`] serves A's files, [`client`] restores them on B into
//! [`staging`] and [`verify`] checks them against the registry's digests; [`tls`] is the mutual
//! TLS both ends speak (each node's certificate, the recorded `from-node` checked) and [`auth`]
//! the shared peer token sent inside it as a second factor; [`nodes`] finds a peer's address in
//! the API. The wake executor that uses them is `provider::wake`.

pub mod arrivals;
pub mod auth;
pub mod client;
pub mod extents;
pub mod nodes;
pub mod protocol;
pub mod server;
pub mod staging;
pub mod tls;
pub mod verify;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};

use crate::kubelet_api::tls::ca_file::CaFile;

pub use auth::PeerToken;
pub use client::{PeerClient, RestoreError, Restored, Timeouts};
pub use nodes::{KubeNodes, NodeAddresses};
pub use server::PeerServer;
pub use staging::Staging;
pub use tls::PeerTls;

/// Peer settings.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// `VK_PEER_ADDR` (default `:12501`): the listener; its port is what peers dial.
    pub listen: SocketAddr,
    /// `VK_STAGING_DIR` (default `<COCOON_ROOT_DIR>/vk-staging`): must share a filesystem with cocoon's data.
    pub staging_dir: PathBuf,
    /// `VK_COCOON_SNAPSHOT_DIR` (default `<COCOON_ROOT_DIR>/snapshot/localfile`): served to peers.
    pub snapshot_dir: PathBuf,
    /// `VK_PEER_TOKEN_FILE`; `None` = the tier is off (no server, wakes skip it).
    pub token: Option<PeerToken>,
    /// `VK_PEER_CA_FILE`: the file, followed for a rotation, and what every peer's certificate
    /// must chain to as read at startup; `None` = the tier is off.
    pub ca: Option<(CaFile, rustls::RootCertStore)>,
    /// Which certificate this node presents to its peers.
    pub identity: PeerIdentity,
}

/// The certificate a node presents on the peer tier, as server and as client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerIdentity {
    /// The kubelet API's serving certificate (cluster-signed, renewed with it).
    KubeletServing,
    /// `VK_PEER_TLS_CERT` / `VK_PEER_TLS_KEY` (re-read when they change).
    Files { cert: PathBuf, key: PathBuf },
}

/// The peer snapshot tier's settings.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Peer snapshot tier")]
pub struct PeerArgs {
    /// The peer snapshot listener; its port is what peers dial (one port fleet-wide)
    #[arg(long, env = "VK_PEER_ADDR", value_name = "ADDR", default_value = ":12501",
          value_parser = crate::settings::parser("VK_PEER_ADDR", "host:port or :port", crate::provider::metrics::parse_listen_addr))]
    pub peer_addr: SocketAddr,
    /// The fleet's shared peer token, at least 16 characters (unset: the tier is off)
    #[arg(long, env = "VK_PEER_TOKEN_FILE", value_name = "FILE")]
    pub peer_token_file: Option<PathBuf>,
    /// The CA (PEM) every node's peer certificate chains to: the cluster CA when nodes present their kubelet-serving certificates (unset: the tier is off)
    #[arg(long, env = "VK_PEER_CA_FILE", value_name = "FILE")]
    pub peer_ca_file: Option<PathBuf>,
    /// This node's peer certificate (PEM chain, usable for server auth, naming the node: DNS SAN or CN=system:node:NAME; unset: the kubelet API's serving certificate)
    #[arg(long, env = "VK_PEER_TLS_CERT", value_name = "FILE")]
    pub peer_tls_cert: Option<PathBuf>,
    /// The private key of VK_PEER_TLS_CERT (PEM)
    #[arg(long, env = "VK_PEER_TLS_KEY", value_name = "FILE")]
    pub peer_tls_key: Option<PathBuf>,
    /// Where peer restores are staged; same filesystem as cocoon's data, swept at startup (unset: <COCOON_ROOT_DIR>/vk-staging)
    #[arg(long, env = "VK_STAGING_DIR", value_name = "DIR")]
    pub staging_dir: Option<PathBuf>,
    /// cocoon's localfile snapshot store, served to peers (unset: <COCOON_ROOT_DIR>/snapshot/localfile)
    #[arg(long, env = "VK_COCOON_SNAPSHOT_DIR", value_name = "DIR")]
    pub cocoon_snapshot_dir: Option<PathBuf>,
}

impl PeerConfig {
    /// The tier's configuration (the token and CA files are read here); `root_dir` is cocoon's root.
    pub fn from_args(args: &PeerArgs, root_dir: &Path) -> Result<Self, String> {
        let token = match &args.peer_token_file {
            Some(path) => Some(PeerToken::from_file(path)?),
            None => None,
        };
        let ca = args.peer_ca_file.as_deref().map(tls::load_ca).transpose()?;
        let identity = match (&args.peer_tls_cert, &args.peer_tls_key) {
            (Some(cert), Some(key)) => PeerIdentity::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            (None, None) => PeerIdentity::KubeletServing,
            (Some(_), None) => {
                return Err("VK_PEER_TLS_CERT is set without VK_PEER_TLS_KEY, its private key (PEM)".into());
            }
            (None, Some(_)) => {
                return Err("VK_PEER_TLS_KEY is set without VK_PEER_TLS_CERT, its certificate (PEM chain)".into());
            }
        };
        // Both default under cocoon's root: the staging directory must share cocoon's filesystem.
        Ok(Self {
            listen: args.peer_addr,
            staging_dir: args.staging_dir.clone().unwrap_or_else(|| root_dir.join("vk-staging")),
            snapshot_dir: args
                .cocoon_snapshot_dir
                .clone()
                .unwrap_or_else(|| root_dir.join("snapshot/localfile")),
            token,
            ca,
            identity,
        })
    }

    /// What the tier needs and this node lacks; empty: it runs. The tier runs only over mutual
    /// TLS, with the token, and with a registry to check every copy against — never with less,
    /// and never over plain HTTP. `has_certificate`: this node has a certificate peers can verify
    /// (the kubelet API's self-signed one is none).
    pub fn missing(&self, has_registry: bool, has_certificate: bool) -> Vec<&'static str> {
        let mut missing = Vec::new();
        if self.token.is_none() {
            missing.push("VK_PEER_TOKEN_FILE");
        }
        if self.ca.is_none() {
            missing.push("VK_PEER_CA_FILE (the CA of the nodes' certificates)");
        }
        if !has_certificate {
            missing.push(
                "a certificate peers can verify (the kubelet API's is self-signed: set VK_PEER_TLS_CERT/VK_PEER_TLS_KEY)",
            );
        }
        if !has_registry {
            missing.push("a registry (OCI_REGISTRY)");
        }
        missing
    }

    /// Reads the variables (and `COCOON_ROOT_DIR`) through `lookup`, with the rules of the
    /// environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let root = crate::settings::parse_lookup::<crate::runtime::config::RootArgs>(&lookup)?;
        Self::from_args(&crate::settings::parse_lookup::<PeerArgs>(&lookup)?, &root.root_dir)
    }
}

/// `cocoon_vk_snapshot_peer_restore_total{result}` and its duration histogram.
#[derive(Clone)]
pub struct PeerMetrics {
    pub restore: IntCounterVec,
    pub restore_duration: Histogram,
}

impl PeerMetrics {
    fn build() -> prometheus::Result<Self> {
        Ok(Self {
            restore: IntCounterVec::new(
                Opts::new(
                    "snapshot_peer_restore_total",
                    "Snapshot restores from a peer node by result.",
                )
                .namespace("cocoon")
                .subsystem("vk"),
                &["result"],
            )?,
            restore_duration: Histogram::with_opts(
                HistogramOpts::new(
                    "snapshot_peer_restore_duration_seconds",
                    "Duration of successful snapshot restores from a peer node.",
                )
                .namespace("cocoon")
                .subsystem("vk")
                .buckets(vec![0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0]),
            )?,
        })
    }

    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self::build()?;
        registry.register(Box::new(m.restore.clone()))?;
        registry.register(Box::new(m.restore_duration.clone()))?;
        Ok(m)
    }

    /// Metrics nobody scrapes (tests).
    pub fn unregistered() -> Self {
        Self::build().expect("metric definitions are valid")
    }

    pub fn count(&self, result: &str) -> u64 {
        self.restore.with_label_values(&[result]).get()
    }
}

/// What a wake needs to use the peer tier.
pub struct PeerTier {
    pub client: PeerClient,
    pub nodes: Arc<dyn NodeAddresses>,
    /// The port peers listen on (this node's `VK_PEER_ADDR` port: one setting for the fleet).
    pub port: u16,
    pub metrics: PeerMetrics,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_tls_material_the_tier_is_off() {
        let none = PeerConfig::from_lookup(|_| None).unwrap();
        assert_eq!(
            none.missing(true, true).len(),
            2,
            "no token, no CA: {:?}",
            none.missing(true, true)
        );
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "a-long-enough-peer-token\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        let ca = dir.path().join("ca.crt");
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        std::fs::write(&ca, params.self_signed(&key).unwrap().pem()).unwrap();
        let vars = |with_ca: bool| {
            let (token, ca) = (token.display().to_string(), ca.display().to_string());
            move |k: &str| match k {
                "VK_PEER_TOKEN_FILE" => Some(token.clone()),
                "VK_PEER_CA_FILE" if with_ca => Some(ca.clone()),
                _ => None,
            }
        };
        // The token alone (what ran the tier before, over plain HTTP) is not enough.
        let token_only = PeerConfig::from_lookup(vars(false)).unwrap();
        let missing = token_only.missing(true, true);
        assert!(
            missing.len() == 1 && missing[0].contains("VK_PEER_CA_FILE"),
            "{missing:?}"
        );
        let all = PeerConfig::from_lookup(vars(true)).unwrap();
        assert!(all.missing(true, true).is_empty());
        // A self-signed kubelet certificate, or no registry to check copies against.
        assert!(all.missing(true, false)[0].contains("VK_PEER_TLS_CERT"));
        assert!(all.missing(false, true)[0].contains("OCI_REGISTRY"));
    }

    #[test]
    fn configuration_defaults_and_errors() {
        let c = PeerConfig::from_lookup(|_| None).unwrap();
        assert_eq!(c.listen.to_string(), "0.0.0.0:12501");
        assert_eq!(c.staging_dir, PathBuf::from("/var/lib/cocoon/vk-staging"));
        assert_eq!(c.snapshot_dir, PathBuf::from("/var/lib/cocoon/snapshot/localfile"));
        assert!(c.token.is_none());
        assert!(c.ca.is_none(), "no CA: the tier is off");
        assert_eq!(c.identity, PeerIdentity::KubeletServing);
        let c = PeerConfig::from_lookup(|k| (k == "COCOON_ROOT_DIR").then(|| "/srv/cocoon".to_string())).unwrap();
        assert_eq!(c.staging_dir, PathBuf::from("/srv/cocoon/vk-staging"));
        assert_eq!(c.snapshot_dir, PathBuf::from("/srv/cocoon/snapshot/localfile"));
        let err = PeerConfig::from_lookup(|k| (k == "VK_PEER_ADDR").then(|| "twelve".to_string())).unwrap_err();
        assert!(err.contains("VK_PEER_ADDR"), "{err}");
        let err = PeerConfig::from_lookup(|k| (k == "VK_PEER_TOKEN_FILE").then(|| "/nonexistent/token".to_string()))
            .unwrap_err();
        assert!(err.contains("VK_PEER_TOKEN_FILE"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "a-long-enough-peer-token\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = PeerConfig::from_lookup(|k| match k {
            "VK_PEER_TOKEN_FILE" => Some(token.display().to_string()),
            "VK_PEER_ADDR" => Some("127.0.0.1:4000".into()),
            "VK_STAGING_DIR" => Some("/srv/staging".into()),
            _ => None,
        })
        .unwrap();
        assert!(c.token.unwrap().admits(Some("Bearer a-long-enough-peer-token")));
        assert_eq!(c.listen.to_string(), "127.0.0.1:4000");
        assert_eq!(c.staging_dir, PathBuf::from("/srv/staging"));
        for (set, missing) in [
            ("VK_PEER_TLS_CERT", "VK_PEER_TLS_KEY"),
            ("VK_PEER_TLS_KEY", "VK_PEER_TLS_CERT"),
        ] {
            let err = PeerConfig::from_lookup(|k| (k == set).then(|| "/etc/peer.pem".to_string())).unwrap_err();
            assert!(err.contains(missing), "{err}");
        }
        let err = PeerConfig::from_lookup(|k| (k == "VK_PEER_CA_FILE").then(|| "/nonexistent/ca.crt".to_string()))
            .unwrap_err();
        assert!(err.contains("VK_PEER_CA_FILE"), "{err}");
        let c = PeerConfig::from_lookup(|k| match k {
            "VK_PEER_TLS_CERT" => Some("/etc/peer.crt".into()),
            "VK_PEER_TLS_KEY" => Some("/etc/peer.key".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(
            c.identity,
            PeerIdentity::Files {
                cert: "/etc/peer.crt".into(),
                key: "/etc/peer.key".into()
            }
        );
    }
}
