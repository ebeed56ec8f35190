//! The kubelet API's settings from the environment (pure).

use std::net::IpAddr;
use std::path::PathBuf;

use super::tls::TlsSource;
use crate::kubelet::ConfigError;

/// Where the CSR-issued certificate is kept by default.
pub const DEFAULT_CERT_DIR: &str = "/var/lib/vk-cocoon/pki";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// `VK_KUBELET_ADDRESS`; `None` = the node IP.
    pub address: Option<IpAddr>,
    /// `VK_KUBELET_PORT` (default 10250; the port the node advertises).
    pub port: u16,
    pub tls: TlsSource,
    /// `VK_CLIENT_CA_FILE`: the CA of the client certificates accepted (the apiserver's
    /// kubelet-client certificate). Unset: only bearer tokens authenticate.
    pub client_ca: Option<PathBuf>,
}

fn bad(variable: &'static str, value: &str, problem: &str, accepted: &'static str) -> ConfigError {
    ConfigError {
        variable,
        value: value.to_string(),
        problem: problem.to_string(),
        accepted,
    }
}

impl ApiConfig {
    /// `port` is the virtual node's `kubelet_port` (one source for what is advertised and bound).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>, port: u16) -> Result<Self, ConfigError> {
        let get = |k: &str| lookup(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        let address = match get("VK_KUBELET_ADDRESS") {
            None => None,
            Some(v) => Some(v.parse::<IpAddr>().map_err(|e| {
                bad(
                    "VK_KUBELET_ADDRESS",
                    &v,
                    &e.to_string(),
                    "an IP address to bind the kubelet API to (default: the node IP; 0.0.0.0 or :: for all)",
                )
            })?),
        };
        let self_signed = match get("VK_TLS_SELF_SIGNED").as_deref() {
            None | Some("false") | Some("0") => false,
            Some("true") | Some("1") => true,
            Some(v) => return Err(bad("VK_TLS_SELF_SIGNED", v, "not a boolean", "true or false")),
        };
        let tls = match (get("VK_TLS_CERT"), get("VK_TLS_KEY")) {
            (Some(cert), Some(key)) => {
                if self_signed {
                    return Err(bad(
                        "VK_TLS_SELF_SIGNED",
                        "true",
                        "conflicts with VK_TLS_CERT/VK_TLS_KEY",
                        "unset one of them",
                    ));
                }
                TlsSource::Files {
                    cert: cert.into(),
                    key: key.into(),
                }
            }
            (Some(_), None) => {
                return Err(bad(
                    "VK_TLS_KEY",
                    "",
                    "VK_TLS_CERT is set without it",
                    "the PEM private key of VK_TLS_CERT",
                ));
            }
            (None, Some(_)) => {
                return Err(bad(
                    "VK_TLS_CERT",
                    "",
                    "VK_TLS_KEY is set without it",
                    "the PEM certificate (chain) of VK_TLS_KEY",
                ));
            }
            (None, None) if self_signed => TlsSource::SelfSigned,
            (None, None) => TlsSource::Csr {
                dir: get("VK_TLS_CERT_DIR").unwrap_or_else(|| DEFAULT_CERT_DIR.into()).into(),
            },
        };
        Ok(Self {
            address,
            port,
            tls,
            client_ca: get("VK_CLIENT_CA_FILE").map(PathBuf::from),
        })
    }

    pub fn from_env(port: u16) -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok(), port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<ApiConfig, ConfigError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ApiConfig::from_lookup(|k| map.get(k).cloned(), 10250)
    }

    #[test]
    fn secure_defaults_a_cluster_signed_certificate() {
        let c = cfg(&[]).unwrap();
        assert_eq!(
            c.tls,
            TlsSource::Csr {
                dir: DEFAULT_CERT_DIR.into()
            }
        );
        assert_eq!((c.address, c.port, c.client_ca), (None, 10250, None));
    }

    #[test]
    fn sources() {
        assert_eq!(
            cfg(&[("VK_TLS_CERT", "/c"), ("VK_TLS_KEY", "/k")]).unwrap().tls,
            TlsSource::Files {
                cert: "/c".into(),
                key: "/k".into()
            }
        );
        assert_eq!(
            cfg(&[("VK_TLS_SELF_SIGNED", "true")]).unwrap().tls,
            TlsSource::SelfSigned
        );
        assert_eq!(
            cfg(&[("VK_TLS_CERT_DIR", "/pki")]).unwrap().tls,
            TlsSource::Csr { dir: "/pki".into() }
        );
        let c = cfg(&[("VK_KUBELET_ADDRESS", "127.0.0.1"), ("VK_CLIENT_CA_FILE", "/ca.crt")]).unwrap();
        assert_eq!(c.address, Some("127.0.0.1".parse().unwrap()));
        assert_eq!(c.client_ca, Some("/ca.crt".into()));
    }

    #[test]
    fn mistakes_name_the_variable() {
        for (vars, var) in [
            (vec![("VK_TLS_CERT", "/c")], "VK_TLS_KEY"),
            (vec![("VK_TLS_KEY", "/k")], "VK_TLS_CERT"),
            (vec![("VK_TLS_SELF_SIGNED", "yes")], "VK_TLS_SELF_SIGNED"),
            (
                vec![
                    ("VK_TLS_SELF_SIGNED", "true"),
                    ("VK_TLS_CERT", "/c"),
                    ("VK_TLS_KEY", "/k"),
                ],
                "VK_TLS_SELF_SIGNED",
            ),
            (vec![("VK_KUBELET_ADDRESS", "nowhere")], "VK_KUBELET_ADDRESS"),
        ] {
            assert_eq!(cfg(&vars).unwrap_err().variable, var, "{vars:?}");
        }
    }
}
