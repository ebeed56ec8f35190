//! The peer tier of a wake, two nodes on one machine: node A (its own cocoon-sim, the real
//! `PeerServer` on loopback) hibernated the guest into the real registry; node B (the test
//! daemon: fake apiserver, its own cocoon-sim) wakes it through CreatePod. B restores A's raw
//! files when A serves them whole and correct, and otherwise — a flipped byte, a truncated slice,
//! a wrong snapshot id, A down, A's 128 streams busy — pulls from the registry, never booting a
//! bad copy and leaving no staging directory. Both speak mutual TLS with certificates of one
//! fleet CA ([`FLEET`]); A refuses callers without the peer token as well.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use cocoon_sim::Sim;
use http_body_util::StreamBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;
use vk_cocoon::listener::{Limits, Listener};
use vk_cocoon::peer::protocol::{CRC_TRAILER, Plan};
use vk_cocoon::peer::server::MAX_STREAMS;
use vk_cocoon::peer::{
    KubeNodes, PeerClient, PeerMetrics, PeerServer, PeerTier, PeerTls, PeerToken, Staging, Timeouts,
};
use vk_cocoon::provider::ports::SnapshotRegistry;
use vk_cocoon::registry::{RegistryAuth, TransferSettings};
use vk_cocoon::runtime::{CocoonCli, CocoonRuntime};

use crate::provider_support::fleet_ca::FleetCa;
use crate::provider_support::*;
use crate::runtime_support;

mod limits;
mod reclaim;
mod trust;

const IMAGE: &str = "cocoonset.cocoonstack.io/image";
const RESTORE: &str = "vm.cocoonstack.io/restore-from-hibernate";
pub(crate) const TOKEN: &str = "peer-token-for-the-tests-0123456789";
pub(crate) const NODE_A: &str = "node-a";
pub(crate) const VM: &str = "vm-p";

/// The CA of the test fleet: node A, node B (`NODE`) and the impostors' genuine certificates.
pub(crate) static FLEET: LazyLock<FleetCa> = LazyLock::new(|| FleetCa::new("fleet CA"));

/// Sends one GET to a peer port over TLS, as the client `tls` (its certificate), expecting the
/// server to prove it is `node`; the token, when given, as a bearer token.
async fn peer_request(
    addr: SocketAddr,
    tls: &PeerTls,
    node: &str,
    path_and_query: &str,
    token: Option<&str>,
) -> Result<hyper::Response<Incoming>, String> {
    peer_request_with(addr, tls, node, path_and_query, token, &[]).await
}

/// [`peer_request`] with `headers` added to the request.
async fn peer_request_with(
    addr: SocketAddr,
    tls: &PeerTls,
    node: &str,
    path_and_query: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
) -> Result<hyper::Response<Incoming>, String> {
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let stream = tokio_rustls::TlsConnector::from(tls.client())
        .connect(PeerTls::server_name(node)?, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut req = hyper::Request::get(path_and_query).header("host", addr.to_string());
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    sender
        .send_request(req.body(Empty::<Bytes>::new()).unwrap())
        .await
        .map_err(|e| e.to_string())
}

/// [`peer_request`], its body read whole: the status and the bytes.
async fn peer_get(
    addr: SocketAddr,
    tls: &PeerTls,
    node: &str,
    path_and_query: &str,
    token: Option<&str>,
) -> Result<(u16, Bytes), String> {
    let r = peer_request(addr, tls, node, path_and_query, token).await?;
    let status = r.status().as_u16();
    let body = r.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((status, body))
}

/// Node A: a simulator holding the hibernated guest, and its peer server.
pub(crate) struct NodeA {
    _dir: tempfile::TempDir,
    sim: Sim,
    runtime: Arc<CocoonCli>,
    pub(crate) addr: SocketAddr,
    /// The peer port's listener (its open connections, its refusals).
    listener: Arc<Listener>,
    stop: CancellationToken,
}

/// Node A's peer port: the daemon's cap, and handshake and header deadlines short enough for a
/// test to wait for (a client of these tests sends its handshake and headers at once).
fn peer_limits() -> Limits {
    Limits {
        header_timeout: std::time::Duration::from_secs(2),
        handshake_timeout: std::time::Duration::from_secs(2),
        ..Limits::with_cap(256)
    }
}

impl Drop for NodeA {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = self.sim.kill_everything();
    }
}

