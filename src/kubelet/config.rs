//! The virtual node's configuration: environment parsing and validation (pure), plus the
//! controller timings (not from the environment; tests inject short ones).

use super::quantity::Quantity;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

/// A configuration value that cannot be used. The message names the variable, the value and what
/// is accepted, so the operator can fix the unit's environment file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {variable}={value:?}: {problem}; accepted: {accepted}")]
pub struct ConfigError {
    pub variable: &'static str,
    pub value: String,
    pub problem: String,
    pub accepted: &'static str,
}

/// `VK_NODE_*` resource overrides (each replaces the measured value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceOverrides {
    pub cpu: Option<Quantity>,
    pub memory: Option<Quantity>,
    pub storage: Option<Quantity>,
    pub hugepages: Option<Quantity>,
}

/// Intervals and bounds of the node, lease and pod controllers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timings {
    /// `spec.leaseDurationSeconds` of the node Lease (virtual-kubelet: 40 s).
    pub lease_duration: Duration,
    /// How often the Lease is renewed (virtual-kubelet: 0.25 × duration = 10 s).
    pub lease_renew: Duration,
    /// How often the node status (conditions' heartbeat) is refreshed (1 min).
    pub node_status: Duration,
    /// First retry delay of a failed pod operation / API write; doubles per failure.
    pub retry_base: Duration,
    /// Retry delay cap.
    pub retry_max: Duration,
    /// Pod watch reconnect backoff (kube-runtime's default: 800 ms → 30 s).
    pub watch_backoff_min: Duration,
    pub watch_backoff_max: Duration,
    /// Concurrent pod operations across all pods (each pod is serialised on its own).
    pub workers: usize,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(40),
            lease_renew: Duration::from_secs(10),
            node_status: Duration::from_secs(60),
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            watch_backoff_min: Duration::from_millis(800),
            watch_backoff_max: Duration::from_secs(30),
            workers: std::thread::available_parallelism().map_or(4, |n| n.get().max(2)),
        }
    }
}

/// Everything the virtual node needs to know about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletConfig {
    /// `VK_NODE_NAME` (default `cocoon-pool`).
    pub node_name: String,
    /// `VK_NODE_POOL` (default `default`) → label `cocoonstack.io/pool`.
    pub node_pool: String,
    /// `VK_SNAPSHOT_CPU_CLASS` → label `cocoonstack.io/snapshot-cpu-class` (removed when unset).
    pub snapshot_cpu_class: Option<String>,
    /// `VK_PROVIDER_ID` → `spec.providerID`.
    pub provider_id: Option<String>,
    /// `VK_NODE_HOSTNAME` (default: the node name): the node's `Hostname` address, which the
    /// apiserver dials first to reach the kubelet API (the kubelet's `--hostname-override`).
    pub hostname: String,
    /// `VK_NODE_IP`; `None` = detect the first non-loopback IPv4 at startup.
    pub node_ip: Option<IpAddr>,
    /// `VK_KUBELET_PORT` (default 10250) → `status.daemonEndpoints.kubeletEndpoint.Port`.
    pub kubelet_port: u16,
    /// `VK_RESERVE_PERCENT` (default 20): allocatable = capacity minus this share.
    pub reserve_percent: u8,
    /// `VK_NODE_CPU`/`_MEM`/`_STORAGE`/`_HUGEPAGES`.
    pub overrides: ResourceOverrides,
    /// `VK_NODE_PODS` (default 256).
    pub max_pods: u32,
    /// `COCOON_ROOT_DIR` (default `/var/lib/cocoon`): ephemeral-storage is its filesystem.
    pub root_dir: PathBuf,
    /// `status.nodeInfo.kubeletVersion` (the vk-cocoon version).
    pub kubelet_version: String,
    /// `status.declaredFeatures`: `ExtendWebSocketsToKubelet` unless `VK_STREAMING_WEBSOCKETS`
    /// is `false` — a 1.36 apiserver then forwards kubectl's exec/attach/port-forward
    /// WebSockets to the daemon as they are, instead of translating them to SPDY.
    pub declared_features: Vec<String>,
    pub timings: Timings,
}

