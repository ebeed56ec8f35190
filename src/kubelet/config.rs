//! The virtual node's configuration: its settings ([`KubeletArgs`], environment variables read
//! through clap) and their validation, plus the controller timings (not settings; tests inject
//! short ones).

use super::quantity::Quantity;
use crate::runtime::config::RootArgs;
use crate::settings::{self, parser};
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
    /// Concurrent pod operations across all pods (each pod is serialised on its own). Operations
    /// wait on I/O (cocoon, the apiserver, a guest), not on the CPU, so this caps only the tasks
    /// in flight; what runs on cocoon at once is the provider's to bound (for creates,
    /// `VK_MAX_CONCURRENT_BRING_UPS`). Sized by the cores, it let a 2-core node bring up two
    /// pods of a burst at a time, and held Ready publications behind the creates.
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
            workers: DEFAULT_WORKERS,
        }
    }
}

/// Pod operations in flight at once: the node's default pod count (`VK_NODE_PODS`), so a burst of
/// creates never holds back the status publications of pods already up.
pub const DEFAULT_WORKERS: usize = 256;

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
    /// `VK_NODE_HOSTNAME` (default: this machine's host name, lower-cased, as the kubelet's;
    /// the node name when the machine has none): the node's `Hostname` address, which the
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

/// The virtual node's settings (name, pool, CPU class, addresses, kubelet port, resources),
/// flattened into `vk-cocoon run`.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Node")]
pub struct KubeletArgs {
    /// The virtual node's name; its pods are those whose spec.nodeName is this name
    #[arg(long, env = "VK_NODE_NAME", value_name = "NAME", default_value = DEFAULT_NODE_NAME,
          value_parser = parser("VK_NODE_NAME", DNS_SUBDOMAIN_RULE, |v| rule(v, is_dns_subdomain(v), "not a valid node name")))]
    pub node_name: String,
    /// Label cocoonstack.io/pool of the node
    #[arg(long, env = "VK_NODE_POOL", value_name = "POOL", default_value = DEFAULT_NODE_POOL,
          value_parser = parser("VK_NODE_POOL", LABEL_VALUE_RULE, |v| rule(v, is_label_value(v), "not a valid label value")))]
    pub node_pool: String,
    /// Label cocoonstack.io/snapshot-cpu-class (unset: an unclassified node)
    #[arg(long, env = "VK_SNAPSHOT_CPU_CLASS", value_name = "CLASS",
          value_parser = parser("VK_SNAPSHOT_CPU_CLASS", LABEL_VALUE_RULE, |v| rule(v, is_label_value(v), "not a valid label value")))]
    pub snapshot_cpu_class: Option<String>,
    /// The node's spec.providerID
    #[arg(long, env = "VK_PROVIDER_ID", value_name = "ID")]
    pub provider_id: Option<String>,
    /// The node's Hostname address, which the apiserver dials first for the kubelet API (unset: this machine's host name)
    #[arg(long, env = "VK_NODE_HOSTNAME", value_name = "HOST",
          value_parser = parser("VK_NODE_HOSTNAME", DNS_SUBDOMAIN_RULE, |v| rule(v, is_dns_subdomain(v), "not a host name")))]
    pub node_hostname: Option<String>,
    /// The node's InternalIP (unset: the first non-loopback IPv4 of this host)
    #[arg(long, env = "VK_NODE_IP", value_name = "IP",
          value_parser = parser("VK_NODE_IP", "an IPv4 or IPv6 address, or unset to detect the first non-loopback IPv4", |v| v.parse::<IpAddr>().map_err(|e| e.to_string())))]
    pub node_ip: Option<IpAddr>,
    /// Port of the kubelet API (TLS), advertised in status.daemonEndpoints
    #[arg(long, env = "VK_KUBELET_PORT", value_name = "PORT", default_value_t = DEFAULT_KUBELET_PORT,
          value_parser = parser("VK_KUBELET_PORT", "an integer from 1 to 65535", |v| settings::positive::<u16>(v).map_err(|_| "not a TCP port".to_string())))]
    pub kubelet_port: u16,
    /// Share of the capacity kept out of allocatable, in percent
    #[arg(long, env = "VK_RESERVE_PERCENT", value_name = "PERCENT", default_value_t = DEFAULT_RESERVE_PERCENT,
          value_parser = parser("VK_RESERVE_PERCENT", "an integer from 0 to 100", |v| match v.parse::<u8>() {
              Ok(p) if p <= 100 => Ok(p),
              _ => Err("not a percentage".to_string()),
          }))]
    pub reserve_percent: u8,
    /// CPU capacity (unset: this host's CPUs)
    #[arg(long, env = "VK_NODE_CPU", value_name = "QUANTITY", value_parser = parser("VK_NODE_CPU", QUANTITY_RULE, quantity))]
    pub node_cpu: Option<Quantity>,
    /// Memory capacity (unset: MemTotal)
    #[arg(long, env = "VK_NODE_MEM", value_name = "QUANTITY", value_parser = parser("VK_NODE_MEM", QUANTITY_RULE, quantity))]
    pub node_mem: Option<Quantity>,
    /// ephemeral-storage capacity (unset: the filesystem of COCOON_ROOT_DIR)
    #[arg(long, env = "VK_NODE_STORAGE", value_name = "QUANTITY", value_parser = parser("VK_NODE_STORAGE", QUANTITY_RULE, quantity))]
    pub node_storage: Option<Quantity>,
    /// hugepages-SIZE capacity (unset: HugePages_Total × Hugepagesize)
    #[arg(long, env = "VK_NODE_HUGEPAGES", value_name = "QUANTITY", value_parser = parser("VK_NODE_HUGEPAGES", QUANTITY_RULE, quantity))]
    pub node_hugepages: Option<Quantity>,
    /// Pods capacity
    #[arg(long, env = "VK_NODE_PODS", value_name = "COUNT", default_value_t = DEFAULT_MAX_PODS,
          value_parser = parser("VK_NODE_PODS", "a positive integer", |v| settings::positive::<u32>(v).map_err(|_| "not a pod count".to_string())))]
    pub node_pods: u32,
    /// Declare ExtendWebSocketsToKubelet, so a 1.36 apiserver forwards kubectl's WebSockets as they are (false: it speaks SPDY/3.1)
    #[arg(long, env = "VK_STREAMING_WEBSOCKETS", value_name = "BOOL", default_value = "true", action = clap::ArgAction::Set,
          value_parser = parser("VK_STREAMING_WEBSOCKETS", "true (declare ExtendWebSocketsToKubelet, the default) or false", settings::boolean))]
    pub streaming_websockets: bool,
}

