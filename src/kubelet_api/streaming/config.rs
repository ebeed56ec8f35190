//! Settings of the streaming endpoints ([`StreamingArgs`]), with the kubelet's defaults.

use std::time::Duration;

use crate::settings::{self, parse_duration, parser};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamingConfig {
    /// `VK_STREAMING_IDLE_TIMEOUT` (the kubelet's `streamingConnectionIdleTimeout`, 4h): a
    /// session with no traffic either way for this long is closed.
    pub idle_timeout: Duration,
    /// `VK_STREAMING_CREATION_TIMEOUT` (the kubelet's stream creation timeout, 30s): how long a
    /// client has to open the streams it asked for after the upgrade.
    pub creation_timeout: Duration,
    /// `VK_STREAMING_MAX_SESSIONS` (default 64): exec, attach and port-forward sessions open at
    /// once on this node; more are refused with 429.
    pub max_sessions: usize,
    /// `VK_STREAMING_MAX_SESSIONS_PER_POD` (default 16, a quarter of the node's): sessions
    /// with one pod at once, whoever asks (through the apiserver every tenant's sessions arrive
    /// under its one identity, so the pod is what tells them apart).
    pub max_sessions_per_pod: usize,
    /// `VK_STREAMING_MAX_SESSIONS_PER_CALLER` (default 16): sessions of one caller that
    /// authenticates with a bearer token (a client certificate, the apiserver's, has no share).
    pub max_sessions_per_caller: usize,
    /// `VK_STREAMING_MAX_PORTFORWARD_STREAMS` (default 256): connections one port-forward
    /// session may have open at once.
    pub max_forwarded_connections: usize,
}

impl Default for StreamingConfig {
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_secs(4 * 3600),
            creation_timeout: Duration::from_secs(30),
            max_sessions: 64,
            max_sessions_per_pod: 16,
            max_sessions_per_caller: 16,
            max_forwarded_connections: 256,
        }
    }
}

/// kubectl exec / attach / port-forward sessions (`src/kubelet_api/README.md`, "exec, attach and
/// port-forward").
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Streaming (exec, attach, port-forward)")]
pub struct StreamingArgs {
    /// A session with no traffic either way for this long is closed
    #[arg(long, env = "VK_STREAMING_IDLE_TIMEOUT", value_name = "DURATION", default_value = "4h",
          value_parser = parser("VK_STREAMING_IDLE_TIMEOUT", DURATION_RULE, nonzero_duration))]
    pub streaming_idle_timeout: Duration,
    /// How long a client has to open the streams it asked for after the upgrade
    #[arg(long, env = "VK_STREAMING_CREATION_TIMEOUT", value_name = "DURATION", default_value = "30s",
          value_parser = parser("VK_STREAMING_CREATION_TIMEOUT", DURATION_RULE, nonzero_duration))]
    pub streaming_creation_timeout: Duration,
    /// Sessions open at once on the node; more are refused with 429
    #[arg(long, env = "VK_STREAMING_MAX_SESSIONS", value_name = "COUNT", default_value_t = 64,
          value_parser = parser("VK_STREAMING_MAX_SESSIONS", "a number of at least 1", settings::positive::<usize>))]
    pub streaming_max_sessions: usize,
    /// Sessions with one pod at once (its share of the node's)
    #[arg(long, env = "VK_STREAMING_MAX_SESSIONS_PER_POD", value_name = "COUNT", default_value_t = 16,
          value_parser = parser("VK_STREAMING_MAX_SESSIONS_PER_POD", "a number of at least 1", settings::positive::<usize>))]
    pub streaming_max_sessions_per_pod: usize,
    /// Sessions of one bearer-token caller at once (client certificates have no share)
    #[arg(long, env = "VK_STREAMING_MAX_SESSIONS_PER_CALLER", value_name = "COUNT", default_value_t = 16,
          value_parser = parser("VK_STREAMING_MAX_SESSIONS_PER_CALLER", "a number of at least 1", settings::positive::<usize>))]
    pub streaming_max_sessions_per_caller: usize,
    /// Connections one port-forward session may hold
    #[arg(long, env = "VK_STREAMING_MAX_PORTFORWARD_STREAMS", value_name = "COUNT", default_value_t = 256,
          value_parser = parser("VK_STREAMING_MAX_PORTFORWARD_STREAMS", "a number of at least 1", settings::positive::<usize>))]
    pub streaming_max_portforward_streams: usize,
}

const DURATION_RULE: &str = "a duration such as 4h, 30s or 1h30m";

fn nonzero_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err("must be more than 0".into()),
        d => Ok(d),
    }
}

impl StreamingConfig {
    pub fn from_args(args: &StreamingArgs) -> Self {
        Self {
            idle_timeout: args.streaming_idle_timeout,
            creation_timeout: args.streaming_creation_timeout,
            max_sessions: args.streaming_max_sessions,
            max_sessions_per_pod: args.streaming_max_sessions_per_pod,
            max_sessions_per_caller: args.streaming_max_sessions_per_caller,
            max_forwarded_connections: args.streaming_max_portforward_streams,
        }
    }

    /// Reads the variables through `lookup`, with the rules of the environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        Ok(Self::from_args(&settings::parse_lookup::<StreamingArgs>(lookup)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<StreamingConfig, String> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        StreamingConfig::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_are_the_kubelets_and_mistakes_name_the_variable() {
        let c = cfg(&[]).unwrap();
        assert_eq!(
            (c.idle_timeout, c.creation_timeout),
            (Duration::from_secs(4 * 3600), Duration::from_secs(30))
        );
        let c = cfg(&[
            ("VK_STREAMING_IDLE_TIMEOUT", "5m"),
            ("VK_STREAMING_CREATION_TIMEOUT", "2s"),
            ("VK_STREAMING_MAX_SESSIONS", "3"),
            ("VK_STREAMING_MAX_PORTFORWARD_STREAMS", "9"),
            ("VK_STREAMING_MAX_SESSIONS_PER_POD", "2"),
            ("VK_STREAMING_MAX_SESSIONS_PER_CALLER", "4"),
        ])
        .unwrap();
        assert_eq!((c.max_sessions_per_pod, c.max_sessions_per_caller), (2, 4));
        assert_eq!(
            (
                c.idle_timeout,
                c.creation_timeout,
                c.max_sessions,
                c.max_forwarded_connections
            ),
            (Duration::from_secs(300), Duration::from_secs(2), 3, 9)
        );
        for (var, value) in [
            ("VK_STREAMING_IDLE_TIMEOUT", "soon"),
            ("VK_STREAMING_IDLE_TIMEOUT", "0s"),
            ("VK_STREAMING_CREATION_TIMEOUT", "10"),
            ("VK_STREAMING_MAX_SESSIONS", "0"),
            ("VK_STREAMING_MAX_PORTFORWARD_STREAMS", "many"),
            ("VK_STREAMING_MAX_SESSIONS_PER_POD", "0"),
            ("VK_STREAMING_MAX_SESSIONS_PER_CALLER", "-1"),
        ] {
            let e = cfg(&[(var, value)]).unwrap_err();
            assert!(e.contains(&format!("{var}={value:?}")), "{e}");
        }
    }
}
