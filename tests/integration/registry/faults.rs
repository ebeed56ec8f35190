//! Failures against a real registry: the registry killed mid-push and mid-pull, or frozen mid-push (the
//! stall timeout), the export dying mid-push,
//! a corrupted or truncated blob in the registry's storage, an unknown layer media type. No partial
//! artifact is ever left under a tag, no unverified snapshot is left in cocoon, and errors say what happened.

use crate::registry_support;

use crate::runtime_support::{self, Harness};
use registry_support::{TestRegistry, push_raw_artifact};
use std::time::Duration;
use vk_cocoon::registry::{ManifestLookup, RegistryAuth, RegistryError, TransferSettings};
use vk_cocoon::runtime::{CocoonRuntime, CpuPolicy, RunSpec};

const IMG: &str = "ghcr.io/cocoonstack/cocoon/ubuntu:24.04";

async fn saved_snapshot(memory: u64) -> (Harness, String) {
    let h = runtime_support::harness();
    h.sim.set_settings(|s| s.snapshot_memory_bytes = memory).unwrap();
    h.client.image_pull(IMG, false).await.unwrap();
    let spec = RunSpec {
        name: Some("vm".into()),
        cpu: Some(1),
        cpu_policy: CpuPolicy::default(),
        memory: Some("1Gi".into()),
        image: IMG.into(),
        ..Default::default()
    };
    let vm = h.client.run(&spec).await.unwrap();
    h.client.snapshot_save("vm", &vm.id).await.unwrap();
    let id = h.client.snapshot_inspect("vm").await.unwrap().id;
    (h, id)
}

