//! The peer snapshot server on `VK_PEER_ADDR`: hands a hibernated guest's
//! raw snapshot files to the node that wakes it. It speaks only mutual TLS (a caller without a
//! fleet node's certificate never gets a request in: [`super::tls`]), and every request must
//! also carry the peer token (401 otherwise); a plan is served only for a snapshot whose
//! `:hibernate` manifest names this node as `from-node` (403 otherwise), and slices only of a
//! snapshot a plan was served for, so an authenticated peer still cannot read an arbitrary
//! snapshot's files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Extension;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http_body_util::StreamBody;
use hyper::body::Frame;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::auth::PeerToken;
use super::extents::{self, MAX_COALESCED_HOLE, MAX_SLICE};
use super::protocol::{self, CRC_TRAILER, ENVELOPE_FILE, Plan, PlanFile};
use super::tls::PeerTls;
use crate::listener::headers::header_list;
use crate::listener::throttle::Throttled;
use crate::listener::{ClientCertificates, Limits, Listener};
use crate::provider::ports::SnapshotRegistry;
use crate::registry::media::ANN_FROM_NODE;
use crate::runtime::CocoonRuntime;

/// Concurrent slice streams; one more is answered 503 (the client falls back to the registry).
pub const MAX_STREAMS: usize = 128;
/// How long a served plan lets its peer fetch slices.
const GRANT_TTL: Duration = Duration::from_secs(3600);
const READ_CHUNK: usize = 1 << 20;

/// What the server reads from.
pub struct PeerServer {
    pub node_name: String,
    pub runtime: Arc<dyn CocoonRuntime>,
    pub registry: Arc<dyn SnapshotRegistry>,
    /// `VK_COCOON_SNAPSHOT_DIR`: cocoon's localfile store, `<dir>/<snapshot id>/<file>`.
    pub snapshot_dir: PathBuf,
    pub token: PeerToken,
    streams: Arc<Semaphore>,
    /// Snapshot ids a plan was served for, and when.
    granted: Mutex<HashMap<String, Instant>>,
    /// Requests refused for want of the token: counted, warned about once a minute.
    unauthenticated: Throttled,
}

/// The warning about unauthenticated requests comes at most this often (each one is logged at
/// debug): the port is reachable before any authentication, so a caller must not be able to
/// flood the log by knocking.
const UNAUTHENTICATED_WARNING_EVERY: Duration = Duration::from_secs(60);

impl PeerServer {
    pub fn new(
        node_name: String,
        runtime: Arc<dyn CocoonRuntime>,
        registry: Arc<dyn SnapshotRegistry>,
        snapshot_dir: PathBuf,
        token: PeerToken,
        max_streams: usize,
    ) -> Arc<Self> {
        Arc::new(Self {
            node_name,
            runtime,
            registry,
            snapshot_dir,
            token,
            streams: Arc::new(Semaphore::new(max_streams)),
            granted: Mutex::default(),
            unauthenticated: Throttled::new(UNAUTHENTICATED_WARNING_EVERY),
        })
    }

    pub fn router(self: Arc<Self>) -> Router {
        Router::new()
            .route(protocol::PLAN_PATH, get(plan))
            .route(protocol::SLICE_PATH, get(slice))
            .with_state(self)
    }

    /// The peer port's listener: mutual TLS with `tls`, within `limits`.
    pub fn listener(tls: &PeerTls, limits: Limits) -> Arc<Listener> {
        Listener::new("peer", limits, Some(tls.server.clone()))
    }

    /// Serves on `tcp` through `listener` (see [`PeerServer::listener`]) until `shutdown`. A
    /// listener without TLS is refused: guest memory never crosses the network in clear.
    pub async fn serve(
        self: Arc<Self>,
        tcp: tokio::net::TcpListener,
        listener: Arc<Listener>,
        shutdown: CancellationToken,
    ) {
        if !listener.is_tls() {
            tracing::error!(
                "the peer server was given a plain-HTTP listener and does not serve (a wiring bug: build it with PeerServer::listener)"
            );
            return;
        }
        listener.serve(tcp, self.router(), shutdown).await;
    }

    /// The 401 for a caller without the peer token; `None` when it has it.
    fn unauthenticated(&self, headers: &HeaderMap) -> Option<Response> {
        let presented = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        if self.token.admits(presented) {
            return None;
        }
        tracing::debug!("peer request without a valid token refused");
        if let Some(refused_total) = self.unauthenticated.note() {
            tracing::warn!(
                refused_total,
                "peer requests without a valid token are refused (a peer with another VK_PEER_TOKEN_FILE, or someone probing the port); counted, and said again at most once a minute"
            );
        }
        let mut r = (StatusCode::UNAUTHORIZED, "peer token required\n").into_response();
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        Some(r)
    }

