//! Snapshots over a real registry (Debian's docker-registry): typed manifest reads, push → pull round trip
//! byte for byte, HEAD-before-upload dedupe, shared concurrent pulls, delete with the by-digest fallback,
//! and a registry with token auth (push, pull and delete through the token exchange; refusals typed).

use crate::registry_support;

use crate::runtime_support::{self, Harness};
use registry_support::{TestRegistry, dir_files};
use vk_cocoon::registry::media;
use vk_cocoon::registry::{ManifestLookup, RegistryError};
use vk_cocoon::runtime::{CocoonRuntime, CpuPolicy, RunSpec};

const IMG: &str = "ghcr.io/cocoonstack/cocoon/ubuntu:24.04";

/// A simulator with a running VM `vm` and its snapshot saved as `vm` (multi-file, sparse `cow.raw`).
async fn saved_snapshot(memory: u64) -> (Harness, String) {
    let h = runtime_support::harness();
    h.sim
        .set_settings(|s| {
            s.snapshot_memory_bytes = memory;
            s.snapshot_cow_bytes = 64 << 20;
            s.snapshot_cow_data_bytes = 3 << 20;
        })
        .unwrap();
    h.client.image_pull(IMG, false).await.unwrap();
    let spec = RunSpec {
        name: Some("vm".into()),
        cpu: Some(2),
        cpu_policy: CpuPolicy::default(),
        memory: Some("1Gi".into()),
        storage: Some("20Gi".into()),
        network: Some("cocoon".into()),
        image: IMG.into(),
        ..Default::default()
    };
    let vm = h.client.run(&spec).await.unwrap();
    h.client.snapshot_save("vm", &vm.id).await.unwrap();
    let id = h.client.snapshot_inspect("vm").await.unwrap().id;
    (h, id)
}

async fn export_dir(h: &Harness, name: &str) -> std::collections::BTreeMap<String, (u64, Vec<u8>)> {
    let d = h.dir.path().join(format!("export-{name}"));
    h.client.snapshot_export_to_dir(name, &d).await.unwrap();
    dir_files(&d)
}

/// Checklist rows: snapshots/oci_test
#[tokio::test]
async fn manifest_reads_are_typed_absent_or_unavailable() {
    let mut reg = TestRegistry::start();
    let r = reg.transfer_client("cocoon", "node-a");
    assert_eq!(
        r.manifest("never-pushed", "hibernate").await.unwrap(),
        ManifestLookup::Absent
    );
    assert!(r.snapshot_config("never-pushed", "hibernate").await.unwrap().is_none());
    // Deleting what is not there is done.
    r.delete_manifest("never-pushed", "hibernate").await.unwrap();

    reg.kill();
    let e = r.manifest("never-pushed", "hibernate").await.unwrap_err();
    assert!(e.is_unavailable(), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("never-pushed:hibernate") && msg.contains("unavailable") && msg.contains("retry"),
        "{msg}"
    );
    // The connection's own error stays reachable beneath the words, as the error's source.
    let cause = std::error::Error::source(&e).expect("the connection error is kept as the source");
    assert!(msg.contains(&cause.to_string()), "{msg} / {cause}");
    assert!(
        r.snapshot_config("never-pushed", "hibernate")
            .await
            .unwrap_err()
            .is_unavailable()
    );
    assert!(
        r.delete_manifest("never-pushed", "hibernate")
            .await
            .unwrap_err()
            .is_unavailable()
    );
}