/// The node feature that tells a 1.36 apiserver this node serves the streaming WebSockets.
pub const WEBSOCKETS_FEATURE: &str = "ExtendWebSocketsToKubelet";

pub const DEFAULT_NODE_NAME: &str = "cocoon-pool";
pub const DEFAULT_NODE_POOL: &str = "default";
pub const DEFAULT_KUBELET_PORT: u16 = 10250;
pub const DEFAULT_RESERVE_PERCENT: u8 = 20;
pub const DEFAULT_MAX_PODS: u32 = 256;
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/cocoon";

const LABEL_VALUE_RULE: &str = "a Kubernetes label value: at most 63 characters, alphanumerics, '-', '_' and '.', starting and ending with an alphanumeric";
const DNS_SUBDOMAIN_RULE: &str = "a DNS subdomain: at most 253 characters of lower-case alphanumerics, '-' and '.', starting and ending with an alphanumeric";
const QUANTITY_RULE: &str = "a Kubernetes quantity such as 8, 7500m, 64Gi, 500G";

/// Whether `v` is a valid label value (the empty string is valid).
pub fn is_label_value(v: &str) -> bool {
    v.len() <= 63
        && (v.is_empty()
            || (v.starts_with(|c: char| c.is_ascii_alphanumeric())
                && v.ends_with(|c: char| c.is_ascii_alphanumeric())
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))))
}

/// Whether `v` is a DNS-1123 subdomain (what node names must be).
pub fn is_dns_subdomain(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 253
        && v.split('.').all(|part| {
            !part.is_empty()
                && part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        })
}

