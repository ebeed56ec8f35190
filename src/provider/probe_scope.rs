//! The guest networks: where readiness probes and port-forward may connect. A target comes from
//! the VM's NIC, cocoon-net's lease file or — for an unmanaged pod — the operator-written
//! `vm.cocoonstack.io/ip` annotation, so without a scope anyone who can bind a pod to the node
//! could make the daemon ping, TCP-connect or port-forward to any address it can route to: the
//! node's own loopback services, a cloud metadata endpoint, the LAN ([`GuestNetworks`]).
//!
//! `VK_PROBE_NETWORKS` lists them; a target outside every listed network is not contacted at
//! all: the probe fails with a message naming the address and the setting, logged once per
//! address ([`ScopedProber`]). Unset, they are derived: a managed pod's address is the one cocoon
//! or cocoon-net gave its VM (in the guest networks by construction), an unmanaged pod's
//! operator-written one must lie in cocoon-net's pool subnet (`pool.json` beside its lease
//! file), and a special-purpose address (loopback, link-local — the metadata endpoint —,
//! unspecified, multicast, broadcast) is never a guest's.
//!
//! The test suite sets it to loopback for the `vk-cocoon run` processes it starts, so a test can
//! never make the daemon send a probe off the machine.

use std::collections::HashSet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ipnet::IpNet;

use super::plan::NetworkMode;
use super::probe::{ProbeError, Prober};

pub const ENV: &str = "VK_PROBE_NETWORKS";

/// The probes' scope.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Provider")]
pub struct ProbeArgs {
    /// The only networks readiness probes (and port-forward) may reach: CIDRs or addresses, comma-separated (unset: any address)
    #[arg(long, env = ENV, value_name = "NETWORKS",
          value_parser = crate::settings::parser(ENV, "CIDRs such as 10.88.0.0/16 or addresses, comma-separated", |v| {
              ProbeNetworks::parse(v).map_err(|e| e.to_string())?.ok_or_else(|| "no network".to_string())
          }))]
    pub probe_networks: Option<ProbeNetworks>,
}

/// An entry of a network list that is neither a CIDR nor an address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{entry:?} is not a network (CIDR such as 10.88.0.0/16) or an address")]
pub struct NotANetwork {
    pub entry: String,
    #[source]
    pub source: std::net::AddrParseError,
}

/// Why the node may not connect to an address: it is no guest's. Each says which rule refused
/// it and how the operator lets it through.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutsideGuestNetworks {
    #[error("its address {ip} is outside {ENV} ({networks}); add the guests' network to {ENV}")]
    NotListed { ip: IpAddr, networks: ProbeNetworks },
    #[error(
        "its address {ip} is a special-purpose address (loopback, link-local, multicast, broadcast or unspecified), never a guest's; list it in {ENV} if the node must reach it"
    )]
    SpecialPurpose { ip: IpAddr },
    #[error(
        "its pre-assigned address {ip} is outside the guest networks ({}); list the network in {ENV}",
        pool_text(pool)
    )]
    OutsidePool { ip: IpAddr, pool: Option<IpNet> },
}

fn pool_text(pool: &Option<IpNet>) -> String {
    pool.map_or_else(
        || "no cocoon-net pool subnet was found".to_string(),
        |p| format!("cocoon-net's pool {p}"),
    )
}

/// A list of networks (CIDRs; a bare address is its own /32 or /128).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeNetworks(Vec<IpNet>);

impl ProbeNetworks {
    /// Parses a comma- or whitespace-separated list; `Ok(None)` for an empty value (no scope).
    pub fn parse(value: &str) -> Result<Option<Self>, NotANetwork> {
        let nets = value
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map(|n| n.trunc())
                    .map_err(|source| NotANetwork {
                        entry: s.to_string(),
                        source,
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((!nets.is_empty()).then_some(Self(nets)))
    }

    /// Reads [`ENV`] through `lookup`, with the rules of the environment.
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, crate::settings::SettingsError> {
        Ok(crate::settings::parse_lookup::<ProbeArgs>(lookup)?.probe_networks)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = unmapped(ip);
        self.0.iter().any(|n| n.contains(&ip))
    }
}

impl fmt::Display for ProbeNetworks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<String> = self.0.iter().map(IpNet::to_string).collect();
        f.write_str(&list.join(", "))
    }
}

