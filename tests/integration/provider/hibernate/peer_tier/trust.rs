//! What a peer can and cannot do to a wake (issue 35 §5): the registry says what a snapshot is,
//! so a peer that rewrites bytes (and their checksums) can only make the restore fall back; the
//! peer port reads nothing for a caller that merely sniffed the token, and a wake restores only
//! from the node the registry recorded.

use super::*;

/// A peer that rewrites a byte of every slice and recomputes the slice's CRC-32C: the checksum
/// matches, the bytes are not the registry's artifact. The wake must not boot them.
#[tokio::test(flavor = "multi_thread")]
async fn a_peer_that_rewrites_bytes_and_their_checksum_cannot_change_the_restored_guest() {
    let (env, a) = setup(4 << 20).await;
    let (proxy, stop) = tampering_peer(a.addr, Tamper::Rewrite).await;
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
    wake_on_b(&env).await;
    fell_back_to_the_registry(&env, &b, "does not match the registry").await;
    stop.cancel();
}

/// Someone who sniffed the token on the wire asks A's peer port for a hibernated guest's plan
/// and a slice of its memory over plain HTTP.
#[tokio::test(flavor = "multi_thread")]
async fn a_sniffed_token_reads_nothing_from_the_peer_port() {
    let (_env, a) = setup(1 << 20).await;
    let http = reqwest::Client::new();
    let plan = http.get(plan_url(&a, VM)).bearer_auth(TOKEN).send().await;
    if let Ok(r) = &plan {
        assert_ne!(
            r.status().as_u16(),
            200,
            "a caller with only the token read the plan of {VM} from A over plain HTTP"
        );
    }
    let id = a.runtime.snapshot_inspect(VM).await.unwrap().id;
    let slice = format!(
        "http://{}/v1/snapshot-slice?id={id}&file=memory-ranges&offset=0&length=4096",
        a.addr
    );
    if let Ok(r) = http.get(&slice).bearer_auth(TOKEN).send().await {
        assert_ne!(r.status().as_u16(), 200, "a caller with only the token read guest memory");
    }
}

/// An impostor stands at the address B dials for A and knows the token (it forwards to A, so
/// what it serves even looks right): B must not restore from a server that cannot prove it is
/// the node the registry recorded.
#[tokio::test(flavor = "multi_thread")]
async fn a_wake_restores_only_from_the_node_the_registry_recorded() {
    let (env, a) = setup(4 << 20).await;
    let (impostor, stop) = tampering_peer(a.addr, Tamper::Faithful).await;
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
