//! `OCI_REGISTRY=host[:port][/prefix]`: where snapshots and cloud images live, which scheme to speak, and
//! which credentials to send. Unset (or empty) means registry-less mode (`None`). The `SNAPSHOT_*`
//! variables tune the transfers ([`TransferArgs`], [`TransferSettings`]).

use super::errors::{ConfigError, RegistryError};
use super::names;
use std::net::IpAddr;
use std::time::Duration;

/// How snapshots move (`SNAPSHOT_*`; unparsable or negative values count as 0, and 0 means the
/// default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferSettings {
    /// `SNAPSHOT_ZSTD_LEVEL` (0 = off): zstd-compress files of at least 1 MiB (v2 artifact).
    pub zstd_level: i32,
    /// `SNAPSHOT_CHUNK_SIZE_MIB` (0 = off): split files into blobs of this many uncompressed bytes (v2).
    pub chunk_size: u64,
    /// `SNAPSHOT_TRANSFER_CONCURRENCY` (default 8): blobs uploaded or downloaded at once.
    pub concurrency: usize,
    /// `SNAPSHOT_MEMORY_BUDGET_MIB` (default 32): bytes a push holds in memory at once.
    pub push_budget: u64,
    /// `SNAPSHOT_PULL_BUDGET_MIB` (default 24): bytes of blobs a pull holds fetched ahead of the writer.
    pub pull_budget: u64,
    /// `SNAPSHOT_STALL_TIMEOUT_SECONDS` (default 120): a transfer that moves no byte for this long fails.
    pub stall_timeout: Duration,
    /// `SNAPSHOT_PROGRESS_INTERVAL_SECONDS` (default 10): how often a running transfer logs its progress.
    pub progress_interval: Duration,
}

pub const DEFAULT_CONCURRENCY: usize = 8;
pub const DEFAULT_PUSH_BUDGET_MIB: u64 = 32;
/// Four 4 MiB v2 chunks (each held compressed and decoded) ahead of the writer. The
/// `registry_throughput` bench measured the same pull rates at 16, 24 and 32 MiB on loopback, and
/// a v2 pull's peak RSS 8–10 MiB lower at 24 than at 32 (under 64 MiB with room to spare).
pub const DEFAULT_PULL_BUDGET_MIB: u64 = 24;
pub const DEFAULT_STALL_TIMEOUT: Duration = Duration::from_secs(120);
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(10);
/// Beyond this a MiB count no longer fits the byte arithmetic comfortably (the Go daemon's cap too).
const MAX_CHUNK_MIB: u64 = 4096;

impl Default for TransferSettings {
    fn default() -> Self {
        TransferSettings {
            zstd_level: 0,
            chunk_size: 0,
            concurrency: DEFAULT_CONCURRENCY,
            push_budget: DEFAULT_PUSH_BUDGET_MIB << 20,
            pull_budget: DEFAULT_PULL_BUDGET_MIB << 20,
            stall_timeout: DEFAULT_STALL_TIMEOUT,
            progress_interval: DEFAULT_PROGRESS_INTERVAL,
        }
    }
}

impl TransferSettings {
    /// True when pushes write the v2 layout (compressed and / or chunked files).
    pub fn v2(&self) -> bool {
        self.zstd_level > 0 || self.chunk_size > 0
    }

