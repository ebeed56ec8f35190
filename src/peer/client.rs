//! The peer restore client: fetches a hibernated guest's files
//! from the node it was hibernated on and lays them out for `vm clone --from-dir`.
//!
//! Nothing from the peer is trusted: the plan's snapshot id must be the registry config's (the
//! trust anchor), its files and sizes the registry's, its slices must lie within their files,
//! every slice must arrive whole, and the staged files must hash to the registry's blob digests
//! ([`super::verify`]). A slice carries no checksum of its own: TLS detects any accident in
//! transit, and the digests anything else. Any failure removes
//! the staging directory, so a bad, partial or rewritten transfer can never be booted; the caller
//! then falls back to the registry.

use std::net::SocketAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{Request, StatusCode, header};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::sync::Semaphore;

use super::arrivals::{Arrivals, HOLD_LIMIT, HoldBudget};
use super::auth::PeerToken;
use super::protocol::{self, ENVELOPE_FILE, Plan, PlanError, Slice};
use super::staging::{SliceWriter, StagedFile, Staging};
use super::tls::PeerTls;
use super::verify;
use crate::registry::content::FileContent;

/// Restores one node runs at a time (a third waits).
pub const MAX_RESTORES: usize = 2;
/// Slice requests in flight across the node's restores.
pub const MAX_FETCHES: usize = 32;
/// A file's slices are fetched over at most this many connections at once.
pub const GROUPS_PER_FILE: usize = 8;
/// The most one slice request asks for. A file's requests are dealt to its connections in turn,
/// so the landed front of the file advances at the whole transfer's pace and the registry check
/// hashing behind it is never far behind; small enough for that, large enough that a request's
/// round trip stays negligible.
pub const REQUEST_BYTES: u64 = 8 << 20;
/// A plan larger than this is refused (it lists files and ranges, never data).
const MAX_PLAN_BYTES: usize = 16 << 20;

#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub dial: Duration,
    /// From sending a request to its response headers.
    pub header: Duration,
    /// Longest pause between two body frames.
    pub stall: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            dial: Duration::from_secs(3),
            header: Duration::from_secs(10),
            stall: Duration::from_secs(30),
        }
    }
}