impl KubeletConfig {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the configuration through `lookup` (a variable set to "" counts as unset).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let get = |k: &str| lookup(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let bad = |variable: &'static str, value: &str, problem: String, accepted: &'static str| ConfigError {
            variable,
            value: value.to_string(),
            problem,
            accepted,
        };

        let node_name = get("VK_NODE_NAME").unwrap_or_else(|| DEFAULT_NODE_NAME.into());
        if !is_dns_subdomain(&node_name) {
            return Err(bad(
                "VK_NODE_NAME",
                &node_name,
                "not a valid node name".into(),
                DNS_SUBDOMAIN_RULE,
            ));
        }
        let node_pool = get("VK_NODE_POOL").unwrap_or_else(|| DEFAULT_NODE_POOL.into());
        if !is_label_value(&node_pool) {
            return Err(bad(
                "VK_NODE_POOL",
                &node_pool,
                "not a valid label value".into(),
                LABEL_VALUE_RULE,
            ));
        }
        let snapshot_cpu_class = get("VK_SNAPSHOT_CPU_CLASS");
        if let Some(class) = &snapshot_cpu_class
            && !is_label_value(class)
        {
            return Err(bad(
                "VK_SNAPSHOT_CPU_CLASS",
                class,
                "not a valid label value".into(),
                LABEL_VALUE_RULE,
            ));
        }
        let provider_id = get("VK_PROVIDER_ID");
        let declared_features = match get("VK_STREAMING_WEBSOCKETS").as_deref() {
            None | Some("true") | Some("1") => vec![WEBSOCKETS_FEATURE.to_string()],
            Some("false") | Some("0") => Vec::new(),
            Some(v) => {
                return Err(bad(
                    "VK_STREAMING_WEBSOCKETS",
                    v,
                    "not a boolean".into(),
                    "true (declare ExtendWebSocketsToKubelet, the default) or false",
                ));
            }
        };
        let hostname = get("VK_NODE_HOSTNAME").unwrap_or_else(|| node_name.clone());
        if !is_dns_subdomain(&hostname) {
            return Err(bad(
                "VK_NODE_HOSTNAME",
                &hostname,
                "not a host name".into(),
                DNS_SUBDOMAIN_RULE,
            ));
        }
        let node_ip = match get("VK_NODE_IP") {
            None => None,
            Some(v) => Some(v.parse::<IpAddr>().map_err(|e| {
                bad(
                    "VK_NODE_IP",
                    &v,
                    e.to_string(),
                    "an IPv4 or IPv6 address, or unset to detect the first non-loopback IPv4",
                )
            })?),
        };
        let kubelet_port = match get("VK_KUBELET_PORT") {
            None => DEFAULT_KUBELET_PORT,
            Some(v) => match v.parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => {
                    return Err(bad(
                        "VK_KUBELET_PORT",
                        &v,
                        "not a TCP port".into(),
                        "an integer from 1 to 65535 (default 10250)",
                    ));
                }
            },
        };
        let reserve_percent = match get("VK_RESERVE_PERCENT") {
            None => DEFAULT_RESERVE_PERCENT,
            Some(v) => match v.parse::<u8>() {
                Ok(p) if p <= 100 => p,
                _ => {
                    return Err(bad(
                        "VK_RESERVE_PERCENT",
                        &v,
                        "not a percentage".into(),
                        "an integer from 0 to 100 (default 20)",
                    ));
                }
            },
        };
        let quantity = |variable: &'static str| -> Result<Option<Quantity>, ConfigError> {
            match get(variable) {
                None => Ok(None),
                Some(v) => Quantity::parse(&v)
                    .map(Some)
                    .map_err(|e| bad(variable, &v, e.why.to_string(), QUANTITY_RULE)),
            }
        };
        let overrides = ResourceOverrides {
            cpu: quantity("VK_NODE_CPU")?,
            memory: quantity("VK_NODE_MEM")?,
            storage: quantity("VK_NODE_STORAGE")?,
            hugepages: quantity("VK_NODE_HUGEPAGES")?,
        };
        let max_pods = match get("VK_NODE_PODS") {
            None => DEFAULT_MAX_PODS,
            Some(v) => match v.parse::<u32>() {
                Ok(p) if p > 0 => p,
                _ => {
                    return Err(bad(
                        "VK_NODE_PODS",
                        &v,
                        "not a pod count".into(),
                        "a positive integer (default 256)",
                    ));
                }
            },
        };
        let root_dir = PathBuf::from(get("COCOON_ROOT_DIR").unwrap_or_else(|| DEFAULT_ROOT_DIR.into()));
        if !root_dir.is_absolute() {
            return Err(bad(
                "COCOON_ROOT_DIR",
                &root_dir.display().to_string(),
                "not an absolute path".into(),
                "an absolute directory path (default /var/lib/cocoon)",
            ));
        }
        Ok(Self {
            node_name,
            node_pool,
            snapshot_cpu_class,
            provider_id,
            hostname,
            node_ip,
            kubelet_port,
            reserve_percent,
            overrides,
            max_pods,
            root_dir,
            kubelet_version: format!("v{}", env!("CARGO_PKG_VERSION")),
            declared_features,
            timings: Timings::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<KubeletConfig, ConfigError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        KubeletConfig::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults() {
        let c = cfg(&[]).unwrap();
        assert_eq!(c.node_name, "cocoon-pool");
        assert_eq!(c.node_pool, "default");
        assert_eq!(c.snapshot_cpu_class, None);
        assert_eq!(c.kubelet_port, 10250);
        assert_eq!(c.reserve_percent, 20);
        assert_eq!(c.max_pods, 256);
        assert_eq!(c.root_dir, PathBuf::from("/var/lib/cocoon"));
        assert_eq!(c.overrides, ResourceOverrides::default());
        assert_eq!(c.node_ip, None);
        assert_eq!(
            c.hostname, "cocoon-pool",
            "the Hostname address defaults to the node name"
        );
        assert_eq!(c.declared_features, [WEBSOCKETS_FEATURE], "WebSockets are declared");
        assert!(
            cfg(&[("VK_STREAMING_WEBSOCKETS", "false")])
                .unwrap()
                .declared_features
                .is_empty()
        );
    }

    #[test]
    fn values_are_read() {
        let c = cfg(&[
            ("VK_NODE_NAME", "vk-a"),
            ("VK_NODE_POOL", "gpu"),
            ("VK_SNAPSHOT_CPU_CLASS", "sapphire-rapids.v1"),
            ("VK_PROVIDER_ID", "gce://p/z/vk-a"),
            ("VK_NODE_IP", "10.1.2.3"),
            ("VK_NODE_HOSTNAME", "host-a.example"),
            ("VK_KUBELET_PORT", "10255"),
            ("VK_RESERVE_PERCENT", "0"),
            ("VK_NODE_CPU", "7500m"),
            ("VK_NODE_MEM", "64Gi"),
            ("VK_NODE_PODS", "32"),
            ("COCOON_ROOT_DIR", "/srv/cocoon"),
        ])
        .unwrap();
        assert_eq!(c.node_name, "vk-a");
        assert_eq!(c.snapshot_cpu_class.as_deref(), Some("sapphire-rapids.v1"));
        assert_eq!(c.node_ip, Some("10.1.2.3".parse().unwrap()));
        assert_eq!(c.hostname, "host-a.example");
        assert_eq!(c.kubelet_port, 10255);
        assert_eq!(c.reserve_percent, 0);
        assert_eq!(c.overrides.cpu, Some(Quantity::from_millis(7500)));
        assert_eq!(c.max_pods, 32);
    }

    #[test]
    fn empty_cpu_class_is_unset() {
        assert_eq!(cfg(&[("VK_SNAPSHOT_CPU_CLASS", "")]).unwrap().snapshot_cpu_class, None);
    }

    #[test]
    fn bad_values_name_the_variable_and_what_is_accepted() {
        for (var, value, accepted_fragment) in [
            ("VK_RESERVE_PERCENT", "101", "0 to 100"),
            ("VK_RESERVE_PERCENT", "-1", "0 to 100"),
            ("VK_RESERVE_PERCENT", "ten", "0 to 100"),
            ("VK_SNAPSHOT_CPU_CLASS", "not ok!", "label value"),
            ("VK_SNAPSHOT_CPU_CLASS", "-leading", "label value"),
            ("VK_NODE_POOL", &"x".repeat(64), "label value"),
            ("VK_NODE_NAME", "Upper_Case", "DNS subdomain"),
            ("VK_NODE_HOSTNAME", "no spaces", "DNS subdomain"),
            ("VK_STREAMING_WEBSOCKETS", "maybe", "true (declare"),
            ("VK_NODE_IP", "10.0.0", "IPv4 or IPv6"),
            ("VK_KUBELET_PORT", "0", "1 to 65535"),
            ("VK_KUBELET_PORT", "70000", "1 to 65535"),
            ("VK_NODE_CPU", "lots", "quantity"),
            ("VK_NODE_MEM", "-4Gi", "quantity"),
            ("VK_NODE_PODS", "0", "positive integer"),
            ("COCOON_ROOT_DIR", "relative/dir", "absolute"),
        ] {
            let err = cfg(&[(var, value)]).expect_err(&format!("{var}={value} must be rejected"));
            assert_eq!(err.variable, var);
            let msg = err.to_string();
            assert!(msg.contains(var) && msg.contains(accepted_fragment), "{msg}");
        }
    }

    #[test]
    fn label_values() {
        assert!(is_label_value(""));
        assert!(is_label_value("a"));
        assert!(is_label_value("a.b-c_d"));
        assert!(!is_label_value("a b"));
        assert!(!is_label_value("a-"));
        assert!(!is_label_value(&"a".repeat(64)));
    }
}