/// The networks guests live on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestNetworks {
    /// `VK_PROBE_NETWORKS`: these, and nothing else.
    Listed(ProbeNetworks),
    /// Unset: derived; `pool` is cocoon-net's pool subnet when its `pool.json` could be read.
    Derived { pool: Option<IpNet> },
}

impl GuestNetworks {
    /// The listed networks, or the ones derived from cocoon-net's state beside `leases_path`.
    pub fn from_settings(listed: Option<ProbeNetworks>, leases_path: &std::path::Path) -> Self {
        match listed {
            Some(networks) => Self::Listed(networks),
            None => {
                let pool_file = leases_path.with_file_name("pool.json");
                let pool = read_pool_subnet(&pool_file);
                match &pool {
                    Some(subnet) => {
                        tracing::info!(%subnet, file = %pool_file.display(), "guest networks: cocoon-net's pool subnet and the addresses cocoon assigns (VK_PROBE_NETWORKS is unset)")
                    }
                    None => {
                        tracing::info!(file = %pool_file.display(), "guest networks: the addresses cocoon and cocoon-net assign (no cocoon-net pool subnet found; an unmanaged pod's address needs VK_PROBE_NETWORKS)")
                    }
                }
                Self::Derived { pool }
            }
        }
    }

    /// May the node connect to `ip`? `assigned` says the address came from cocoon or cocoon-net
    /// (a managed VM's NIC or lease), not from an annotation.
    pub fn admit(&self, ip: IpAddr, assigned: bool) -> Result<(), OutsideGuestNetworks> {
        let ip = unmapped(ip);
        match self {
            Self::Listed(networks) if networks.contains(ip) => Ok(()),
            Self::Listed(networks) => Err(OutsideGuestNetworks::NotListed {
                ip,
                networks: networks.clone(),
            }),
            Self::Derived { .. } if special_purpose(ip) => Err(OutsideGuestNetworks::SpecialPurpose { ip }),
            Self::Derived { .. } if assigned => Ok(()),
            Self::Derived { pool: Some(pool) } if pool.contains(&ip) => Ok(()),
            Self::Derived { pool } => Err(OutsideGuestNetworks::OutsidePool { ip, pool: *pool }),
        }
    }
}

/// The guests' DHCP family: the setting, or when unset the family of cocoon-net's pool subnet
/// (its `pool.json` beside the lease file); IPv4 when there is no readable pool.
pub fn network_mode(setting: Option<NetworkMode>, leases_path: &std::path::Path) -> NetworkMode {
    setting.unwrap_or_else(|| match read_pool_subnet(&leases_path.with_file_name("pool.json")) {
        Some(IpNet::V6(subnet)) => {
            tracing::info!(%subnet, "guest network mode: ipv6-only (cocoon-net's pool is IPv6; VK_NETWORK_MODE is unset)");
            NetworkMode::Ipv6Only
        }
        _ => NetworkMode::Ipv4,
    })
}

/// An IPv4-mapped IPv6 address reaches the IPv4 host: judged as that host.
fn unmapped(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn special_purpose(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback() || v4.is_link_local() || v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast()
        }
        IpAddr::V6(v6) => v6.is_loopback() || v6.is_unspecified() || v6.is_multicast() || v6.is_unicast_link_local(),
    }
}