/// Checklist rows: snapshots/pusher_test, snapshots/puller_test
#[tokio::test]
async fn push_then_pull_round_trips_a_sparse_multi_file_snapshot_byte_for_byte() {
    let reg = TestRegistry::start();
    let r = reg.transfer_client("cocoon", "node-a");
    let (h, id) = saved_snapshot(5 << 20).await;

    let rep = r
        .push_snapshot(&h.client, "vm", "vk-ns-vm", "latest", IMG)
        .await
        .unwrap();
    assert_eq!((rep.repo.as_str(), rep.tag.as_str()), ("vk-ns-vm", "latest"));
    assert!(rep.layer_count >= 4, "{rep:?}");

    // The manifest: v1 artifact type, annotations including the from-node amend, digest = the tag's.
    let ManifestLookup::Found(info) = r.manifest("vk-ns-vm", "latest").await.unwrap() else {
        panic!("pushed tag absent")
    };
    assert_eq!(info.artifact_type.as_deref(), Some(media::SNAPSHOT_V1));
    assert_eq!(info.digest, rep.manifest_digest);
    assert_eq!(
        info.annotations.get(media::ANN_BASEIMAGE).map(String::as_str),
        Some(IMG)
    );
    assert_eq!(
        info.annotations.get(media::ANN_FROM_NODE).map(String::as_str),
        Some("node-a")
    );
    let created = &info.annotations[media::ANN_CREATED];
    assert!(
        chrono::DateTime::parse_from_rfc3339(created).is_ok() && created.ends_with('Z'),
        "{created}"
    );

    // The config blob carries the snapshot's identity and every file with its mode and sparse map.
    let cfg = r.snapshot_config("vk-ns-vm", "latest").await.unwrap().expect("config");
    assert_eq!(cfg.snapshot_id, id);
    assert_eq!(cfg.image, IMG);
    assert_eq!(cfg.hypervisor, vk_cocoon::hypervisor::Hypervisor::CloudHypervisor);
    assert_eq!(cfg.schema_version, "v1");
    assert!(
        cfg.files.contains_key("memory-ranges")
            && cfg.files.contains_key("cow.raw")
            && cfg.files.contains_key("cocoon.json"),
        "{:?}",
        cfg.files.keys()
    );
    let cow = &cfg.files["cow.raw"];
    assert!(cow.sparse_map.is_some() && cow.sparse_size == Some(64 << 20), "{cow:?}");
    assert!(!cfg.files.contains_key("snapshot.json"));

    // Pull into another local name and compare every file byte for byte (holes read back as zeros).
    let pulled = r
        .pull_snapshot(&h.client, "vk-ns-vm", "latest", "restored")
        .await
        .unwrap();
    assert_eq!(pulled.snapshot_id, id);
    assert_eq!(pulled.manifest_digest, rep.manifest_digest);
    assert!(!pulled.shared);
    let restored = h.client.snapshot_inspect("restored").await.unwrap();
    assert_eq!(restored.image, IMG);
    let a = export_dir(&h, "vm").await;
    let b = export_dir(&h, "restored").await;
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (name, (size, bytes)) in &a {
        if name == "snapshot.json" {
            continue; // names/IDs differ by design
        }
        assert_eq!(*size, b[name].0, "{name}: apparent size");
        assert!(bytes == &b[name].1, "{name}: contents differ");
    }
    // The restored COW file is sparse again (far fewer blocks than its apparent size).
    let blocks = {
        use std::os::unix::fs::MetadataExt;
        let d = h.dir.path().join("export-restored").join("cow.raw");
        std::fs::metadata(d).unwrap().blocks() * 512
    };
    assert!(blocks < (32 << 20), "cow.raw allocated {blocks} bytes");

    // A second push of the same snapshot uploads no layer again (HEAD before upload).
    let again = r
        .push_snapshot(&h.client, "vm", "vk-ns-vm", "hibernate", IMG)
        .await
        .unwrap();
    assert_eq!(again.uploaded_bytes, 0, "{again:?}");
}

#[tokio::test]
async fn concurrent_pulls_of_one_snapshot_share_one_transfer() {
    let reg = TestRegistry::start();
    let r = reg.transfer_client("", "");
    let (h, id) = saved_snapshot(8 << 20).await;
    r.push_snapshot(&h.client, "vm", "vm", "hibernate", IMG).await.unwrap();
    // No node name: no from-node amend.
    let ManifestLookup::Found(info) = r.manifest("vm", "hibernate").await.unwrap() else {
        panic!()
    };
    assert!(!info.annotations.contains_key(media::ANN_FROM_NODE));

    h.sim.delay("snapshot import", Some(1), 500).unwrap();
    let (a, b, c) = tokio::join!(
        r.pull_snapshot(&h.client, "vm", "hibernate", "vm-hibernate-import"),
        r.pull_snapshot(&h.client, "vm", "hibernate", "vm-hibernate-import"),
        r.pull_snapshot(&h.client, "vm", "hibernate", "vm-hibernate-import"),
    );
    let reps = [a.unwrap(), b.unwrap(), c.unwrap()];
    assert_eq!(reps.iter().filter(|r| !r.shared).count(), 1, "{reps:?}");
    assert!(reps.iter().all(|r| r.snapshot_id == id));
    let imports = h
        .sim
        .calls()
        .unwrap()
        .into_iter()
        .filter(|c| c.verb == "snapshot import")
        .count();
    assert_eq!(imports, 1, "one transfer for three callers");
    h.client.snapshot_inspect("vm-hibernate-import").await.unwrap();
}

#[tokio::test]
async fn delete_manifest_falls_back_to_delete_by_digest_and_treats_404_as_done() {
    let reg = TestRegistry::start();
    let r = reg.transfer_client("cocoon", "node-a");
    let (h, _) = saved_snapshot(1 << 20).await;
    r.push_snapshot(&h.client, "vm", "vk-x", "hibernate", IMG)
        .await
        .unwrap();
    assert!(matches!(
        r.manifest("vk-x", "hibernate").await.unwrap(),
        ManifestLookup::Found(_)
    ));
    // distribution 2.8 refuses DELETE by tag (400 DIGEST_INVALID): the fallback deletes by digest.
    assert_eq!(
        reg.http_status("DELETE", "/v2/cocoon/vk-x/manifests/hibernate"),
        Some(400)
    );
    r.delete_manifest("vk-x", "hibernate").await.unwrap();
    assert_eq!(r.manifest("vk-x", "hibernate").await.unwrap(), ManifestLookup::Absent);
    r.delete_manifest("vk-x", "hibernate").await.unwrap();
}

