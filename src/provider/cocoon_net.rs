//! cocoon-net: the JSON lease file (IP by MAC) and lease release over the
//! control socket (`DELETE /v1/leases/<mac>`, HTTP/1.1 on a unix socket).

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::plan::NetworkMode;
use super::ports::{LeaseError, LeaseReleaser, LeaseSource, ReleaseError};
use crate::registry::errors::Cause;

pub const DEFAULT_LEASES_PATH: &str = "/var/lib/cocoon/net/leases.json";
pub const DEFAULT_CONTROL_SOCKET: &str = "/run/cocoon-net/control.sock";

/// Where cocoon-net's leases and control socket are.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "cocoon-net")]
pub struct CocoonNetArgs {
    /// cocoon-net's DHCP lease file (a guest's IP by MAC; re-read when it changes)
    #[arg(long, env = "VK_LEASES_PATH", value_name = "FILE", default_value = DEFAULT_LEASES_PATH)]
    pub leases_path: std::path::PathBuf,
    /// cocoon-net's control socket, where a gone VM's leases are released (set but empty: release disabled)
    #[arg(long, env = "VK_COCOON_NET_CONTROL_SOCKET", value_name = "SOCKET", default_value = DEFAULT_CONTROL_SOCKET)]
    pub cocoon_net_control_socket: String,
    /// The guests' DHCP family: ipv4, or ipv6-only (Windows guests then release and renew with
    /// ipconfig /release6 and /renew6); unset, ipv6-only when cocoon-net's pool subnet is IPv6
    #[arg(long, env = "VK_NETWORK_MODE", value_name = "MODE",
          value_parser = crate::settings::parser("VK_NETWORK_MODE", "ipv4 or ipv6-only", NetworkMode::parse))]
    pub network_mode: Option<NetworkMode>,
}

impl CocoonNetArgs {
    /// The control socket, `None` when release is disabled (an empty value).
    pub fn control_socket(&self) -> Option<ControlSocket> {
        let path = self.cocoon_net_control_socket.trim();
        (!path.is_empty()).then(|| ControlSocket::new(std::path::PathBuf::from(path)))
    }
}

#[derive(Debug, Clone, Deserialize)]
struct Row {
    #[serde(default)]
    mac: String,
    #[serde(default)]
    ip: String,
    #[serde(default)]
    expiry: String,
}

#[derive(Debug, Clone)]
struct Lease {
    mac: String,
    ip: String,
    expiry: SystemTime,
}

/// A lease file that is not cocoon-net's JSON.
#[derive(Debug, thiserror::Error)]
#[error("lease file is not a JSON array of leases: {0}")]
pub struct MalformedLeases(#[source] serde_json::Error);

/// Parses the lease file: a JSON array (or `null`); rows with an unparseable expiry are skipped.
pub fn parse_leases(text: &str) -> Result<Vec<(String, String, SystemTime)>, MalformedLeases> {
    let rows: Option<Vec<Row>> = serde_json::from_str(text).map_err(MalformedLeases)?;
    Ok(rows
        .unwrap_or_default()
        .into_iter()
        .filter_map(|r| {
            let ts: k8s_openapi::jiff::Timestamp = r.expiry.parse().ok()?;
            let expiry = SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(ts.as_second()).ok()?);
            Some((r.mac.to_ascii_lowercase(), r.ip, expiry))
        })
        .collect())
}

/// The lease file, re-parsed when its mtime or size changes.
pub struct LeaseFile {
    path: PathBuf,
    cache: Mutex<Option<(SystemTime, u64, Vec<Lease>)>>,
}

impl LeaseFile {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            cache: Mutex::new(None),
        }
    }

    fn unreadable(&self, e: impl std::error::Error + Send + Sync + 'static) -> LeaseError {
        LeaseError::Unreadable {
            path: self.path.clone(),
            cause: Cause::new(e),
        }
    }

    fn leases(&self) -> Result<Vec<Lease>, LeaseError> {
        let meta = std::fs::metadata(&self.path).map_err(|e| self.unreadable(e))?;
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        let mut cache = self.cache.lock().expect("lease cache lock");
        if let Some((m, s, leases)) = cache.as_ref()
            && *m == mtime
            && *s == meta.len()
        {
            return Ok(leases.clone());
        }
        let text = std::fs::read_to_string(&self.path).map_err(|e| self.unreadable(e))?;
        let leases: Vec<Lease> = parse_leases(&text)
            .map_err(|e| self.unreadable(e))?
            .into_iter()
            .map(|(mac, ip, expiry)| Lease { mac, ip, expiry })
            .collect();
        *cache = Some((mtime, meta.len(), leases.clone()));
        Ok(leases)
    }
}