/// The `subnet` of cocoon-net's `pool.json`.
fn read_pool_subnet(path: &std::path::Path) -> Option<IpNet> {
    let text = std::fs::read(path).ok()?;
    let value: serde_json::Value = serde_json::from_slice(&text)
        .map_err(|e| tracing::warn!(file = %path.display(), error = %e, "cocoon-net's pool.json is not JSON"))
        .ok()?;
    value.get("subnet")?.as_str()?.parse::<IpNet>().ok().map(|n| n.trunc())
}

/// The addresses a probe was refused for, each logged once: a probe agent retries every
/// second, and its pod's Ready condition already carries the reason.
#[derive(Debug, Default)]
pub struct RefusedTargets(Mutex<HashSet<String>>);

impl RefusedTargets {
    /// Logs the refusal of `target` (`why`) the first time it is seen.
    pub fn report(&self, target: &str, why: &str) {
        if self.0.lock().expect("refused probe targets").insert(target.to_string()) {
            tracing::warn!(target_ip = %target, "probe refused: {why}");
        }
    }
}

/// A [`Prober`] that contacts only targets inside its networks.
pub struct ScopedProber {
    inner: Arc<dyn Prober>,
    networks: ProbeNetworks,
    reported: RefusedTargets,
}

impl ScopedProber {
    pub fn new(inner: Arc<dyn Prober>, networks: ProbeNetworks) -> Self {
        Self {
            inner,
            networks,
            reported: RefusedTargets::default(),
        }
    }

    fn admit(&self, ip: IpAddr) -> Result<(), ProbeError> {
        if self.networks.contains(ip) {
            return Ok(());
        }
        let refusal = ProbeError::OutOfScope {
            ip,
            setting: ENV,
            networks: self.networks.to_string(),
        };
        self.reported.report(&ip.to_string(), &refusal.to_string());
        Err(refusal)
    }
}

#[async_trait]
impl Prober for ScopedProber {
    async fn tcp(&self, addr: SocketAddr, timeout: Duration) -> Result<(), ProbeError> {
        self.admit(addr.ip())?;
        self.inner.tcp(addr, timeout).await
    }

    async fn ping(&self, ip: Ipv4Addr, timeout: Duration) -> Result<(), ProbeError> {
        self.admit(IpAddr::V4(ip))?;
        self.inner.ping(ip, timeout).await
    }