/// Checklist rows: snapshots/puller_test
#[tokio::test]
async fn pulling_an_absent_tag_says_so() {
    let reg = TestRegistry::start();
    let r = reg.transfer_client("cocoon", "n");
    let h = runtime_support::harness();
    let e = r.pull_snapshot(&h.client, "nope", "hibernate", "x").await.unwrap_err();
    assert!(
        matches!(e.registry(), Some(RegistryError::NotFound { .. })) && !e.is_unavailable(),
        "{e:?}"
    );
    assert!(e.to_string().contains("nope:hibernate"), "{e}");
    assert!(h.sim.calls().unwrap().iter().all(|c| c.verb != "snapshot import"));
}

#[tokio::test]
async fn a_registry_with_token_auth_is_pushed_pulled_and_deleted_through_the_token_exchange() {
    use registry_support::token::User;
    use vk_cocoon::registry::RegistryAuth;
    let reg = tokio::task::spawn_blocking(|| {
        TestRegistry::start_with_token_auth(vec![
            User {
                name: "pusher",
                password: "pw-push",
                actions: &["pull", "push", "delete"],
            },
            User {
                name: "reader",
                password: "pw-read",
                actions: &["pull"],
            },
        ])
    })
    .await
    .unwrap();
    let basic = |u: &str, p: &str| RegistryAuth::Basic(u.into(), p.into());
    let r = reg.transfer_client_as("cocoon", "node-a", basic("pusher", "pw-push"));
    let (h, id) = saved_snapshot(2 << 20).await;

    r.push_snapshot(&h.client, "vm", "vk-t", "hibernate", IMG)
        .await
        .unwrap();
    let ManifestLookup::Found(info) = r.manifest("vk-t", "hibernate").await.unwrap() else {
        panic!("pushed tag absent")
    };
    let pulled = r
        .pull_snapshot(&h.client, "vk-t", "hibernate", "t-restored")
        .await
        .unwrap();
    assert_eq!(pulled.snapshot_id, id);

    // The registry refuses the DELETE a static credential header makes (no token exchange)…
    let static_basic = {
        use base64::Engine as _;
        format!(
            "Authorization: Basic {}\r\n",
            base64::engine::general_purpose::STANDARD.encode("pusher:pw-push")
        )
    };
    let path = format!("/v2/cocoon/vk-t/manifests/{}", info.digest);
    assert_eq!(reg.http_status_with("DELETE", &path, &static_basic), Some(401));
    // …and the daemon's DELETE answers the challenge with a token for the `delete` action.
    r.delete_manifest("vk-t", "hibernate").await.unwrap();
    assert_eq!(r.manifest("vk-t", "hibernate").await.unwrap(), ManifestLookup::Absent);
    let grants = reg.token.as_ref().unwrap().grants();
    assert!(
        grants.iter().any(|(user, scope, granted)| user == "pusher"
            && scope == "repository:cocoon/vk-t:delete"
            && granted == &["delete"]),
        "{grants:?}"
    );

    // A user who may only pull reads the artifact; its push and delete are refused, typed.
    r.push_snapshot(&h.client, "vm", "vk-t", "latest", IMG).await.unwrap();
    let reader = reg.transfer_client_as("cocoon", "node-b", basic("reader", "pw-read"));
    assert!(matches!(
        reader.manifest("vk-t", "latest").await.unwrap(),
        ManifestLookup::Found(_)
    ));
    let e = reader
        .push_snapshot(&h.client, "vm", "vk-t", "other", IMG)
        .await
        .unwrap_err();
    assert!(matches!(e.registry(), Some(RegistryError::Denied { .. })), "{e:?}");
    assert!(
        e.to_string().contains("vk-t:other") && e.to_string().contains("credentials"),
        "{e}"
    );
    let e = reader.delete_manifest("vk-t", "latest").await.unwrap_err();
    assert!(matches!(e, RegistryError::Denied { .. }), "{e:?}");
    assert!(matches!(
        r.manifest("vk-t", "latest").await.unwrap(),
        ManifestLookup::Found(_)
    ));
    // Wrong credentials are refused, never taken for an absent tag.
    let wrong = reg.client_as("cocoon", "n", basic("pusher", "wrong"));
    let e = wrong.manifest("vk-t", "latest").await.unwrap_err();
    assert!(matches!(e, RegistryError::Denied { .. }), "{e:?}");
}
