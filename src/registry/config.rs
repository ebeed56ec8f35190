//! `OCI_REGISTRY=host[:port][/prefix]`: where snapshots and cloud images live, which scheme to speak, and
//! which credentials to send. Unset (or empty) means registry-less mode (`None`).

use super::errors::ConfigError;
use std::net::IpAddr;
use std::path::PathBuf;

/// Parsed registry location plus transfer settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryConfig {
    /// `host[:port]` as given (lower-cased host).
    pub host: String,
    /// Repository prefix without slashes at either end (`""` when absent).
    pub prefix: String,
    /// Plain HTTP (loopback and private hosts) instead of HTTPS.
    pub plain_http: bool,
    /// Where push spools one tar entry at a time (so each blob's digest is known before its HEAD/upload).
    pub spool_dir: PathBuf,
    /// Most concurrent pulls of v2 / index artifacts on this node.
    pub max_heavy_pulls: usize,
}

impl RegistryConfig {
    /// Reads `OCI_REGISTRY` (and `VK_REGISTRY_SPOOL_DIR`, default the system temp dir).
    /// `Ok(None)`: the variable is unset or empty — registry-less mode.
    pub fn from_env() -> Result<Option<RegistryConfig>, ConfigError> {
        let value = std::env::var("OCI_REGISTRY").unwrap_or_default();
        let mut cfg = match Self::parse(&value)? {
            Some(c) => c,
            None => return Ok(None),
        };
        if let Some(dir) = std::env::var_os("VK_REGISTRY_SPOOL_DIR").filter(|d| !d.is_empty()) {
            cfg.spool_dir = PathBuf::from(dir);
        }
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
        if prefix
            .chars()
            .any(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(c)))
        {
            return Err(invalid(
                "the prefix must be a lower-case repository path (a-z 0-9 . _ - /)",
            ));
        }
        Ok(Some(RegistryConfig {
            host: hostport.to_ascii_lowercase(),
            prefix: prefix.to_string(),
            plain_http: scheme.unwrap_or_else(|| is_private_host(&host)),
            spool_dir: std::env::temp_dir(),
            max_heavy_pulls: 2,
        }))
    }

    /// The full repository path of `repo` (with the prefix).
    pub fn repository(&self, repo: &str) -> String {
        if self.prefix.is_empty() {
            repo.to_string()
        } else {
            format!("{}/{}", self.prefix, repo)
        }
    }

    /// Base URL (`http(s)://host[:port]`).
    pub fn base_url(&self) -> String {
        format!("{}://{}", if self.plain_http { "http" } else { "https" }, self.host)
    }
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
        assert_eq!(c.repository("vk-default-demo-0"), "cocoon/vk-default-demo-0");
        assert_eq!(c.base_url(), "http://localhost:5000");
        let c = RegistryConfig::parse("registry.example.com/a/b/").unwrap().unwrap();
        assert_eq!(
            (c.host.as_str(), c.prefix.as_str(), c.plain_http),
            ("registry.example.com", "a/b", false)
        );
        assert_eq!(c.repository("x"), "a/b/x");
        let c = RegistryConfig::parse("ghcr.io").unwrap().unwrap();
        assert_eq!((c.prefix.as_str(), c.repository("x").as_str()), ("", "x"));
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
    fn invalid_values_say_why() {
        for v in ["localhost:abc", "ftp://x", "/prefix", "host/UPPER", "host//x", "a b"] {
            let e = RegistryConfig::parse(v).unwrap_err().to_string();
            assert!(
                e.contains("OCI_REGISTRY") && e.contains("host[:port][/prefix]"),
                "{v}: {e}"
            );
        }
    }
}