    /// The transfers' settings; the rules that bind two values (a chunk within the budget) are
    /// checked here.
    pub fn from_args(args: &TransferArgs) -> Result<TransferSettings, ConfigError> {
        // The Go daemon's rule: invalid or negative SNAPSHOT_* values become 0 (and 0 means the
        // default).
        let or = |v: u64, d: u64| if v == 0 { d } else { v };
        let d = TransferSettings::default();
        // zstd's levels are 1..=22 (its library clamps too; a larger value is a typo worth refusing).
        if args.snapshot_zstd_level > 22 {
            return Err(ConfigError::Setting {
                name: "SNAPSHOT_ZSTD_LEVEL",
                value: args.snapshot_zstd_level.to_string(),
                reason: "zstd levels are 1 to 22 (0 writes uncompressed layers)".into(),
            });
        }
        let chunk_mib = args.snapshot_chunk_size_mib;
        if chunk_mib > MAX_CHUNK_MIB {
            return Err(ConfigError::Setting {
                name: "SNAPSHOT_CHUNK_SIZE_MIB",
                value: chunk_mib.to_string(),
                reason: format!("at most {MAX_CHUNK_MIB} MiB"),
            });
        }
        let s = TransferSettings {
            zstd_level: args.snapshot_zstd_level as i32,
            chunk_size: chunk_mib << 20,
            concurrency: or(args.snapshot_transfer_concurrency, d.concurrency as u64) as usize,
            push_budget: or(args.snapshot_memory_budget_mib, DEFAULT_PUSH_BUDGET_MIB) << 20,
            pull_budget: or(args.snapshot_pull_budget_mib, DEFAULT_PULL_BUDGET_MIB) << 20,
            stall_timeout: Duration::from_secs(or(args.snapshot_stall_timeout_seconds, d.stall_timeout.as_secs())),
            progress_interval: Duration::from_secs(or(
                args.snapshot_progress_interval_seconds,
                d.progress_interval.as_secs(),
            )),
        };
        // A chunk is held raw and compressed at once: the budget must hold both.
        if s.chunk_size > 0 && 2 * s.chunk_size > s.push_budget {
            return Err(ConfigError::Setting {
                name: "SNAPSHOT_MEMORY_BUDGET_MIB",
                value: (s.push_budget >> 20).to_string(),
                reason: format!(
                    "a push holds a chunk raw and compressed, so SNAPSHOT_CHUNK_SIZE_MIB={} needs at least {} MiB",
                    chunk_mib,
                    2 * chunk_mib
                ),
            });
        }
        Ok(s)
    }

    /// Reads the `SNAPSHOT_*` variables through `lookup`, with the rules of the environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<TransferSettings, TransferSettingsError> {
        let args = crate::settings::parse_lookup::<TransferArgs>(lookup)?;
        Ok(Self::from_args(&args)?)
    }
}

/// Why the `SNAPSHOT_*` settings read through a lookup cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TransferSettingsError {
    #[error(transparent)]
    Settings(#[from] crate::settings::SettingsError),
    #[error(transparent)]
    Invalid(#[from] ConfigError),
}

/// Invalid or negative `SNAPSHOT_*` values become 0 (the Go daemon's rule, kept: a fleet's
/// environment files were written against it), and 0 means the default.
fn lenient(text: &str) -> Result<u64, std::convert::Infallible> {
    Ok(text.trim().parse::<i64>().map_or(0, |n| n.max(0) as u64))
}

/// How snapshots move (`SNAPSHOT_*`). Invalid or negative values count as 0, and 0 is the default.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Registry transfers")]
pub struct TransferArgs {
    /// >0: the v2 writer, files of at least 1 MiB zstd-compressed at this level (1-22)
    #[arg(long, env = "SNAPSHOT_ZSTD_LEVEL", value_name = "LEVEL", default_value = "0", value_parser = lenient)]
    pub snapshot_zstd_level: u64,
    /// >0: the v2 writer, files cut into blobs of this many MiB (at most 4096)
    #[arg(long, env = "SNAPSHOT_CHUNK_SIZE_MIB", value_name = "MIB", default_value = "0", value_parser = lenient)]
    pub snapshot_chunk_size_mib: u64,
    /// Blobs uploaded or downloaded at once (0: 8)
    #[arg(long, env = "SNAPSHOT_TRANSFER_CONCURRENCY", value_name = "COUNT", default_value = "0", value_parser = lenient)]
    pub snapshot_transfer_concurrency: u64,
    /// MiB a push holds in memory at once, at least twice the chunk size (0: 32)
    #[arg(long, env = "SNAPSHOT_MEMORY_BUDGET_MIB", value_name = "MIB", default_value = "0", value_parser = lenient)]
    pub snapshot_memory_budget_mib: u64,
    /// MiB of blobs a pull holds fetched ahead of the import, downloaded and decoded in parallel; a
    /// bigger blob is streamed (0: 24)
    #[arg(long, env = "SNAPSHOT_PULL_BUDGET_MIB", value_name = "MIB", default_value = "0", value_parser = lenient)]
    pub snapshot_pull_budget_mib: u64,
    /// A push or pull that moves no byte for this many seconds fails (0: 120)
    #[arg(long, env = "SNAPSHOT_STALL_TIMEOUT_SECONDS", value_name = "SECONDS", default_value = "0", value_parser = lenient)]
    pub snapshot_stall_timeout_seconds: u64,
    /// How often a running transfer logs bytes, rate and ETA, in seconds (0: 10)
    #[arg(long, env = "SNAPSHOT_PROGRESS_INTERVAL_SECONDS", value_name = "SECONDS", default_value = "0", value_parser = lenient)]
    pub snapshot_progress_interval_seconds: u64,
}

/// The registry's settings.
// The fields' doc comments are `--help` text, where `host[:port]` is read as written, not as a
// rustdoc link.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Registry")]
pub struct RegistryArgs {
    /// Registry of snapshots and cloud images, host[:port][/prefix] (http:// or https:// to choose; unset: registry-less, hibernated guests stay in local snapshots)
    #[arg(long, env = "OCI_REGISTRY", value_name = "REGISTRY")]
    pub oci_registry: Option<String>,
    /// Hosts besides the registry's own that may receive the node's registry credentials as its token service, host[:port] comma-separated, always over HTTPS (e.g. auth.docker.io; unset: only the registry's host)
    #[arg(long, env = "OCI_REGISTRY_TOKEN_REALMS", value_name = "HOSTS", value_delimiter = ',')]
    pub oci_registry_token_realms: Vec<String>,
    #[command(flatten)]
    pub transfer: TransferArgs,
}

/// Parsed registry location plus transfer settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryConfig {
    /// `host[:port]` as given (lower-cased host).
    pub host: String,
    /// Repository prefix without slashes at either end (`""` when absent).
    pub prefix: String,
    /// Plain HTTP (loopback and private hosts) instead of HTTPS.
    pub plain_http: bool,
    /// Most concurrent pulls of v2 / index artifacts on this node.
    pub max_heavy_pulls: usize,
    /// The `SNAPSHOT_*` tuning.
    pub transfer: TransferSettings,
    /// `OCI_REGISTRY_TOKEN_REALMS`: hosts (`host` or `host:port`, lower-cased) besides the registry's
    /// own that the registry may name as its token realm; they get the credentials over HTTPS only.
    pub token_realms: Vec<String>,
}