    fn grant(&self, id: &str) {
        let mut g = self.granted.lock().expect("grants lock");
        g.retain(|_, at| at.elapsed() < GRANT_TTL);
        g.insert(id.to_string(), Instant::now());
    }

    fn is_granted(&self, id: &str) -> bool {
        let g = self.granted.lock().expect("grants lock");
        g.get(id).is_some_and(|at| at.elapsed() < GRANT_TTL)
    }

    /// The refusal when this node may not serve `name`'s snapshot; `None` when it may.
    async fn forbidden(&self, name: &str) -> Option<Response> {
        let tag = crate::provider::plan::HIBERNATE_SNAPSHOT_TAG;
        match self.registry.manifest(name, tag).await {
            Ok(Some(a)) if a.annotations.get(ANN_FROM_NODE) == Some(&self.node_name) => None,
            Ok(Some(a)) => Some(text(
                StatusCode::FORBIDDEN,
                format!(
                    "{name}:{tag} was hibernated from node {:?}, not this node",
                    a.annotations.get(ANN_FROM_NODE).map(String::as_str).unwrap_or("")
                ),
            )),
            Ok(None) => Some(text(StatusCode::NOT_FOUND, format!("{name}:{tag} does not exist"))),
            Err(e) => Some(text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot check {name}:{tag} in the registry: {e}"),
            )),
        }
    }
}

fn text(status: StatusCode, message: String) -> Response {
    (status, format!("{message}\n")).into_response()
}

/// Who asked, for the log: the subject of the client's certificate (TLS verified it).
fn caller(client: Option<&ClientCertificates>) -> String {
    client
        .and_then(ClientCertificates::leaf)
        .and_then(|leaf| crate::kubelet_api::tls::certs::subject_of(leaf.as_ref()))
        .map_or_else(|| "(no certificate)".to_string(), |(cn, _)| cn)
}

async fn plan(
    State(s): State<Arc<PeerServer>>,
    client: Option<Extension<ClientCertificates>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(r) = s.unauthenticated(&headers) {
        return r;
    }
    let Some(name) = q.get("name").filter(|n| !n.is_empty()) else {
        return text(StatusCode::BAD_REQUEST, "missing query parameter name".into());
    };
    if !protocol::plain_name(name) {
        return text(StatusCode::BAD_REQUEST, format!("{name:?} is not a snapshot name"));
    }
    if let Some(r) = s.forbidden(name).await {
        return r;
    }
    let record = match s.runtime.snapshot_inspect(name).await {
        Ok(r) => r,
        Err(e) if e.is_not_found() => return text(StatusCode::NOT_FOUND, format!("no local snapshot {name}")),
        Err(e) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("inspect snapshot {name}: {e}"),
            );
        }
    };
    if !protocol::plain_name(&record.id) {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("snapshot {name} has id {:?}", record.id),
        );
    }
    let dir = s.snapshot_dir.join(&record.id);
    let files = match tokio::task::spawn_blocking(move || list_files(&dir)).await {
        Ok(Ok(files)) => files,
        Ok(Err(e)) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("read the files of snapshot {name} ({}): {e}", record.id),
            );
        }
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("plan task failed: {e}")),
    };
    s.grant(&record.id);
    let plan = Plan {
        snapshot_id: record.id,
        files,
    };
    let caller = caller(client.as_ref().map(|Extension(c)| c));
    tracing::info!(snapshot = %name, id = %plan.snapshot_id, files = plan.files.len(), bytes = plan.data_bytes(), %caller, "serving a snapshot plan to a peer");
    axum::Json(plan).into_response()
}

/// The regular files of a snapshot directory (name order) with their data slices.
fn list_files(dir: &Path) -> std::io::Result<Vec<PlanFile>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_file() && protocol::plain_name(&name) && name != ENVELOPE_FILE {
            names.push(name);
        }
    }
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let file = std::fs::File::open(dir.join(&name))?;
            let size = file.metadata()?.len();
            let data = extents::data_extents(&file, size)?;
            Ok(PlanFile {
                slices: extents::slices(&data, MAX_COALESCED_HOLE, MAX_SLICE),
                name,
                size,
            })
        })
        .collect()
}