/// This machine's host name as the kubelet reports it when not overridden: `gethostname`,
/// trimmed and lower-cased (the node name rarely resolves; the machine's own name usually
/// does, to this machine). `None` when the system has none.
pub fn machine_hostname() -> Option<String> {
    let name = hostname::get().ok()?.into_string().ok()?;
    let name = name.trim().to_lowercase();
    (!name.is_empty()).then_some(name)
}

/// `Ok(v)` when `holds`, else the `problem`.
fn rule(v: &str, holds: bool, problem: &str) -> Result<String, String> {
    if holds {
        Ok(v.to_string())
    } else {
        Err(problem.to_string())
    }
}

fn quantity(v: &str) -> Result<Quantity, String> {
    Quantity::parse(v).map_err(|e| e.why.to_string())
}

impl KubeletConfig {
    /// The node's configuration from its settings; `root_dir` is cocoon's root (`COCOON_ROOT_DIR`,
    /// owned by the runtime's settings): ephemeral-storage is its filesystem.
    pub fn from_args(args: &KubeletArgs, root_dir: PathBuf) -> Self {
        Self {
            node_name: args.node_name.clone(),
            node_pool: args.node_pool.clone(),
            snapshot_cpu_class: args.snapshot_cpu_class.clone(),
            provider_id: args.provider_id.clone(),
            hostname: args
                .node_hostname
                .clone()
                .or_else(machine_hostname)
                .unwrap_or_else(|| {
                    tracing::warn!(node = %args.node_name, "this machine has no host name; the node's Hostname address is its name, which the apiserver must resolve to this machine (set VK_NODE_HOSTNAME)");
                    args.node_name.clone()
                }),
            node_ip: args.node_ip,
            kubelet_port: args.kubelet_port,
            reserve_percent: args.reserve_percent,
            overrides: ResourceOverrides {
                cpu: args.node_cpu,
                memory: args.node_mem,
                storage: args.node_storage,
                hugepages: args.node_hugepages,
            },
            max_pods: args.node_pods,
            root_dir,
            kubelet_version: format!("v{}", env!("CARGO_PKG_VERSION")),
            declared_features: if args.streaming_websockets {
                vec![WEBSOCKETS_FEATURE.to_string()]
            } else {
                Vec::new()
            },
            timings: Timings::default(),
        }
    }

    /// Reads the node's variables (and `COCOON_ROOT_DIR`) through `lookup`, with the rules of
    /// the environment ([`crate::settings`]).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, settings::SettingsError> {
        let root = settings::parse_lookup::<RootArgs>(&lookup)?;
        Ok(Self::from_args(
            &settings::parse_lookup::<KubeletArgs>(&lookup)?,
            root.root_dir,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<KubeletConfig, String> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        KubeletConfig::from_lookup(|k| map.get(k).cloned()).map_err(String::from)
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
        let kernel = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        assert_eq!(
            c.hostname,
            kernel.trim().to_lowercase(),
            "the Hostname address defaults to the machine's host name"
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
            let msg = cfg(&[(var, value)]).expect_err(&format!("{var}={value} must be rejected"));
            assert!(
                msg.contains(&format!("{var}={value:?}")) && msg.contains(accepted_fragment),
                "{msg}"
            );
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
