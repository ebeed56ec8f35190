//! What a peer can and cannot do to a wake (issue 35 §5): the registry says what a snapshot is,
//! so a peer that rewrites bytes (and their checksums) can only make the restore fall back; the
//! peer port reads nothing for a caller that merely sniffed the token (it speaks only mutual
//! TLS), and a wake restores only from the node the registry recorded (its certificate must
//! name that node).

use super::*;

/// A peer that rewrites a byte of every slice and recomputes the slice's CRC-32C: the checksum
/// matches, the bytes are not the registry's artifact. The wake must not boot them — even when
/// the peer is node A itself (compromised: it holds A's genuine certificate).
#[tokio::test(flavor = "multi_thread")]
async fn a_peer_that_rewrites_bytes_and_their_checksum_cannot_change_the_restored_guest() {
    let (env, a) = setup(4 << 20).await;
    let (proxy, stop) = tampering_peer(a.addr, Tamper::Rewrite, &FLEET.node_tls(NODE_A)).await;
    let b = node_b(&env, proxy.port());
    // Hold B's clone so what it reads can be compared with the registry's artifact (A's files
    // are what was pushed).
    env.sim.delay("vm clone", Some(1), 10_000).unwrap();
    create(&env, &managed("agent-0", VM, &[(IMAGE, "base"), (RESTORE, "true")])).await;
    eventually(60, "B's clone running", || {
        !env.sim.pids_of("vm clone").unwrap().is_empty()
    })
    .await;
    let clone = last_clone(&env);
    if let Some(at) = clone.iter().position(|a| a == "--from-dir") {
        let staged = PathBuf::from(&clone[at + 1]);
        let source = a.sim.snapshot_dir(VM).unwrap().unwrap();
        for name in ["memory-ranges", "cow.raw", "config.json", "state.json", "cocoon.json"] {
            assert!(
                std::fs::read(staged.join(name)).unwrap() == std::fs::read(source.join(name)).unwrap(),
                "B is booting the peer's bytes for {name}, which are not the registry's artifact"
            );
        }
    }
    eventually(60, "woken on node B", || {
        lifecycle(&env, "agent-0").as_deref() == Some("ready") && ready(&env, "agent-0")
    })
    .await;
    fell_back_to_the_registry(&env, &b, "does not match the registry").await;
    stop.cancel();
}

/// Someone who sniffed the token on the wire asks A's peer port for a hibernated guest's plan
/// and a slice of its memory: over plain HTTP, and over TLS without a certificate of the fleet.
#[tokio::test(flavor = "multi_thread")]
async fn a_sniffed_token_reads_nothing_from_the_peer_port() {
    let (_env, a) = setup(1 << 20).await;
    let http = reqwest::Client::new();
    let plan = http
        .get(format!("http://{}{}", a.addr, plan_path(VM)))
        .bearer_auth(TOKEN)
        .send()
        .await;
    if let Ok(r) = &plan {
        assert_ne!(
            r.status().as_u16(),
            200,
            "a caller with only the token read the plan of {VM} from A over plain HTTP"
        );
    }
    let id = a.runtime.snapshot_inspect(VM).await.unwrap().id;
    let slice = format!("/v1/snapshot-slice?id={id}&file=memory-ranges&offset=0&length=4096");
    if let Ok(r) = http
        .get(format!("http://{}{slice}", a.addr))
        .bearer_auth(TOKEN)
        .send()
        .await
    {
        assert_ne!(
            r.status().as_u16(),
            200,
            "a caller with only the token read guest memory"
        );
    }
    // TLS, the token, and a certificate naming a node — from a CA the fleet does not trust.
    let stranger = FleetCa::new("someone's CA").node_tls(NODE);
    let refused = peer_get(a.addr, &stranger, NODE_A, &plan_path(VM), Some(TOKEN)).await;
    assert!(refused.is_err(), "a stranger's certificate got an answer: {refused:?}");
    // TLS and the token without any certificate.
    let anonymous = FLEET.tls_with(Arc::new(vk_cocoon::kubelet_api::tls::CertSlot::default()));
    let refused = peer_get(a.addr, &anonymous, NODE_A, &plan_path(VM), Some(TOKEN)).await;
    assert!(
        refused.is_err(),
        "a client without a certificate got an answer: {refused:?}"
    );
    // What the port does answer: a node of the fleet with the token.
    let (status, _) = peer_get(a.addr, &FLEET.node_tls(NODE), NODE_A, &plan_path(VM), Some(TOKEN))
        .await
        .unwrap();
    assert_eq!(status, 200);
}