async fn slice(
    State(s): State<Arc<PeerServer>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Some(r) = s.unauthenticated(&headers) {
        return r;
    }
    let (id, file) = match (q.get("id"), q.get("file")) {
        (Some(id), Some(file)) if protocol::plain_name(id) && protocol::plain_name(file) && file != ENVELOPE_FILE => {
            (id, file)
        }
        _ => return text(StatusCode::BAD_REQUEST, "id and file must be plain names".into()),
    };
    let number = |k: &str| q.get(k).and_then(|v| v.parse::<u64>().ok());
    let (Some(offset), Some(length)) = (number("offset"), number("length")) else {
        return text(
            StatusCode::BAD_REQUEST,
            "offset and length must be decimal integers".into(),
        );
    };
    if length == 0 || length > MAX_SLICE {
        return text(StatusCode::BAD_REQUEST, format!("length must be 1..={MAX_SLICE}"));
    }
    if !s.is_granted(id) {
        return text(StatusCode::FORBIDDEN, format!("no plan was served for snapshot {id}"));
    }
    let Ok(permit) = s.streams.clone().try_acquire_owned() else {
        tracing::warn!(snapshot = %id, "peer slice refused: every stream slot is busy");
        return text(StatusCode::SERVICE_UNAVAILABLE, "too many slice streams".into());
    };
    let path = s.snapshot_dir.join(id).join(file);
    let f = match open_regular(&path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return text(StatusCode::NOT_FOUND, format!("snapshot {id} has no file {file}"));
        }
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("open {file}: {e}")),
    };
    let size = match f.metadata().await {
        Ok(m) => m.len(),
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("stat {file}: {e}")),
    };
    if offset.checked_add(length).is_none_or(|end| end > size) {
        return text(
            StatusCode::RANGE_NOT_SATISFIABLE,
            format!("{offset}+{length} passes the end of {file} ({size} bytes)"),
        );
    }
    let mut f = f.into_std().await;
    if let Err(e) = std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(offset)) {
        return text(StatusCode::INTERNAL_SERVER_ERROR, format!("seek {file}: {e}"));
    }
    // The CRC is computed only for a client that accepts trailers: HTTP/1.1 sends none to one
    // that did not ask, and a checksum of every byte sent is a visible share of this node's CPU.
    let crc = accepts_trailers(&headers).then_some(0u32);
    let body = async_stream::stream! {
        // The slot is held until the body is done or dropped.
        let _permit = permit;
        let (mut f, mut left, mut crc) = (f, length, crc);
        while left > 0 {
            let len = READ_CHUNK.min(left as usize);
            // The file goes to the blocking pool and comes back with the chunk it read.
            let read = tokio::task::spawn_blocking(move || read_chunk(f, len, crc)).await;
            let chunk = match read.map_err(std::io::Error::other).and_then(|r| r) {
                Ok((file, chunk, next_crc)) => {
                    f = file;
                    crc = next_crc;
                    chunk
                }
                Err(e) => {
                    yield Err(e);
                    return;
                }
            };
            left -= len as u64;
            yield Ok(Frame::data(chunk));
        }
        if let Some(crc) = crc {
            let mut trailers = HeaderMap::new();
            trailers.insert(CRC_TRAILER, HeaderValue::from_str(&protocol::crc_text(crc)).expect("hex is a header value"));
            yield Ok(Frame::trailers(trailers));
        }
    };
    let mut r = Response::new(Body::new(StreamBody::new(body)));
    if crc.is_some() {
        r.headers_mut()
            .insert(header::TRAILER, HeaderValue::from_static(CRC_TRAILER));
    }
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    r
}

/// Reads the next `len` bytes of `file` into a fresh buffer (never zero-filled first: a memset
/// of every byte sent is a visible share of the serving node's CPU) and extends `crc`, when one
/// is kept, over them. A file that ends early is an error.
fn read_chunk(
    mut file: std::fs::File,
    len: usize,
    crc: Option<u32>,
) -> std::io::Result<(std::fs::File, Bytes, Option<u32>)> {
    use std::io::Read;
    let mut buf = Vec::with_capacity(len);
    (&mut file).take(len as u64).read_to_end(&mut buf)?;
    if buf.len() < len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("the file ended {} bytes early", len - buf.len()),
        ));
    }
    let crc = crc.map(|crc| crc32c::crc32c_append(crc, &buf));
    Ok((file, Bytes::from(buf), crc))
}

/// Whether the request's `TE` header lists `trailers` (its entries may carry parameters, any
/// case).
fn accepts_trailers(headers: &HeaderMap) -> bool {
    header_list(headers, header::TE.as_str()).iter().any(|entry| {
        entry
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .eq_ignore_ascii_case("trailers")
    })
}

/// Opens a regular file without following a symlink in its last component.
async fn open_regular(path: &Path) -> std::io::Result<tokio::fs::File> {
    let f = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .await?;
    if !f.metadata().await?.is_file() {
        return Err(std::io::Error::new(std::io::ErrorKind::NotFound, "not a regular file"));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trailers_are_accepted_only_when_te_lists_them() {
        let te = |values: &[&str]| {
            let mut h = HeaderMap::new();
            for v in values {
                h.append(header::TE, HeaderValue::from_str(v).unwrap());
            }
            accepts_trailers(&h)
        };
        assert!(te(&["trailers"]));
        assert!(te(&["gzip;q=0.5, Trailers"]));
        assert!(te(&["gzip", " trailers ;q=1"]));
        assert!(!te(&[]));
        assert!(!te(&["gzip, deflate"]));
        assert!(!te(&["x-trailers"]));
    }
}