    async fn banner(&self, addr: SocketAddr, prefix: &str, timeout: Duration) -> Result<(), ProbeError> {
        self.admit(addr.ip())?;
        self.inner.banner(addr, prefix, timeout).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Counting(AtomicUsize);

    #[async_trait]
    impl Prober for Counting {
        async fn tcp(&self, _: SocketAddr, _: Duration) -> Result<(), ProbeError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        async fn ping(&self, _: Ipv4Addr, _: Duration) -> Result<(), ProbeError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        async fn banner(&self, _: SocketAddr, _: &str, _: Duration) -> Result<(), ProbeError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[test]
    fn the_network_mode_is_the_setting_or_the_family_of_the_pool() {
        let dir = tempfile::tempdir().unwrap();
        let leases = dir.path().join("leases.json");
        assert_eq!(network_mode(None, &leases), NetworkMode::Ipv4, "no pool.json");
        std::fs::write(dir.path().join("pool.json"), r#"{"subnet":"fd00:22::/64"}"#).unwrap();
        assert_eq!(network_mode(None, &leases), NetworkMode::Ipv6Only);
        assert_eq!(network_mode(Some(NetworkMode::Ipv4), &leases), NetworkMode::Ipv4);
        std::fs::write(dir.path().join("pool.json"), r#"{"subnet":"172.22.0.0/16"}"#).unwrap();
        assert_eq!(network_mode(None, &leases), NetworkMode::Ipv4);
    }

    #[test]
    fn parses_cidrs_and_bare_addresses_and_refuses_junk() {
        let n = ProbeNetworks::parse("127.0.0.0/8, ::1 10.88.7.9/16").unwrap().unwrap();
        assert_eq!(n.to_string(), "127.0.0.0/8, ::1/128, 10.88.0.0/16");
        assert!(n.contains("127.88.0.2".parse().unwrap()));
        assert!(n.contains("::1".parse().unwrap()));
        assert!(n.contains("::ffff:127.0.0.1".parse().unwrap()), "IPv4-mapped");
        assert!(n.contains("10.88.200.1".parse().unwrap()));
        assert!(!n.contains("10.89.0.1".parse().unwrap()));
        assert!(!n.contains("::2".parse().unwrap()));
        assert_eq!(ProbeNetworks::parse(" , ").unwrap(), None, "empty = unscoped");
        let e = ProbeNetworks::from_lookup(|k| (k == ENV).then(|| "127.0.0.0/8,lan".to_string())).unwrap_err();
        assert!(
            e.to_string().contains("VK_PROBE_NETWORKS=\"127.0.0.0/8,lan\"") && e.to_string().contains("\"lan\""),
            "{e}"
        );
        assert!(ProbeNetworks::parse("10.0.0.0/33").is_err());
    }

    #[test]
    fn derived_guest_networks_admit_what_cocoon_assigned_and_nothing_special() {
        let dir = tempfile::tempdir().unwrap();
        let leases = dir.path().join("leases.json");
        let none = GuestNetworks::from_settings(None, &leases);
        assert_eq!(none, GuestNetworks::Derived { pool: None });
        std::fs::write(
            dir.path().join("pool.json"),
            r#"{"platform":"gke","subnet":"172.20.100.7/24","gateway":"172.20.100.1"}"#,
        )
        .unwrap();
        let derived = GuestNetworks::from_settings(None, &leases);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // An address cocoon or cocoon-net assigned: a guest's.
        assert_eq!(derived.admit(ip("10.88.0.12"), true), Ok(()));
        // An operator-written one: only inside the pool.
        assert_eq!(derived.admit(ip("172.20.100.40"), false), Ok(()));
        let e = derived.admit(ip("10.1.2.3"), false).unwrap_err();
        assert!(
            e.to_string()
                .contains("outside the guest networks (cocoon-net's pool 172.20.100.0/24)"),
            "{e}"
        );
        // Never the node itself, the metadata endpoint, multicast...
        for special in [
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            let e = derived.admit(ip(special), true).unwrap_err();
            assert!(e.to_string().contains("special-purpose"), "{special}: {e}");
        }
        // Listed: exactly the list, whoever assigned the address.
        let listed = GuestNetworks::from_settings(ProbeNetworks::parse("127.0.0.0/8").unwrap(), &leases);
        assert_eq!(listed.admit(ip("127.0.0.1"), false), Ok(()));
        assert!(
            listed
                .admit(ip("10.88.0.12"), true)
                .unwrap_err()
                .to_string()
                .contains("outside VK_PROBE_NETWORKS")
        );
    }

    #[tokio::test]
    async fn a_target_outside_the_networks_is_never_contacted() {
        let inner = Arc::new(Counting::default());
        let scoped = ScopedProber::new(inner.clone(), ProbeNetworks::parse("127.0.0.0/8").unwrap().unwrap());
        let t = Duration::from_secs(1);
        scoped.ping("127.1.2.3".parse().unwrap(), t).await.unwrap();
        scoped.tcp("127.0.0.1:22".parse().unwrap(), t).await.unwrap();
        assert_eq!(inner.0.load(Ordering::SeqCst), 2);

        let e = scoped.ping("10.1.2.3".parse().unwrap(), t).await.unwrap_err();
        assert!(
            e.to_string()
                .starts_with("10.1.2.3 is outside VK_PROBE_NETWORKS (127.0.0.0/8)"),
            "{e}"
        );
        let e = scoped.tcp("192.168.1.1:6379".parse().unwrap(), t).await.unwrap_err();
        assert!(e.to_string().starts_with("192.168.1.1 is outside"), "{e}");
        assert_eq!(inner.0.load(Ordering::SeqCst), 2, "refused targets are not probed");
    }
}