/// An impostor stands at the address B dials for A and knows the token (it forwards to A, so
/// what it serves even looks right): B must not restore from a server that cannot prove it is
/// the node the registry recorded. Here the impostor is another node of the fleet, with its own
/// genuine certificate (a forged one, of another CA, is refused by `peer::tls`'s tests).
#[tokio::test(flavor = "multi_thread")]
async fn a_wake_restores_only_from_the_node_the_registry_recorded() {
    let (env, a) = setup(4 << 20).await;
    let (impostor, stop) = tampering_peer(a.addr, Tamper::Faithful, &FLEET.node_tls("node-c")).await;
    let b = node_b(&env, impostor.port());
    wake_on_b(&env).await;
    assert_eq!(
        b.metrics.count("ok"),
        0,
        "B restored {VM} from a server that only knew the token: {:?}",
        last_clone(&env)
    );
    fell_back_to_the_registry(&env, &b, "certificate").await;
    stop.cancel();
}

/// The server itself refuses a listener without TLS: a wiring mistake cannot put guest memory
/// on the network in clear.
#[tokio::test(flavor = "multi_thread")]
async fn the_peer_server_never_serves_plain_http() {
    let (env, a) = setup(1 << 20).await;
    let registry = env.oci.as_ref().unwrap().client.registry.clone() as Arc<dyn SnapshotRegistry>;
    let store = a.sim.snapshot_dir(VM).unwrap().unwrap().parent().unwrap().to_path_buf();
    let server = PeerServer::new(
        NODE_A.into(),
        a.runtime.clone() as Arc<dyn CocoonRuntime>,
        registry,
        store,
        PeerToken::new(TOKEN).unwrap(),
        MAX_STREAMS,
    );
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let plain = Listener::new("peer", peer_limits(), None);
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        server.serve(tcp, plain, CancellationToken::new()),
    )
    .await
    .expect("serving on a plain-HTTP listener ends at once");
    let answer = reqwest::Client::new()
        .get(format!("http://{addr}{}", plan_path(VM)))
        .bearer_auth(TOKEN)
        .send()
        .await;
    assert!(answer.is_err(), "the port answered plain HTTP: {answer:?}");
}

/// Chunks of 1 MiB, uncompressed (`SNAPSHOT_CHUNK_SIZE_MIB=1`): each chunk's digest covers a
/// piece of a file's data, so the copy is checked chunk by chunk.
fn chunked() -> TransferSettings {
    TransferSettings {
        chunk_size: 1 << 20,
        ..TransferSettings::default()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chunked_v2_snapshot_is_checked_chunk_by_chunk_and_restored_from_its_peer() {
    let (env, a) = setup_pushing(4 << 20, chunked()).await;
    let b = node_b(&env, a.addr.port());
    wake_on_b(&env).await;
    assert_eq!((b.metrics.count("ok"), b.metrics.count("failed")), (1, 0));
    assert!(
        last_clone(&env).iter().any(|a| a == "--from-dir"),
        "{:?}",
        last_clone(&env)
    );
    assert!(
        calls(&env, "snapshot import").is_empty(),
        "nothing pulled from the registry"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rewritten_chunk_makes_the_wake_pull_from_the_registry() {
    let (env, a) = setup_pushing(4 << 20, chunked()).await;
    let (proxy, stop) = tampering_peer(a.addr, Tamper::Rewrite, &FLEET.node_tls(NODE_A)).await;
    let b = node_b(&env, proxy.port());
    wake_on_b(&env).await;
    // The memory file is 4 chunks: the rewritten byte lies in one of them, which is named.
    fell_back_to_the_registry(&env, &b, "of the file) hashes to").await;
    stop.cancel();
}

/// zstd layers' digests cover compressed bytes: a copy of the file cannot be checked against
/// them, so such a snapshot is never taken from a peer (not a failure: nothing was tried).
#[tokio::test(flavor = "multi_thread")]
async fn a_compressed_v2_snapshot_is_never_taken_from_a_peer() {
    let zstd = TransferSettings {
        zstd_level: 3,
        ..TransferSettings::default()
    };
    let (env, a) = setup_pushing(4 << 20, zstd).await;
    let b = node_b(&env, a.addr.port());
    wake_on_b(&env).await;
    assert_eq!(
        last_clone(&env).last().map(String::as_str),
        Some("vm-p-hibernate-import"),
        "pulled from the registry"
    );
    assert_eq!((b.metrics.count("ok"), b.metrics.count("failed")), (0, 0), "not tried");
    assert!(!has_event(&env, "agent-0", "PeerRestoreFailed"));
}