impl RegistryConfig {
    /// The registry from its settings. `Ok(None)`: `OCI_REGISTRY` is unset — registry-less mode.
    pub fn from_args(args: &RegistryArgs) -> Result<Option<RegistryConfig>, ConfigError> {
        let Some(mut cfg) = Self::parse(args.oci_registry.as_deref().unwrap_or_default())? else {
            return Ok(None);
        };
        cfg.transfer = TransferSettings::from_args(&args.transfer)?;
        cfg.token_realms = token_realm_hosts(&args.oci_registry_token_realms)?;
        Ok(Some(cfg))
    }

    /// Parses `host[:port][/prefix]` (an `http://`/`https://` scheme, if given, overrides the host rule).
    pub fn parse(value: &str) -> Result<Option<RegistryConfig>, ConfigError> {
        let v = value.trim();
        if v.is_empty() {
            return Ok(None);
        }
        let invalid = |reason: &str| ConfigError::Invalid {
            value: value.to_string(),
            reason: reason.to_string(),
        };
        let (scheme, rest) = if let Some(r) = v.strip_prefix("http://") {
            (Some(true), r)
        } else if let Some(r) = v.strip_prefix("https://") {
            (Some(false), r)
        } else if v.contains("://") {
            return Err(invalid("only http:// or https:// schemes are understood"));
        } else {
            (None, v)
        };
        let (hostport, prefix) = match rest.split_once('/') {
            Some((h, p)) => {
                let p = p.trim_end_matches('/');
                if p.starts_with('/') || p.contains("//") {
                    return Err(invalid("the prefix has an empty path segment"));
                }
                (h, p)
            }
            None => (rest, ""),
        };
        if hostport.is_empty() {
            return Err(invalid("the host is empty"));
        }
        if hostport
            .chars()
            .any(|c| c.is_whitespace() || c == '@' || c == '?' || c == '#')
        {
            return Err(invalid("the host contains characters that are not allowed"));
        }
        let host = host_of(hostport).ok_or_else(|| invalid("the port is not a number"))?;
        if let Some(reason) = (!prefix.is_empty())
            .then(|| names::repository_problem(prefix))
            .flatten()
        {
            return Err(invalid(&format!("the prefix is not a repository path: {reason}")));
        }
        Ok(Some(RegistryConfig {
            host: hostport.to_ascii_lowercase(),
            prefix: prefix.to_string(),
            plain_http: scheme.unwrap_or_else(|| is_private_host(&host)),
            max_heavy_pulls: 2,
            transfer: TransferSettings::default(),
            token_realms: Vec::new(),
        }))
    }