impl LeaseSource for LeaseFile {
    fn lookup(&self, mac: &str) -> Result<String, LeaseError> {
        let mac = mac.trim().to_ascii_lowercase();
        let now = SystemTime::now();
        self.leases()?
            .into_iter()
            .find(|l| l.mac == mac && now < l.expiry && !l.ip.is_empty())
            .map(|l| l.ip)
            .ok_or(LeaseError::NoLease)
    }
}

/// Normalises a MAC to lower-case colon form; `None` when it is not six hex octets.
pub fn normalize_mac(mac: &str) -> Option<String> {
    let parts: Vec<&str> = mac.trim().split([':', '-']).collect();
    if parts.len() != 6
        || parts
            .iter()
            .any(|p| p.len() != 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()))
    {
        return None;
    }
    Some(parts.join(":").to_ascii_lowercase())
}

/// Lease release over cocoon-net's control socket.
pub struct ControlSocket {
    path: PathBuf,
    timeout: Duration,
}

impl ControlSocket {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            timeout: Duration::from_secs(5),
        }
    }

    async fn delete_once(&self, mac: &str) -> Result<u16, ReleaseError> {
        let mut stream = tokio::net::UnixStream::connect(&self.path)
            .await
            .map_err(|source| ReleaseError::Connect {
                path: self.path.clone(),
                source,
            })?;
        let request = format!(
            "DELETE /v1/leases/{mac} HTTP/1.1\r\nHost: cocoon-net\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(ReleaseError::Write)?;
        let mut response = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            let n = stream.read(&mut buf).await.map_err(ReleaseError::Read)?;
            if n == 0 {
                break;
            }
            response.extend_from_slice(&buf[..n]);
            if response.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let head = String::from_utf8_lossy(&response);
        head.split_whitespace()
            .nth(1)
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| ReleaseError::Malformed(head.lines().next().unwrap_or("").to_string()))
    }
}