#[tokio::test]
async fn registry_killed_mid_push_leaves_no_tag_and_says_so() {
    let mut reg = TestRegistry::start();
    let r = reg.transfer_client("cocoon", "node-a");
    let (h, _) = saved_snapshot(192 << 20).await;
    let push = r.push_snapshot(&h.client, "vm", "vk-a", "latest", IMG);
    let killer = async {
        // Kill once the registry holds part of an upload (bounded by time: a loaded machine
        // starts the upload late).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::time::Instant::now() < deadline {
            if reg.upload_bytes() > 0 {
                reg.kill();
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    };
    let (res, killed) = tokio::join!(push, killer);
    assert!(killed, "the push never started uploading");
    let e = res.expect_err("push must fail when the registry dies");
    assert!(e.is_unavailable(), "{e:?}");
    let msg = e.to_string();
    eprintln!("error: {msg}");
    assert!(
        msg.contains("vk-a:latest") && msg.contains("registry unavailable") && msg.contains("retry"),
        "{msg}"
    );

    reg.restart();
    assert_eq!(
        r.manifest("vk-a", "latest").await.unwrap(),
        ManifestLookup::Absent,
        "no partial artifact under the tag"
    );
}

#[tokio::test]
async fn a_push_to_a_registry_that_stops_answering_fails_after_the_stall_timeout_and_leaves_no_tag() {
    let reg = TestRegistry::start();
    let tuned = TransferSettings {
        stall_timeout: Duration::from_secs(3),
        progress_interval: Duration::from_secs(1),
        ..TransferSettings::default()
    };
    let r = reg.transfer_client_tuned("cocoon", "node-a", RegistryAuth::Anonymous, tuned);
    let (h, _) = saved_snapshot(192 << 20).await;
    let push = r.push_snapshot(&h.client, "vm", "vk-s", "latest", IMG);
    let freezer = async {
        // Freeze once the registry holds part of an upload: its sockets stay open, nothing moves.
        // (Bounded by time, not by polls: a loaded machine starts the upload late.)
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while tokio::time::Instant::now() < deadline {
            if reg.upload_bytes() > 0 {
                reg.freeze();
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    };
    let (res, frozen) = tokio::join!(push, freezer);
    assert!(frozen, "the push never started uploading");
    reg.thaw();
    let e = res.expect_err("a stalled push must fail, not hang");
    assert!(e.is_unavailable(), "{e:?}");
    let msg = e.to_string();
    eprintln!("error: {msg}");
    assert!(
        // A stall mid-body, or (when the frozen registry's socket buffers took the whole body)
        // a stall waiting for its answer: both are the stall timeout.
        msg.contains("vk-s:latest")
            && (msg.contains("no byte moved for") || msg.contains("no complete answer within"))
            && msg.contains("SNAPSHOT_STALL_TIMEOUT_SECONDS")
            && msg.contains("retry"),
        "{msg}"
    );
    assert_eq!(
        r.manifest("vk-s", "latest").await.unwrap(),
        ManifestLookup::Absent,
        "no partial artifact under the tag"
    );
}

#[tokio::test]
async fn export_dying_mid_push_leaves_no_tag() {
    let reg = TestRegistry::start();
    let r = reg.transfer_client("cocoon", "node-a");
    // Past the budget's whole-file size, so the export dies under a streamed upload.
    let (h, _) = saved_snapshot(48 << 20).await;
    h.sim.die_next("snapshot export", 20 << 20).unwrap();
    let e = r
        .push_snapshot(&h.client, "vm", "vk-b", "hibernate", IMG)
        .await
        .unwrap_err();
    assert!(!e.is_unavailable(), "{e:?}");
    let msg = e.to_string();
    eprintln!("error: {msg}");
    assert!(
        msg.contains("vk-b:hibernate") && msg.contains("snapshot export vm") && msg.contains("nothing was tagged"),
        "{msg}"
    );
    assert_eq!(r.manifest("vk-b", "hibernate").await.unwrap(), ManifestLookup::Absent);
}

#[tokio::test]
async fn registry_killed_mid_pull_leaves_no_snapshot_and_says_so() {
    let mut reg = TestRegistry::start();
    let r = reg.transfer_client("cocoon", "node-a");
    let (h, _) = saved_snapshot(192 << 20).await;
    r.push_snapshot(&h.client, "vm", "vk-c", "hibernate", IMG)
        .await
        .unwrap();
    // The import sleeps before reading, so the transfer parks mid-stream: its stdin pipe fills
    // with blob bytes the registry sent. The registry dies then.
    h.sim.delay("snapshot import", Some(1), 3_000).unwrap();
    let pull = r.pull_snapshot(&h.client, "vk-c", "hibernate", "vk-c-hibernate-import");
    let killer = async {
        runtime_support::eventually(60, "blob bytes waiting in the import's stdin", || {
            h.sim
                .stdin_pending("snapshot import")
                .unwrap()
                .is_some_and(|n| n >= 32 << 10)
        })
        .await;
        reg.kill();
    };
    let (res, ()) = tokio::join!(pull, killer);
    let e = res.expect_err("pull must fail when the registry dies");
    let msg = e.to_string();
    eprintln!("error: {msg}");
    assert!(e.is_unavailable(), "{e:?}");
    assert!(
        msg.contains("vk-c:hibernate") && msg.contains("downloading blob"),
        "{msg}"
    );
    let gone = h.client.snapshot_inspect("vk-c-hibernate-import").await.unwrap_err();
    assert!(
        gone.is_snapshot_not_found(),
        "a partial import was registered: {gone:?}"
    );
    assert!(
        h.sim.calls().unwrap().iter().any(|c| c.verb == "snapshot import"),
        "the import had started"
    );
}

async fn pushed_with_blob(reg: &TestRegistry, h: &Harness, id: &str, repo: &str) -> std::path::PathBuf {
    let r = reg.transfer_client("", "n");
    r.push_snapshot(&h.client, "vm", repo, "latest", IMG).await.unwrap();
    let mem = std::fs::read(h.dir.path().join("snapshots").join(id).join("memory-ranges")).unwrap();
    let digest = {
        use sha2::Digest;
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(&mem)))
    };
    let p = reg.blob_path(&digest);
    assert!(p.exists(), "memory blob at {}", p.display());
    p
}

#[tokio::test]
async fn a_corrupted_blob_is_detected_on_pull() {
    let reg = TestRegistry::start();
    let r = reg.transfer_client("", "n");
    let (h, id) = saved_snapshot(4 << 20).await;
    let blob = pushed_with_blob(&reg, &h, &id, "vk-d").await;
    let mut bytes = std::fs::read(&blob).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();

    let e = r
        .pull_snapshot(&h.client, "vk-d", "latest", "d-restored")
        .await
        .unwrap_err();
    assert!(matches!(e.registry(), Some(RegistryError::Corrupt { .. })), "{e:?}");
    let msg = e.to_string();
    eprintln!("error: {msg}");
    assert!(
        msg.contains("vk-d:latest")
            && msg.contains("corrupt")
            && msg.contains("memory-ranges")
            && msg.contains("re-push"),
        "{msg}"
    );
    assert!(
        h.client
            .snapshot_inspect("d-restored")
            .await
            .unwrap_err()
            .is_snapshot_not_found()
    );
}

#[tokio::test]
async fn a_truncated_blob_is_detected_on_pull() {
    let reg = TestRegistry::start();
    let r = reg.transfer_client("", "n");
    let (h, id) = saved_snapshot(4 << 20).await;
    let blob = pushed_with_blob(&reg, &h, &id, "vk-e").await;
    let bytes = std::fs::read(&blob).unwrap();
    std::fs::write(&blob, &bytes[..bytes.len() - 4096]).unwrap();
    let e = r
        .pull_snapshot(&h.client, "vk-e", "latest", "e-restored")
        .await
        .unwrap_err();
    // Either the registry's short body or our size check: never a silent success.
    assert!(
        matches!(
            e.registry(),
            Some(RegistryError::Corrupt { .. } | RegistryError::Unavailable { .. })
        ),
        "{e:?}"
    );
    assert!(
        h.client
            .snapshot_inspect("e-restored")
            .await
            .unwrap_err()
            .is_snapshot_not_found()
    );
}

#[tokio::test]
async fn an_unknown_layer_media_type_is_refused_before_any_import() {
    let reg = TestRegistry::start();
    let r = reg.transfer_client("", "n");
    let h = runtime_support::harness();
    push_raw_artifact(
        &reg,
        "odd",
        "latest",
        "application/vnd.cocoonstack.snapshot.v1+json",
        (
            "application/vnd.cocoonstack.snapshot.config.v1+json",
            br#"{"schemaVersion":"v1","snapshotId":"X","files":{}}"#,
        ),
        &[(
            "application/vnd.oci.image.layer.v1.tar+gzip",
            "memory-ranges",
            vec![1, 2, 3],
        )],
    )
    .await;
    let e = r.pull_snapshot(&h.client, "odd", "latest", "odd").await.unwrap_err();
    assert!(
        matches!(e.registry(), Some(RegistryError::UnsupportedMediaType { .. })),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("application/vnd.oci.image.layer.v1.tar+gzip") && e.to_string().contains("odd:latest"),
        "{e}"
    );
    assert!(h.sim.calls().unwrap().iter().all(|c| c.verb != "snapshot import"));
}
