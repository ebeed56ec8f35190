//! The listeners' settings: the deadlines every listener shares and each listener's connection
//! cap.

use std::time::Duration;

use super::Limits;
use crate::settings::parse_duration;
use crate::settings::{self, parser};

/// A client has this long from connecting to its request's complete headers (hyper's own
/// default, which it applies only with a timer).
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// A connection without a request in flight this long is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(90);

const DURATION_RULE: &str = "a duration such as 30s, 2m or 1m30s (more than 0)";

fn nonzero_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err("must be more than 0".into()),
        d => Ok(d),
    }
}

/// Which listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    KubeletApi,
    Metrics,
    Peer,
}

/// Deadlines and connection caps of the kubelet API, `/metrics` and the peer listener.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Listeners (kubelet API, metrics, peer)")]
pub struct ListenerArgs {
    /// From connecting to a request's complete headers (and between two HTTP/1.1 requests)
    #[arg(long, env = "VK_LISTENER_HEADER_TIMEOUT", value_name = "DURATION", default_value = "30s",
          value_parser = parser("VK_LISTENER_HEADER_TIMEOUT", DURATION_RULE, nonzero_duration))]
    pub listener_header_timeout: Duration,
    /// A connection without a request in flight this long is closed
    #[arg(long, env = "VK_LISTENER_IDLE_TIMEOUT", value_name = "DURATION", default_value = "90s",
          value_parser = parser("VK_LISTENER_IDLE_TIMEOUT", DURATION_RULE, nonzero_duration))]
    pub listener_idle_timeout: Duration,
    /// Connections the kubelet API holds at once (streaming sessions included); more are closed at once
    #[arg(long, env = "VK_KUBELET_MAX_CONNECTIONS", value_name = "COUNT", default_value_t = 1024,
          value_parser = parser("VK_KUBELET_MAX_CONNECTIONS", "a number of at least 1", settings::positive::<usize>))]
    pub kubelet_max_connections: usize,
    /// Connections the /metrics listener holds at once; more are closed at once
    #[arg(long, env = "VK_METRICS_MAX_CONNECTIONS", value_name = "COUNT", default_value_t = 64,
          value_parser = parser("VK_METRICS_MAX_CONNECTIONS", "a number of at least 1", settings::positive::<usize>))]
    pub metrics_max_connections: usize,
    /// Connections the peer snapshot listener holds at once; more are closed at once
    #[arg(long, env = "VK_PEER_MAX_CONNECTIONS", value_name = "COUNT", default_value_t = 256,
          value_parser = parser("VK_PEER_MAX_CONNECTIONS", "a number of at least 1", settings::positive::<usize>))]
    pub peer_max_connections: usize,
}

impl ListenerArgs {
    /// The limits of `which` listener.
    pub fn limits(&self, which: Which) -> Limits {
        let cap = match which {
            Which::KubeletApi => self.kubelet_max_connections,
            Which::Metrics => self.metrics_max_connections,
            Which::Peer => self.peer_max_connections,
        };
        Limits {
            header_timeout: self.listener_header_timeout,
            idle_timeout: self.listener_idle_timeout,
            ..Limits::with_cap(cap)
        }
    }

    /// Reads the variables through `lookup`, with the rules of the environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        settings::parse_lookup::<ListenerArgs>(lookup).map_err(String::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_refusals() {
        let args = ListenerArgs::from_lookup(|_| None).unwrap();
        let kubelet = args.limits(Which::KubeletApi);
        assert_eq!(kubelet, Limits::with_cap(1024));
        assert_eq!(kubelet.header_timeout, Duration::from_secs(30));
        assert_eq!(kubelet.idle_timeout, Duration::from_secs(90));
        assert_eq!(args.limits(Which::Metrics).max_connections, 64);
        assert_eq!(args.limits(Which::Peer).max_connections, 256);
        let args = ListenerArgs::from_lookup(|k| match k {
            "VK_LISTENER_HEADER_TIMEOUT" => Some("5s".into()),
            "VK_PEER_MAX_CONNECTIONS" => Some("8".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(args.limits(Which::Peer).header_timeout, Duration::from_secs(5));
        assert_eq!(args.limits(Which::Peer).max_connections, 8);
        let error = ListenerArgs::from_lookup(|k| (k == "VK_LISTENER_IDLE_TIMEOUT").then(|| "0s".into())).unwrap_err();
        assert!(error.contains("VK_LISTENER_IDLE_TIMEOUT"), "{error}");
        let error = ListenerArgs::from_lookup(|k| (k == "VK_METRICS_MAX_CONNECTIONS").then(|| "0".into())).unwrap_err();
        assert!(error.contains("VK_METRICS_MAX_CONNECTIONS"), "{error}");
    }
}