    /// The full repository path of `repo` (with the prefix). `repo` must be in the distribution
    /// grammar, so the path cannot leave the prefix.
    pub fn repository(&self, repo: &str) -> Result<String, RegistryError> {
        if let Some(reason) = names::repository_problem(repo) {
            return Err(RegistryError::InvalidName {
                what: "repository name",
                name: repo.to_string(),
                reason,
            });
        }
        let full = if self.prefix.is_empty() {
            repo.to_string()
        } else {
            format!("{}/{}", self.prefix, repo)
        };
        if let Some(reason) = names::repository_problem(&full) {
            return Err(RegistryError::InvalidName {
                what: "repository name",
                name: full,
                reason,
            });
        }
        Ok(full)
    }

    /// The registry's host without its port (and without the brackets of an IPv6 address).
    pub fn host_name(&self) -> String {
        host_of(&self.host).unwrap_or_else(|| self.host.clone())
    }

    /// Base URL (`http(s)://host[:port]`).
    pub fn base_url(&self) -> String {
        format!("{}://{}", if self.plain_http { "http" } else { "https" }, self.host)
    }
}

/// The hosts of `OCI_REGISTRY_TOKEN_REALMS`: `host` or `host:port`, nothing else (no scheme, path
/// or credentials), lower-cased.
fn token_realm_hosts(values: &[String]) -> Result<Vec<String>, ConfigError> {
    values
        .iter()
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .map(|v| {
            let bad = v.is_empty()
                || v.chars().any(|c| c.is_whitespace() || "/@?#".contains(c))
                || host_of(v).is_none_or(|h| h.is_empty());
            if bad {
                return Err(ConfigError::Setting {
                    name: "OCI_REGISTRY_TOKEN_REALMS",
                    value: v.to_string(),
                    reason: "each entry is a host or host:port (the realm's URL must then be https://<that host>/...)"
                        .into(),
                });
            }
            Ok(v.to_ascii_lowercase())
        })
        .collect()
}

/// The host part of `host[:port]` / `[v6]:port`; `None` when the port is not numeric.
fn host_of(hostport: &str) -> Option<String> {
    if let Some(rest) = hostport.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        if !after.is_empty() && after.strip_prefix(':').is_none_or(|p| p.parse::<u16>().is_err()) {
            return None;
        }
        return Some(h.to_string());
    }
    match hostport.rsplit_once(':') {
        Some((h, p)) => p.parse::<u16>().ok().map(|_| h.to_string()),
        None => Some(hostport.to_string()),
    }
}

