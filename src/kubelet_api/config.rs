//! The kubelet API's settings ([`ApiArgs`]) and their validation (pure).

use std::net::IpAddr;
use std::path::PathBuf;

use super::tls::TlsSource;
use crate::kubelet::ConfigError;
use crate::settings::{self, parser};

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

/// The kubelet API's listener and certificates (`src/kubelet_api/README.md`).
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Kubelet API")]
pub struct ApiArgs {
    /// Address the kubelet API binds (unset: the node IP; 0.0.0.0 or :: for all)
    #[arg(long, env = "VK_KUBELET_ADDRESS", value_name = "IP",
          value_parser = parser("VK_KUBELET_ADDRESS", "an IP address to bind the kubelet API to (default: the node IP; 0.0.0.0 or :: for all)",
                                |v| v.parse::<IpAddr>().map_err(|e| e.to_string())))]
    pub kubelet_address: Option<IpAddr>,
    /// The serving certificate (PEM chain; with VK_TLS_KEY, re-read when it changes)
    #[arg(long, env = "VK_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of VK_TLS_CERT (PEM)
    #[arg(long, env = "VK_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Serve a self-signed certificate (clients cannot verify it)
    #[arg(long, env = "VK_TLS_SELF_SIGNED", value_name = "BOOL", default_value = "false", action = clap::ArgAction::Set,
          value_parser = parser("VK_TLS_SELF_SIGNED", "true or false", settings::boolean))]
    pub tls_self_signed: bool,
    /// Where the certificate issued through a kubelet-serving CSR is kept (without VK_TLS_CERT or VK_TLS_SELF_SIGNED)
    #[arg(long, env = "VK_TLS_CERT_DIR", value_name = "DIR", default_value = DEFAULT_CERT_DIR)]
    pub tls_cert_dir: PathBuf,
    /// CA of the client certificates accepted (the apiserver's kubelet-client certificate; unset: bearer tokens only)
    #[arg(long, env = "VK_CLIENT_CA_FILE", value_name = "FILE")]
    pub client_ca_file: Option<PathBuf>,
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
    pub fn from_args(args: &ApiArgs, port: u16) -> Result<Self, ConfigError> {
        let tls = match (&args.tls_cert, &args.tls_key) {
            (Some(cert), Some(key)) => {
                if args.tls_self_signed {
                    return Err(bad(
                        "VK_TLS_SELF_SIGNED",
                        "true",
                        "conflicts with VK_TLS_CERT/VK_TLS_KEY",
                        "unset one of them",
                    ));
                }
                TlsSource::Files {
                    cert: cert.clone(),
                    key: key.clone(),
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
            (None, None) if args.tls_self_signed => TlsSource::SelfSigned,
            (None, None) => TlsSource::Csr {
                dir: args.tls_cert_dir.clone(),
            },
        };
        Ok(Self {
            address: args.kubelet_address,
            port,
            tls,
            client_ca: args.client_ca_file.clone(),
        })
    }

    /// Reads the variables through `lookup`, with the rules of the environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>, port: u16) -> Result<Self, String> {
        let args = crate::settings::parse_lookup::<ApiArgs>(lookup)?;
        Self::from_args(&args, port).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<ApiConfig, String> {
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
            (vec![("VK_TLS_SELF_SIGNED", "maybe")], "VK_TLS_SELF_SIGNED"),
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
            let e = cfg(&vars).unwrap_err();
            assert!(e.contains(var), "{vars:?}: {e}");
        }
    }
}