/// Why a peer restore failed (the wake then pulls from the registry).
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("connect to peer {addr}: {detail}")]
    Connect { addr: SocketAddr, detail: String },
    #[error("peer {addr} answered {status} to {what}: {body}")]
    Status {
        addr: SocketAddr,
        what: String,
        status: StatusCode,
        body: String,
    },
    #[error("peer {addr}: {what}: {detail}")]
    Transfer {
        addr: SocketAddr,
        what: String,
        detail: String,
    },
    #[error("peer {addr} sent an unusable plan: {0}", addr = .1)]
    Plan(PlanError, SocketAddr),
    #[error("the copy of peer {addr} does not match the registry's artifact: {detail}")]
    Mismatch { addr: SocketAddr, detail: String },
    #[error("staging {what}: {source}")]
    Staging {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// A restored snapshot directory; removed when this drops (after the clone).
#[derive(Debug)]
pub struct Restored {
    pub dir: tempfile::TempDir,
    /// Bytes received and bytes written (the difference stayed holes).
    pub received: u64,
    pub written: u64,
}

pub struct PeerClient {
    token: PeerToken,
    tls: PeerTls,
    staging: Staging,
    timeouts: Timeouts,
    restores: Semaphore,
    fetches: Arc<Semaphore>,
    /// Landed bytes kept for the registry check, across all of this node's restores.
    hold: Arc<HoldBudget>,
}

impl PeerClient {
    /// A client that speaks only TLS, presenting this node's certificate and accepting only the
    /// peer the registry recorded ([`PeerTls`]); `token` is sent inside the session as a second
    /// factor.
    pub fn new(token: PeerToken, tls: &PeerTls, staging: Staging, timeouts: Timeouts) -> Self {
        Self {
            token,
            tls: tls.clone(),
            staging,
            timeouts,
            restores: Semaphore::new(MAX_RESTORES),
            fetches: Arc::new(Semaphore::new(MAX_FETCHES)),
            hold: HoldBudget::new(HOLD_LIMIT),
        }
    }

    /// What this node's restores keep in memory for their registry checks (now, and at most).
    pub fn hold_budget(&self) -> &HoldBudget {
        &self.hold
    }

    pub fn staging(&self) -> &Staging {
        &self.staging
    }

    /// Restores snapshot `name` from the peer at `addr` into a fresh staging directory, checks
    /// every file against `files` (what the registry says they are), and writes `envelope` (the
    /// registry config's `snapshot.json`) last as its completeness marker.
    pub async fn restore(
        &self,
        addr: SocketAddr,
        node: &str,
        name: &str,
        want_id: &str,
        envelope: &[u8],
        files: &[FileContent],
    ) -> Result<Restored, RestoreError> {
        // Declared first, dropped last: after every buffer this restore drops itself.
        let _hold = self.hold.enter();
        let _slot = self
            .restores
            .acquire()
            .await
            .expect("the restore semaphore is never closed");
        let plan = self.fetch_plan(addr, node, name).await?;
        protocol::check_plan(&plan, want_id).map_err(|e| RestoreError::Plan(e, addr))?;
        verify::check_plan(&plan, files).map_err(|detail| RestoreError::Mismatch { addr, detail })?;
        let dir = self.staging.fresh(name).map_err(|source| RestoreError::Staging {
            what: format!("a directory under {}", self.staging.root().display()),
            source,
        })?;
        tracing::info!(snapshot = %name, %addr, dir = %dir.path().display(), bytes = plan.data_bytes(), "restoring a snapshot from its peer");
        let mut landing = verify::Landing::new();
        let mut groups = Vec::new();
        for f in &plan.files {
            let path = dir.path().join(&f.name);
            let staging_err = |source| RestoreError::Staging {
                what: path.display().to_string(),
                source,
            };
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o640)
                .open(&path)
                .map_err(staging_err)?;
            file.set_len(f.size).map_err(staging_err)?;
            // The hasher takes the bytes of the registry's data segments from memory.
            let segments = files
                .iter()
                .find(|c| c.name == f.name)
                .map(|c| c.segments.clone())
                .unwrap_or_default();
            let file = Arc::new(StagedFile::new(file));
            let arrivals = Arc::new(Arrivals::keeping(segments, self.hold.clone()));
            landing.insert(f.name.clone(), arrivals.clone());
            for requests in take_turns(&f.slices) {
                groups.push((f.name.as_str(), file.clone(), arrivals.clone(), requests));
            }
        }
        // Only bytes the registry vouches for are ever cloned; the directory goes if they differ.
        // The parts are hashed behind the transfer, as their bytes land.
        let parallel = std::thread::available_parallelism().map_or(2, |n| n.get());
        let hashing = {
            let (dir, files, landing) = (dir.path().to_path_buf(), files.to_vec(), landing.clone());
            tokio::spawn(async move { verify::hash_parts(&dir, &files, &landing, parallel).await })
        };
        let transfers = futures::future::try_join_all(groups.iter().map(|(name, file, arrivals, requests)| {
            self.fetch_group(
                addr,
                node,
                &plan.snapshot_id,
                name,
                requests,
                file.clone(),
                arrivals.clone(),
            )
        }))
        .await;
        let settle = |arrivals: &Arrivals| match transfers {
            Ok(_) => arrivals.finish(),
            Err(_) => arrivals.abort(),
        };
        landing.values().for_each(|a| settle(a));
        let hashed = hashing
            .await
            .map_err(|e| format!("the hashing task failed: {e}"))
            .and_then(|r| r);
        let (mut received, mut written) = (0, 0);
        for (r, w) in transfers? {
            received += r;
            written += w;
        }
        let checked = async {
            hashed?;
            verify::check_sizes(dir.path(), files)?;
            verify::check_holes_of(dir.path(), files, parallel).await
        };
        checked
            .await
            .map_err(|detail| RestoreError::Mismatch { addr, detail })?;
        // Written last: cocoon takes its presence to mean the directory is complete.
        let marker = dir.path().join(ENVELOPE_FILE);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&marker)
            .and_then(|mut f| std::io::Write::write_all(&mut f, envelope))
            .map_err(|source| RestoreError::Staging {
                what: marker.display().to_string(),
                source,
            })?;
        Ok(Restored { dir, received, written })
    }

    async fn fetch_plan(&self, addr: SocketAddr, node: &str, name: &str) -> Result<Plan, RestoreError> {
        let what = format!("the plan of {name}");
        let mut conn = self.connect(addr, node).await?;
        let query = form_urlencoded::Serializer::new(String::new())
            .append_pair("name", name)
            .finish();
        let resp = self
            .send(&mut conn, addr, &format!("{}?{query}", protocol::PLAN_PATH), &what)
            .await?;
        let mut body = resp.into_body();
        let mut bytes = Vec::new();
        while let Some(frame) = self.next_frame(&mut body, addr, &what).await? {
            if let Ok(data) = frame.into_data() {
                bytes.extend_from_slice(&data);
                if bytes.len() > MAX_PLAN_BYTES {
                    return Err(transfer(addr, &what, format!("larger than {MAX_PLAN_BYTES} bytes")));
                }
            }
        }
        serde_json::from_slice(&bytes).map_err(|e| transfer(addr, &what, format!("not a plan document: {e}")))
    }

    /// Fetches slices of one file in order over one connection, reporting each chunk to
    /// `arrivals` once it is on disk; `(received, written)`.
    #[allow(clippy::too_many_arguments)]
    async fn fetch_group(
        &self,
        addr: SocketAddr,
        node: &str,
        id: &str,
        file_name: &str,
        slices: &[Slice],
        file: Arc<StagedFile>,
        arrivals: Arc<Arrivals>,
    ) -> Result<(u64, u64), RestoreError> {
        let mut conn: Option<SendRequest<Empty<Bytes>>> = None;
        let (mut received, mut written) = (0, 0);
        for s in slices {
            let _fetch = self
                .fetches
                .acquire()
                .await
                .expect("the fetch semaphore is never closed");
            let what = format!("slice {file_name}@{}+{}", s.offset, s.length);
            // Reuse the group's connection while the peer keeps it open.
            let reusable = match conn.as_mut() {
                Some(c) => c.ready().await.is_ok(),
                None => false,
            };
            if !reusable {
                conn = Some(self.connect(addr, node).await?);
            }
            let c = conn.as_mut().expect("connected above");
            let query = form_urlencoded::Serializer::new(String::new())
                .append_pair("id", id)
                .append_pair("file", file_name)
                .append_pair("offset", &s.offset.to_string())
                .append_pair("length", &s.length.to_string())
                .finish();
            let resp = self
                .send(c, addr, &format!("{}?{query}", protocol::SLICE_PATH), &what)
                .await?;
            let mut body = resp.into_body();
            let mut writer = SliceWriter::new(file.clone(), s.offset).landing_in(arrivals.clone());
            let mut got = 0u64;
            while let Some(frame) = self.next_frame(&mut body, addr, &what).await? {
                if let Ok(data) = frame.into_data() {
                    got += data.len() as u64;
                    if got > s.length {
                        return Err(transfer(addr, &what, format!("more than {} bytes", s.length)));
                    }
                    writer.push(&data).await.map_err(|e| staging_io(file_name, e))?;
                }
            }
            if got != s.length {
                return Err(transfer(addr, &what, format!("truncated: {got} of {} bytes", s.length)));
            }
            writer.flush().await.map_err(|e| staging_io(file_name, e))?;
            received += got;
            written += writer.written;
        }
        Ok((received, written))
    }

    /// A TLS connection to `addr` that proves to be `node` (see [`PeerTls`]).
    async fn connect(&self, addr: SocketAddr, node: &str) -> Result<SendRequest<Empty<Bytes>>, RestoreError> {
        let err = |detail: String| RestoreError::Connect { addr, detail };
        let name = PeerTls::server_name(node).map_err(err)?;
        let tcp = tokio::time::timeout(self.timeouts.dial, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| err(format!("no connection within {:?}", self.timeouts.dial)))?
            .map_err(|e| err(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        let connector = tokio_rustls::TlsConnector::from(self.tls.client());
        let tls = tokio::time::timeout(self.timeouts.dial, connector.connect(name, tcp))
            .await
            .map_err(|_| err(format!("no TLS handshake within {:?}", self.timeouts.dial)))?
            .map_err(|e| {
                err(format!(
                    "TLS with node {node}: {e} (its certificate must chain to VK_PEER_CA_FILE and name {node}; this node's must be accepted by it)"
                ))
            })?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| err(e.to_string()))?;
        // The connection task ends when the sender drops.
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    async fn send(
        &self,
        conn: &mut SendRequest<Empty<Bytes>>,
        addr: SocketAddr,
        path_and_query: &str,
        what: &str,
    ) -> Result<hyper::Response<Incoming>, RestoreError> {
        let req = Request::get(path_and_query)
            .header(header::HOST, addr.to_string())
            .header(header::AUTHORIZATION, self.token.header())
            .body(Empty::new())
            .map_err(|e| transfer(addr, what, e.to_string()))?;
        let resp = tokio::time::timeout(self.timeouts.header, conn.send_request(req))
            .await
            .map_err(|_| {
                transfer(
                    addr,
                    what,
                    format!("no response headers within {:?}", self.timeouts.header),
                )
            })?
            .map_err(|e| transfer(addr, what, e.to_string()))?;
        if resp.status() != StatusCode::OK {
            let status = resp.status();
            let body = tokio::time::timeout(self.timeouts.stall, resp.into_body().collect())
                .await
                .ok()
                .and_then(|r| r.ok())
                .map(|b| {
                    String::from_utf8_lossy(&b.to_bytes())
                        .trim()
                        .chars()
                        .take(512)
                        .collect()
                })
                .unwrap_or_default();
            return Err(RestoreError::Status {
                addr,
                what: what.to_string(),
                status,
                body,
            });
        }
        Ok(resp)
    }

    async fn next_frame(
        &self,
        body: &mut Incoming,
        addr: SocketAddr,
        what: &str,
    ) -> Result<Option<hyper::body::Frame<Bytes>>, RestoreError> {
        match tokio::time::timeout(self.timeouts.stall, body.frame()).await {
            Err(_) => Err(transfer(addr, what, format!("stalled for {:?}", self.timeouts.stall))),
            Ok(None) => Ok(None),
            Ok(Some(Ok(frame))) => Ok(Some(frame)),
            Ok(Some(Err(e))) => Err(transfer(addr, what, e.to_string())),
        }
    }
}

/// The plan's slices cut into requests of at most [`REQUEST_BYTES`] and dealt to at most
/// [`GROUPS_PER_FILE`] connections in turn (each connection's requests in file order).
fn take_turns(slices: &[Slice]) -> Vec<Vec<Slice>> {
    let mut requests = Vec::new();
    for s in slices {
        let mut at = s.offset;
        let end = s.offset + s.length;
        while at < end {
            let length = (end - at).min(REQUEST_BYTES);
            requests.push(Slice { offset: at, length });
            at += length;
        }
    }
    let connections = requests.len().clamp(1, GROUPS_PER_FILE);
    let mut groups = vec![Vec::new(); connections];
    for (i, request) in requests.into_iter().enumerate() {
        groups[i % connections].push(request);
    }
    groups.retain(|g| !g.is_empty());
    groups
}

fn transfer(addr: SocketAddr, what: &str, detail: String) -> RestoreError {
    RestoreError::Transfer {
        addr,
        what: what.to_string(),
        detail,
    }
}

fn staging_io(file: &str, source: std::io::Error) -> RestoreError {
    RestoreError::Staging {
        what: format!("write {file}"),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(offset: u64, length: u64) -> Slice {
        Slice { offset, length }
    }

    #[test]
    fn requests_are_cut_and_dealt_to_the_connections_in_turn() {
        const M: u64 = REQUEST_BYTES;
        // 20 requests of one 160-request-byte slice, and a short tail slice.
        let groups = take_turns(&[s(0, 20 * M), s(30 * M, 5)]);
        assert_eq!(groups.len(), GROUPS_PER_FILE);
        assert_eq!(groups[0], [s(0, M), s(8 * M, M), s(16 * M, M)]);
        assert_eq!(groups[4], [s(4 * M, M), s(12 * M, M), s(30 * M, 5)]);
        let mut all: Vec<Slice> = groups.concat();
        all.sort_by_key(|r| r.offset);
        assert_eq!(all.iter().map(|r| r.length).sum::<u64>(), 20 * M + 5, "every byte once");
        assert!(all.windows(2).all(|w| w[0].offset + w[0].length <= w[1].offset));
        assert_eq!(take_turns(&[s(7, 3)]), [[s(7, 3)]]);
        assert!(take_turns(&[]).is_empty());
    }
}