#[async_trait]
impl LeaseReleaser for ControlSocket {
    async fn release(&self, mac: &str) -> Result<(), ReleaseError> {
        let mac = normalize_mac(mac).ok_or_else(|| ReleaseError::InvalidMac(mac.to_string()))?;
        for attempt in 0..2 {
            let code = tokio::time::timeout(self.timeout, self.delete_once(&mac))
                .await
                .map_err(|_| ReleaseError::TimedOut {
                    mac: mac.clone(),
                    after: self.timeout,
                })??;
            match code {
                204 => return Ok(()),
                500 if attempt == 0 => continue,
                code => return Err(ReleaseError::Refused { mac, code }),
            }
        }
        Err(ReleaseError::FailedTwice { mac })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncBufReadExt;

    #[test]
    fn the_network_mode_setting_is_parsed_with_the_rules_of_the_environment() {
        let args = |v: &str| {
            crate::settings::parse_lookup::<CocoonNetArgs>(|k| (k == "VK_NETWORK_MODE").then(|| v.to_string()))
        };
        assert_eq!(args(" IPv6-Only ").unwrap().network_mode, Some(NetworkMode::Ipv6Only));
        assert_eq!(args("ipv4").unwrap().network_mode, Some(NetworkMode::Ipv4));
        let refused = args("ipv6").unwrap_err().to_string();
        assert!(
            refused.contains("VK_NETWORK_MODE") && refused.contains("ipv4 or ipv6-only"),
            "{refused}"
        );
    }

    /// An unreadable or malformed lease file: the message names the file and the error as
    /// before, and the io or JSON error itself is reachable down the source chain.
    #[test]
    fn an_unreadable_lease_file_keeps_its_io_or_json_error_as_the_source() {
        use std::error::Error as _;
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let e = LeaseFile::new(&missing).lookup("x").unwrap_err();
        let io = std::fs::metadata(&missing).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("reading the cocoon-net lease file: {}: {io}", missing.display())
        );
        assert_eq!(e.source().map(|s| s.to_string()), Some(io.to_string()));

        let bad = dir.path().join("leases.json");
        std::fs::write(&bad, "{not json").unwrap();
        let e = LeaseFile::new(&bad).lookup("x").unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "reading the cocoon-net lease file: {}: lease file is not a JSON array of leases: ",
                bad.display()
            )),
            "{e}"
        );
        let json = e
            .source()
            .and_then(|s| s.source())
            .expect("the JSON error under the cause");
        assert!(json.downcast_ref::<serde_json::Error>().is_some(), "{json:?}");
    }

    #[test]
    fn lookup_is_case_insensitive_and_skips_expired_and_malformed_rows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leases.json");
        std::fs::write(
            &path,
            r#"[{"mac":"02:4f:1a:9c:33:e1","ip":"172.22.0.17","expiry":"2999-01-01T00:00:00Z"},
                {"mac":"02:8a:04:5e:11:7c","ip":"172.22.0.23","expiry":"2001-01-01T00:00:00+08:00"},
                {"mac":"02:00:00:00:00:01","ip":"172.22.0.9","expiry":"soon"}]"#,
        )
        .unwrap();
        let leases = LeaseFile::new(&path);
        assert_eq!(leases.lookup("02:4F:1A:9C:33:E1").unwrap(), "172.22.0.17");
        assert_eq!(leases.lookup("02:8a:04:5e:11:7c"), Err(LeaseError::NoLease));
        assert_eq!(leases.lookup("02:00:00:00:00:01"), Err(LeaseError::NoLease));
        // Rewritten: the change is seen.
        std::fs::write(
            &path,
            r#"[{"mac":"02:8a:04:5e:11:7c","ip":"172.22.0.99","expiry":"2999-01-01T00:00:00Z"}]"#,
        )
        .unwrap();
        assert_eq!(leases.lookup("02:8a:04:5e:11:7c").unwrap(), "172.22.0.99");
        std::fs::write(&path, "null").unwrap();
        assert_eq!(leases.lookup("02:8a:04:5e:11:7c"), Err(LeaseError::NoLease));
        assert!(matches!(
            LeaseFile::new(dir.path().join("missing")).lookup("x"),
            Err(LeaseError::Unreadable { .. })
        ));
    }

    #[test]
    fn macs_normalise() {
        assert_eq!(normalize_mac("AA-BB-CC-DD-EE-FF").as_deref(), Some("aa:bb:cc:dd:ee:ff"));
        assert_eq!(normalize_mac("zz:bb:cc:dd:ee:ff"), None);
        assert_eq!(normalize_mac(""), None);
    }

    /// A one-shot cocoon-net control socket answering `codes` in turn; returns the request lines.
    async fn serve(path: PathBuf, codes: Vec<u16>) -> tokio::task::JoinHandle<Vec<String>> {
        let listener = tokio::net::UnixListener::bind(&path).unwrap();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            for code in codes {
                let (stream, _) = listener.accept().await.unwrap();
                let (r, mut w) = stream.into_split();
                let mut lines = tokio::io::BufReader::new(r).lines();
                let first = lines.next_line().await.unwrap().unwrap();
                while let Some(l) = lines.next_line().await.unwrap() {
                    if l.is_empty() {
                        break;
                    }
                }
                seen.push(first);
                w.write_all(format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n").as_bytes())
                    .await
                    .unwrap();
            }
            seen
        })
    }

    #[tokio::test]
    async fn a_missing_control_socket_is_named_and_its_error_kept() {
        let dir = tempfile::tempdir().unwrap();
        let err = ControlSocket::new(dir.path().join("none.sock"))
            .release("aa:bb:cc:dd:ee:ff")
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("none.sock: ") && err.to_string().contains("running?"),
            "{err}"
        );
        let io = std::error::Error::source(&err)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the connect error is kept as the source");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    }

    #[tokio::test]
    async fn release_sends_delete_with_the_normalised_mac_and_retries_one_500() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("control.sock");
        let server = serve(path.clone(), vec![500, 204]).await;
        ControlSocket::new(&path).release("AA-BB-CC-DD-EE-FF").await.unwrap();
        assert_eq!(
            server.await.unwrap(),
            vec!["DELETE /v1/leases/aa:bb:cc:dd:ee:ff HTTP/1.1"; 2]
        );

        let path2 = dir.path().join("control2.sock");
        let server = serve(path2.clone(), vec![400]).await;
        let err = ControlSocket::new(&path2)
            .release("aa:bb:cc:dd:ee:ff")
            .await
            .unwrap_err();
        assert!(err.to_string().contains("HTTP 400"), "{err}");
        server.await.unwrap();
        assert!(
            ControlSocket::new(&path2)
                .release("nonsense")
                .await
                .unwrap_err()
                .to_string()
                .contains("invalid MAC")
        );
    }
}
