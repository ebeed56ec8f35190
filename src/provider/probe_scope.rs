//! `VK_PROBE_NETWORKS`: the networks readiness probes may reach. A probe target comes from the
//! VM's NIC, cocoon-net's lease file or — for an unmanaged pod — the operator-written
//! `vm.cocoonstack.io/ip` annotation, so without a scope anyone who can bind a pod to the node
//! could make the daemon ping or TCP-connect any address it can route to (and read the answer
//! off the pod's Ready condition). With the variable set, a target outside every listed network
//! is not contacted at all: the probe fails with a message naming the address and the setting,
//! logged once per address. Unset (the default) probes whatever the guest's address is.
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

use super::probe::Prober;

pub const ENV: &str = "VK_PROBE_NETWORKS";

/// The probes' scope.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Provider")]
pub struct ProbeArgs {
    /// The only networks readiness probes (and port-forward) may reach: CIDRs or addresses, comma-separated (unset: any address)
    #[arg(long, env = ENV, value_name = "NETWORKS",
          value_parser = crate::settings::parser(ENV, "CIDRs such as 10.88.0.0/16 or addresses, comma-separated", |v| {
              ProbeNetworks::parse(v)?.ok_or_else(|| "no network".to_string())
          }))]
    pub probe_networks: Option<ProbeNetworks>,
}

/// A list of networks (CIDRs; a bare address is its own /32 or /128).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeNetworks(Vec<IpNet>);

impl ProbeNetworks {
    /// Parses a comma- or whitespace-separated list; `Ok(None)` for an empty value (no scope).
    pub fn parse(value: &str) -> Result<Option<Self>, String> {
        let nets = value
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<IpNet>()
                    .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
                    .map(|n| n.trunc())
                    .map_err(|_| format!("{s:?} is not a network (CIDR such as 10.88.0.0/16) or an address"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((!nets.is_empty()).then_some(Self(nets)))
    }

    /// Reads [`ENV`] through `lookup`, with the rules of the environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<Self>, String> {
        Ok(crate::settings::parse_lookup::<ProbeArgs>(lookup)?.probe_networks)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        // An IPv4-mapped IPv6 address reaches the IPv4 host: judge it as that host.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.0.iter().any(|n| n.contains(&ip))
    }
}

impl fmt::Display for ProbeNetworks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list: Vec<String> = self.0.iter().map(IpNet::to_string).collect();
        f.write_str(&list.join(", "))
    }
}

/// A [`Prober`] that contacts only targets inside its networks.
pub struct ScopedProber {
    inner: Arc<dyn Prober>,
    networks: ProbeNetworks,
    /// Addresses already reported, so an agent retrying every second logs its refusal once.
    reported: Mutex<HashSet<IpAddr>>,
}

impl ScopedProber {
    pub fn new(inner: Arc<dyn Prober>, networks: ProbeNetworks) -> Self {
        Self {
            inner,
            networks,
            reported: Mutex::new(HashSet::new()),
        }
    }

    fn admit(&self, ip: IpAddr) -> Result<(), String> {
        if self.networks.contains(ip) {
            return Ok(());
        }
        let message = format!(
            "{ip} is outside {ENV} ({}): not probed; add the guests' network to {ENV}",
            self.networks
        );
        if self.reported.lock().expect("reported probe refusals").insert(ip) {
            tracing::warn!(target_ip = %ip, networks = %self.networks, "probe refused: {message}");
        }
        Err(message)
    }
}

#[async_trait]
impl Prober for ScopedProber {
    async fn tcp(&self, addr: SocketAddr, timeout: Duration) -> Result<(), String> {
        self.admit(addr.ip())?;
        self.inner.tcp(addr, timeout).await
    }

    async fn ping(&self, ip: Ipv4Addr, timeout: Duration) -> Result<(), String> {
        self.admit(IpAddr::V4(ip))?;
        self.inner.ping(ip, timeout).await
    }

    async fn banner(&self, addr: SocketAddr, prefix: &str, timeout: Duration) -> Result<(), String> {
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
        async fn tcp(&self, _: SocketAddr, _: Duration) -> Result<(), String> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        async fn ping(&self, _: Ipv4Addr, _: Duration) -> Result<(), String> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        async fn banner(&self, _: SocketAddr, _: &str, _: Duration) -> Result<(), String> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
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
            e.contains("VK_PROBE_NETWORKS=\"127.0.0.0/8,lan\"") && e.contains("\"lan\""),
            "{e}"
        );
        assert!(ProbeNetworks::parse("10.0.0.0/33").is_err());
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
            e.starts_with("10.1.2.3 is outside VK_PROBE_NETWORKS (127.0.0.0/8)"),
            "{e}"
        );
        let e = scoped.tcp("192.168.1.1:6379".parse().unwrap(), t).await.unwrap_err();
        assert!(e.starts_with("192.168.1.1 is outside"), "{e}");
        assert_eq!(inner.0.load(Ordering::SeqCst), 2, "refused targets are not probed");
    }
}