/// Hibernates `VM` on a fresh node A (save, push `VM:hibernate` with from-node A and `push`'s
/// layout, remove the VM; the seat release keeps the local copy) and serves it.
pub(crate) async fn node_a_pushing(env: &Env, memory_bytes: u64, push: TransferSettings) -> NodeA {
    let dir = tempfile::tempdir().unwrap();
    let sim = Sim::new(dir.path().join("sim")).unwrap();
    sim.set_settings(|s| s.snapshot_memory_bytes = memory_bytes).unwrap();
    let runtime = Arc::new(CocoonCli::new(runtime_support::config(&sim)));
    seed_snapshot_on(&runtime, "base", "ghcr.io/x/base:1").await;
    let vm = clone_direct_on(&runtime, "base", VM, None).await;
    runtime.snapshot_save(VM, &vm.id).await.unwrap();
    runtime.remove(&vm.id).await.unwrap();
    let pusher = env.oci.as_ref().unwrap().server.lock().unwrap().transfer_client_tuned(
        "",
        NODE_A,
        RegistryAuth::Anonymous,
        push,
    );
    pusher
        .push_snapshot(runtime.as_ref(), VM, VM, "hibernate", "base")
        .await
        .unwrap();
    let registry = pusher.registry.clone() as Arc<dyn SnapshotRegistry>;
    // VK_COCOON_SNAPSHOT_DIR: where the simulator keeps its snapshots' data directories.
    let store = sim.snapshot_dir(VM).unwrap().unwrap().parent().unwrap().to_path_buf();
    let server = PeerServer::new(
        NODE_A.into(),
        runtime.clone() as Arc<dyn CocoonRuntime>,
        registry,
        store,
        PeerToken::new(TOKEN).unwrap(),
        MAX_STREAMS,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let peer_listener = PeerServer::listener(&FLEET.node_tls(NODE_A), peer_limits());
    tokio::spawn(server.serve(listener, peer_listener.clone(), stop.clone()));
    NodeA {
        _dir: dir,
        sim,
        runtime,
        addr,
        listener: peer_listener,
        stop,
    }
}

/// Registers node A's Node object with its InternalIP (what B dials).
pub(crate) async fn register_node_a(env: &Env) {
    let nodes: kube::Api<Node> = kube::Api::all(env.server.client());
    let mut node = Node::default();
    node.metadata.name = Some(NODE_A.into());
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let status = serde_json::json!({"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}});
    nodes
        .patch_status(NODE_A, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// Node B: the test daemon with the peer tier dialing `port` on A's InternalIP.
struct NodeB {
    daemon: Daemon,
    staging: PathBuf,
    metrics: PeerMetrics,
    tier: Arc<PeerTier>,
}

fn node_b(env: &Env, port: u16) -> NodeB {
    let staging = env.sim_dir.path().join("vk-staging");
    let daemon = start(env, Options::default());
    let metrics = PeerMetrics::unregistered();
    let tier = Arc::new(PeerTier {
        client: PeerClient::new(
            PeerToken::new(TOKEN).unwrap(),
            &FLEET.node_tls(NODE),
            Staging::new(&staging),
            Timeouts::default(),
        ),
        nodes: Arc::new(KubeNodes::new(env.server.client())),
        port,
        metrics: metrics.clone(),
    });
    daemon.provider.set_peer_tier(tier.clone());
    NodeB {
        daemon,
        staging,
        metrics,
        tier,
    }
}

/// The rebuilt pod of a seat moved to node B.
async fn wake_on_b(env: &Env) {
    create(env, &managed("agent-0", VM, &[(IMAGE, "base"), (RESTORE, "true")])).await;
    eventually(60, "woken on node B", || {
        lifecycle(env, "agent-0").as_deref() == Some("ready") && ready(env, "agent-0")
    })
    .await;
}

fn staging_entries(dir: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd.flatten().map(|e| e.path()).collect(),
        Err(_) => Vec::new(),
    }
}

fn last_clone(env: &Env) -> Vec<String> {
    calls(env, "vm clone").pop().expect("a clone ran")
}

async fn setup(memory_bytes: u64) -> (Env, NodeA) {
    setup_pushing(memory_bytes, TransferSettings::default()).await
}

/// [`setup`], node A pushing with `push`.
async fn setup_pushing(memory_bytes: u64, push: TransferSettings) -> (Env, NodeA) {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let a = node_a_pushing(&env, memory_bytes, push).await;
    register_node_a(&env).await;
    (env, a)
}

/// The wake pulled from the registry after the peer tier failed for `why` (reported in a
/// Warning Event), and left no staging dir.
async fn fell_back_to_the_registry(env: &Env, b: &NodeB, why: &str) {
    eventually(30, &format!("PeerRestoreFailed ({why})"), || {
        events(env, "agent-0")
            .iter()
            .any(|(reason, note)| reason == "PeerRestoreFailed" && note.contains(why))
    })
    .await;
    let clone = last_clone(env);
    assert_eq!(
        clone.last().map(String::as_str),
        Some("vm-p-hibernate-import"),
        "cloned from the registry pull: {clone:?}"
    );
    assert!(!clone.iter().any(|a| a == "--from-dir"), "{clone:?}");
    assert_eq!(b.metrics.count("failed"), 1);
    assert_eq!(b.metrics.count("ok"), 0);
    assert!(
        staging_entries(&b.staging).is_empty(),
        "no staging directory is left: {:?}",
        staging_entries(&b.staging)
    );
    assert_eq!(
        b.tier.client.hold_budget().held(),
        0,
        "received bytes kept for the registry check are all given back"
    );
}

/// Lifecycle: L59.
/// Checklist rows: wakeverify_test/WakeStagesFromPeerAndClonesFromDir
#[tokio::test(flavor = "multi_thread")]
async fn a_guest_hibernated_on_node_a_wakes_on_node_b_from_as_files_staged_sparse() {
    let (env, a) = setup(8 << 20).await;
    let b = node_b(&env, a.addr.port());
    // Hold B's clone, so the staged directory can be looked at while cocoon reads it.
    env.sim.delay("vm clone", Some(1), 10_000).unwrap();
    create(&env, &managed("agent-0", VM, &[(IMAGE, "base"), (RESTORE, "true")])).await;
    eventually(60, "B's clone running", || {
        !env.sim.pids_of("vm clone").unwrap().is_empty()
    })
    .await;
    let staged = staging_entries(&b.staging);
    assert_eq!(staged.len(), 1, "{staged:?}");
    let source = a.sim.snapshot_dir(VM).unwrap().unwrap();
    for name in ["memory-ranges", "cow.raw", "config.json", "state.json", "cocoon.json"] {
        let (want, got) = (source.join(name), staged[0].join(name));
        assert_eq!(
            std::fs::read(&got).unwrap(),
            std::fs::read(&want).unwrap(),
            "{name} is A's file, byte for byte"
        );
    }
    let (cow_a, cow_b) = (
        std::fs::metadata(source.join("cow.raw")).unwrap(),
        std::fs::metadata(staged[0].join("cow.raw")).unwrap(),
    );
    assert_eq!(cow_b.len(), cow_a.len(), "the apparent size");
    assert!(
        cow_b.blocks() * 512 < cow_b.len() / 4,
        "the staged disk stays sparse: {} bytes allocated of {}",
        cow_b.blocks() * 512,
        cow_b.len()
    );
    let envelope: serde_json::Value =
        serde_json::from_slice(&std::fs::read(staged[0].join("snapshot.json")).unwrap()).unwrap();
    assert_eq!(envelope["config"]["name"], VM);
    assert_eq!(
        envelope["config"]["id"],
        a.runtime.snapshot_inspect(VM).await.unwrap().id.as_str()
    );

    eventually(60, "woken on node B", || {
        lifecycle(&env, "agent-0").as_deref() == Some("ready") && ready(&env, "agent-0")
    })
    .await;
    let clone = last_clone(&env);
    let at = clone.iter().position(|a| a == "--from-dir").expect("cloned --from-dir");
    assert_eq!(Path::new(&clone[at + 1]), staged[0].as_path());
    assert!(
        calls(&env, "snapshot import").is_empty(),
        "nothing pulled from the registry"
    );
    assert!(!has_event(&env, "agent-0", "PeerRestoreFailed"));
    assert_eq!(b.metrics.count("ok"), 1);
    assert_eq!(b.metrics.restore_duration.get_sample_count(), 1);
    assert!(
        staging_entries(&b.staging).is_empty(),
        "the staged directory goes after the clone"
    );
    let hold = b.tier.client.hold_budget();
    assert!(hold.peak() > 0, "the registry check took received bytes from memory");
    assert_eq!(hold.held(), 0, "and gave every kept byte back");
    assert!(vm_named(&env, VM).await.is_some());
    drop(b.daemon);
}

/// Lifecycle: L60.
/// Checklist rows: wakeverify_test/WakePeerUnreachableFallsBackToPull
#[tokio::test(flavor = "multi_thread")]
async fn node_a_down_falls_back_to_the_registry() {
    let (env, a) = setup(1 << 20).await;
    let port = a.addr.port();
    drop(a);
    // Nothing listens on A's port now (the server stopped with its node).
    eventually(10, "A's listener closed", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
    })
    .await;
    let b = node_b(&env, port);
    wake_on_b(&env).await;
    fell_back_to_the_registry(&env, &b, "Connection refused").await;
}

/// How the tampering peer in front of A misbehaves.
#[derive(Clone, Copy, PartialEq)]
enum Tamper {
    WrongSnapshotId,
    FlipByte,
    Truncate,
    /// Rewrites a byte and sends the checksum of the rewritten bytes (an attacker who controls
    /// the stream can always make the CRC match).
    Rewrite,
    /// Forwards everything untouched: an impostor that knows the token stands where A should.
    Faithful,
}

#[derive(Clone)]
struct Proxy {
    upstream: SocketAddr,
    mode: Tamper,
    /// How the proxy reaches A: a client of the fleet.
    to_a: PeerTls,
}

/// A peer in front of A that forwards every request (token included) and spoils the answers.
/// It presents `identity` to B: node A's genuine certificate for a compromised A, another
/// node's or a forged one for an impostor.
async fn tampering_peer(upstream: SocketAddr, mode: Tamper, identity: &PeerTls) -> (SocketAddr, CancellationToken) {
    let proxy = Proxy {
        upstream,
        mode,
        to_a: FLEET.node_tls("node-proxy"),
    };
    let app = axum::Router::new()
        .route("/v1/snapshot-plan", axum::routing::get(proxied_plan))
        .route("/v1/snapshot-slice", axum::routing::get(proxied_slice))
        .with_state(proxy);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let served = Listener::new("tampering peer", peer_limits(), Some(identity.server.clone()));
    tokio::spawn(served.serve(listener, app, stop.clone()));
    (addr, stop)
}

async fn forward(p: &Proxy, path: &str, headers: &HeaderMap, q: &HashMap<String, String>) -> Bytes {
    let query = form_urlencoded::Serializer::new(String::new()).extend_pairs(q).finish();
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let (status, body) = peer_get(p.upstream, &p.to_a, NODE_A, &format!("{path}?{query}"), token)
        .await
        .unwrap();
    assert_eq!(status, 200, "A answered the proxy: {}", String::from_utf8_lossy(&body));
    body
}

async fn proxied_plan(
    State(p): State<Proxy>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let r = forward(&p, "/v1/snapshot-plan", &headers, &q).await;
    let mut plan: Plan = serde_json::from_slice(&r).unwrap();
    if p.mode == Tamper::WrongSnapshotId {
        plan.snapshot_id = "SOMEONE-ELSES-SAVE".into();
    }
    axum::Json(plan).into_response()
}

async fn proxied_slice(
    State(p): State<Proxy>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let r = forward(&p, "/v1/snapshot-slice", &headers, &q).await;
    let mut bytes = r.to_vec();
    let mut crc = crc32c::crc32c(&bytes);
    match p.mode {
        // The checksum of the true bytes over spoiled ones.
        Tamper::FlipByte => {
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
        }
        // A consistent checksum, but not all the bytes.
        Tamper::Truncate => {
            bytes.truncate(bytes.len() / 2);
            crc = crc32c::crc32c(&bytes);
        }
        Tamper::Rewrite => {
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x40;
            crc = crc32c::crc32c(&bytes);
        }
        Tamper::WrongSnapshotId | Tamper::Faithful => {}
    }
    let frames = futures::stream::iter(vec![
        Ok::<_, std::io::Error>(Frame::data(Bytes::from(bytes))),
        Ok(Frame::trailers({
            let mut t = HeaderMap::new();
            t.insert(CRC_TRAILER, HeaderValue::from_str(&format!("{crc:08x}")).unwrap());
            t
        })),
    ]);
    let mut r = Response::new(Body::new(StreamBody::new(frames)));
    // hyper sends only the trailer fields the response announces.
    r.headers_mut().insert("trailer", HeaderValue::from_static(CRC_TRAILER));
    r
}

/// A wake through a compromised node A (it holds A's genuine certificate) that spoils its
/// answers the way `mode` says.
async fn tampered_wake_falls_back(mode: Tamper, why: &str) {
    let (env, a) = setup(4 << 20).await;
    let (proxy, stop) = tampering_peer(a.addr, mode, &FLEET.node_tls(NODE_A)).await;
    let b = node_b(&env, proxy.port());
    wake_on_b(&env).await;
    fell_back_to_the_registry(&env, &b, why).await;
    stop.cancel();
}

/// Lifecycle: L60.
/// Checklist rows: wakeverify_test/WakePeerMismatchFallsBackToPull
#[tokio::test(flavor = "multi_thread")]
async fn a_flipped_byte_falls_back_to_the_registry() {
    // The slice's CRC trailer names the true bytes; B does not rely on it (TLS covers the
    // transit, the registry's digests everything): the digest check refuses the copy.
    tampered_wake_falls_back(Tamper::FlipByte, "does not match the registry").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_truncated_slice_falls_back_to_the_registry() {
    tampered_wake_falls_back(Tamper::Truncate, "truncated").await;
}

/// Lifecycle: L60.
/// Checklist rows: wakeverify_test/WakePeerMismatchFallsBackToPull
#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_snapshot_id_falls_back_to_the_registry() {
    tampered_wake_falls_back(Tamper::WrongSnapshotId, "is not the registry's").await;
}

fn plan_path(name: &str) -> String {
    format!("/v1/snapshot-plan?name={name}")
}

/// Checklist rows: snapshots/peer_test
#[tokio::test(flavor = "multi_thread")]
async fn node_a_serves_only_authenticated_peers_and_only_its_own_hibernated_guests() {
    let (env, a) = setup(1 << 20).await;
    // A node of the fleet (its certificate is accepted); the token is the second factor.
    let b = FLEET.node_tls(NODE);
    let get = |path: String, token: Option<&'static str>| {
        let b = b.clone();
        let addr = a.addr;
        async move { peer_get(addr, &b, NODE_A, &path, token).await.unwrap() }
    };
    assert_eq!(get(plan_path(VM), None).await.0, 401);
    assert_eq!(get(plan_path(VM), Some("not-the-peer-token-at-all")).await.0, 401);
    let slice = "/v1/snapshot-slice?id=X&file=memory-ranges&offset=0&length=1".to_string();
    assert_eq!(get(slice, None).await.0, 401, "slices too");
    let (status, body) = get(plan_path(VM), Some(TOKEN)).await;
    assert_eq!(status, 200);
    let plan: Plan = serde_json::from_slice(&body).unwrap();
    assert_eq!(plan.snapshot_id, a.runtime.snapshot_inspect(VM).await.unwrap().id);
    assert!(plan.files.iter().any(|f| f.name == "memory-ranges"));
    // A snapshot of A that was not hibernated from A (no such tag): not served.
    assert_eq!(get(plan_path("base"), Some(TOKEN)).await.0, 404);
    // Another node's hibernated guest: refused even though A has a copy of it.
    let other = env
        .oci
        .as_ref()
        .unwrap()
        .server
        .lock()
        .unwrap()
        .transfer_client("", "node-c");
    other
        .push_snapshot(a.runtime.as_ref(), "base", "vk-other", "hibernate", "base")
        .await
        .unwrap();
    assert_eq!(get(plan_path("vk-other"), Some(TOKEN)).await.0, 403);
    // Slices only of a snapshot a plan was served for, plain names only.
    let ungranted = "/v1/snapshot-slice?id=NOPE&file=memory-ranges&offset=0&length=1".to_string();
    assert_eq!(get(ungranted, Some(TOKEN)).await.0, 403);
    let escape = format!(
        "/v1/snapshot-slice?id={}&file=..%2Fx&offset=0&length=1",
        plan.snapshot_id
    );
    assert_eq!(get(escape, Some(TOKEN)).await.0, 400);
    assert_eq!(get("/v1/snapshot-plan".into(), Some(TOKEN)).await.0, 400);
}

/// The wire contract's CRC-32C trailer: a client that accepts trailers (`TE: trailers`) gets
/// each slice's checksum; one that does not (HTTP/1.1 would drop the trailer for it) is sent
/// none, and the serving node does not spend a checksum of every byte on it.
#[tokio::test(flavor = "multi_thread")]
async fn a_slice_carries_its_crc_trailer_only_for_a_client_that_asks_for_trailers() {
    let (_env, a) = setup(1 << 20).await;
    let b = FLEET.node_tls(NODE);
    let (status, body) = peer_get(a.addr, &b, NODE_A, &plan_path(VM), Some(TOKEN)).await.unwrap();
    assert_eq!(status, 200);
    let plan: Plan = serde_json::from_slice(&body).unwrap();
    let memory = plan.files.iter().find(|f| f.name == "memory-ranges").unwrap();
    let vk_cocoon::peer::protocol::Slice { offset, length } = memory.slices[0];
    let path = format!(
        "/v1/snapshot-slice?id={}&file=memory-ranges&offset={offset}&length={length}",
        plan.snapshot_id
    );
    let asking = peer_request_with(a.addr, &b, NODE_A, &path, Some(TOKEN), &[("te", "trailers")])
        .await
        .unwrap();
    assert_eq!(asking.status(), 200);
    assert_eq!(
        asking.headers().get("trailer").map(|v| v.to_str().unwrap()),
        Some(CRC_TRAILER)
    );
    let collected = asking.into_body().collect().await.unwrap();
    let crc = collected
        .trailers()
        .and_then(|t| t.get(CRC_TRAILER))
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = collected.to_bytes();
    assert_eq!(bytes.len() as u64, length);
    assert_eq!(
        crc,
        Some(format!("{:08x}", crc32c::crc32c(&bytes))),
        "the slice's own checksum"
    );

    let silent = peer_request(a.addr, &b, NODE_A, &path, Some(TOKEN)).await.unwrap();
    assert_eq!(silent.status(), 200);
    assert!(
        silent.headers().get("trailer").is_none(),
        "no trailer is announced to a client that does not accept one"
    );
    let collected = silent.into_body().collect().await.unwrap();
    assert!(collected.trailers().is_none());
    assert_eq!(collected.to_bytes(), bytes, "the same bytes");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_with_every_stream_busy_answers_503_and_the_wake_falls_back() {
    // 32 MiB of memory: a slice stream nobody reads stays open (the socket buffers fill).
    let (env, a) = setup(32 << 20).await;
    let tls = FLEET.node_tls(NODE);
    let (_, body) = peer_get(a.addr, &tls, NODE_A, &plan_path(VM), Some(TOKEN))
        .await
        .unwrap();
    let plan: Plan = serde_json::from_slice(&body).unwrap();
    let mem = plan.files.iter().find(|f| f.name == "memory-ranges").unwrap();
    let path = format!(
        "/v1/snapshot-slice?id={}&file=memory-ranges&offset=0&length={}",
        plan.snapshot_id, mem.slices[0].length
    );
    // One connection per stream, each left unread.
    let mut held = Vec::new();
    for _ in 0..MAX_STREAMS {
        let r = peer_request(a.addr, &tls, NODE_A, &path, Some(TOKEN)).await.unwrap();
        assert_eq!(r.status().as_u16(), 200);
        held.push(r);
    }
    let over = peer_request(a.addr, &tls, NODE_A, &path, Some(TOKEN)).await.unwrap();
    assert_eq!(over.status().as_u16(), 503, "stream {} is refused", MAX_STREAMS + 1);
    let b = node_b(&env, a.addr.port());
    wake_on_b(&env).await;
    fell_back_to_the_registry(&env, &b, "503 Service Unavailable").await;
    drop(held);
}

/// Checklist rows: wakeverify_test/WakePeerSelfNodeSkipsPeerPath
#[tokio::test(flavor = "multi_thread")]
async fn a_guest_hibernated_on_this_very_node_skips_the_peer_tier() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    // Hibernated here (from-node = this node), its local copy since lost.
    let vm = clone_direct_on(&env.runtime, "base", VM, None).await;
    env.runtime.snapshot_save(VM, &vm.id).await.unwrap();
    env.runtime.remove(&vm.id).await.unwrap();
    env.oci
        .as_ref()
        .unwrap()
        .client
        .push_snapshot(env.runtime.as_ref(), VM, VM, "hibernate", "base")
        .await
        .unwrap();
    env.runtime.snapshot_remove_if_exists(VM).await.unwrap();
    let b = node_b(&env, 9);
    wake_on_b(&env).await;
    assert_eq!(
        last_clone(&env).last().map(String::as_str),
        Some("vm-p-hibernate-import")
    );
    assert_eq!((b.metrics.count("ok"), b.metrics.count("failed")), (0, 0), "not tried");
    assert!(!has_event(&env, "agent-0", "PeerRestoreFailed"));
}