/// go-containerregistry's rule: plain HTTP for `localhost`, loopback and private (RFC 1918 / ULA) addresses.
pub fn is_private_host(host: &str) -> bool {
    let h = host.to_ascii_lowercase();
    if h == "localhost" || h.ends_with(".localhost") {
        return true;
    }
    match h.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => ip.is_loopback() || ip.is_private() || ip.is_link_local(),
        Ok(IpAddr::V6(ip)) => ip.is_loopback() || (ip.segments()[0] & 0xfe00) == 0xfc00,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_empty_is_registry_less() {
        assert_eq!(RegistryConfig::parse("").unwrap(), None);
        assert_eq!(RegistryConfig::parse("  ").unwrap(), None);
    }

    #[test]
    fn host_port_prefix() {
        let c = RegistryConfig::parse("localhost:5000/cocoon").unwrap().unwrap();
        assert_eq!(c.host, "localhost:5000");
        assert_eq!(c.prefix, "cocoon");
        assert!(c.plain_http);
        assert_eq!(c.repository("vk-default-demo-0").unwrap(), "cocoon/vk-default-demo-0");
        assert_eq!(c.base_url(), "http://localhost:5000");
        let c = RegistryConfig::parse("registry.example.com/a/b/").unwrap().unwrap();
        assert_eq!(
            (c.host.as_str(), c.prefix.as_str(), c.plain_http),
            ("registry.example.com", "a/b", false)
        );
        assert_eq!(c.repository("x").unwrap(), "a/b/x");
        let c = RegistryConfig::parse("ghcr.io").unwrap().unwrap();
        assert_eq!((c.prefix.as_str(), c.repository("x").unwrap().as_str()), ("", "x"));
        for escape in ["../x", "x/../../y", "%2e%2e", "X", ""] {
            assert!(
                matches!(c.repository(escape), Err(RegistryError::InvalidName { .. })),
                "{escape:?}"
            );
        }
    }

    #[test]
    fn scheme_by_host() {
        for (v, plain) in [
            ("127.0.0.1:5000", true),
            ("10.1.2.3", true),
            ("172.16.0.9:80", true),
            ("172.32.0.9:80", false),
            ("192.168.1.1", true),
            ("[::1]:5000", true),
            ("[fd00::1]:5000", true),
            ("8.8.8.8", false),
            ("reg.localhost:1", true),
            ("epoch.example.org", false),
            ("https://127.0.0.1:5000", false),
            ("http://epoch.example.org", true),
        ] {
            assert_eq!(RegistryConfig::parse(v).unwrap().unwrap().plain_http, plain, "{v}");
        }
    }

    #[test]
    fn snapshot_settings_default_and_lenient_like_the_go_daemon() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let d = TransferSettings::from_lookup(env(&[])).unwrap();
        assert_eq!(d, TransferSettings::default());
        assert!(!d.v2());
        assert_eq!((d.concurrency, d.push_budget, d.pull_budget), (8, 32 << 20, 24 << 20));
        let s = TransferSettings::from_lookup(env(&[
            ("SNAPSHOT_ZSTD_LEVEL", "3"),
            ("SNAPSHOT_CHUNK_SIZE_MIB", "4"),
            ("SNAPSHOT_TRANSFER_CONCURRENCY", "-2"),
            ("SNAPSHOT_MEMORY_BUDGET_MIB", "lots"),
            ("SNAPSHOT_PULL_BUDGET_MIB", "64"),
            ("SNAPSHOT_STALL_TIMEOUT_SECONDS", "5"),
        ]))
        .unwrap();
        assert!(s.v2());
        assert_eq!(
            (s.zstd_level, s.chunk_size, s.concurrency, s.push_budget, s.pull_budget),
            (3, 4 << 20, 8, 32 << 20, 64 << 20)
        );
        assert_eq!(s.stall_timeout, Duration::from_secs(5));
        for bad in [
            &[("SNAPSHOT_ZSTD_LEVEL", "30")][..],
            &[
                ("SNAPSHOT_CHUNK_SIZE_MIB", "5000"),
                ("SNAPSHOT_MEMORY_BUDGET_MIB", "100000"),
            ][..],
            &[("SNAPSHOT_CHUNK_SIZE_MIB", "64")][..],
        ] {
            let owned: Vec<(String, String)> = bad.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let e = TransferSettings::from_lookup(|k| owned.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
                .unwrap_err()
                .to_string();
            assert!(e.contains("SNAPSHOT_"), "{e}");
        }
    }

    #[test]
    fn token_realm_hosts_are_hosts_only() {
        let hosts = |v: &[&str]| token_realm_hosts(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            hosts(&["Auth.Docker.io", " gitlab.example.com:8443 ", ""]).unwrap(),
            ["auth.docker.io", "gitlab.example.com:8443"]
        );
        for bad in [
            "https://auth.docker.io",
            "auth.docker.io/token",
            "user@host",
            "host:port",
            ":443",
        ] {
            let e = hosts(&[bad]).unwrap_err().to_string();
            assert!(e.contains("OCI_REGISTRY_TOKEN_REALMS"), "{bad}: {e}");
        }
    }

    #[test]
    fn invalid_values_say_why() {
        for v in [
            "localhost:abc",
            "ftp://x",
            "/prefix",
            "host/UPPER",
            "host//x",
            "a b",
            "host/team/..",
            "host/../x",
            "host/a/./b",
        ] {
            let e = RegistryConfig::parse(v).unwrap_err().to_string();
            assert!(
                e.contains("OCI_REGISTRY") && e.contains("host[:port][/prefix]"),
                "{v}: {e}"
            );
        }
    }
}
