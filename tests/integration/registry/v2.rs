//! v2 artifacts (zstd-compressed, chunked layers; `config.files[title].chunks` authoritative) and image
//! indexes (resolved to linux/amd64). The reader is tested on a v1 push rewritten by hand into v2 the way
//! the Go daemon lays it out (chunk layers out of order, so only the config's order works) and wrapped in
//! an index; the writer (`SNAPSHOT_ZSTD_LEVEL`, `SNAPSHOT_CHUNK_SIZE_MIB`) on a guest-like snapshot, whose
//! artifact is checked layer by layer against that layout and pulled back byte for byte.

use crate::registry_support;

use crate::runtime_support;
use registry_support::{TestRegistry, dir_files};
use serde_json::{Value, json};
use sha2::Digest;
use tokio::io::AsyncWriteExt;
use vk_cocoon::registry::media;
use vk_cocoon::registry::{RegistryAuth, RegistryError, TransferSettings};
use vk_cocoon::runtime::{CocoonRuntime, CpuPolicy, RunSpec};

const IMG: &str = "ghcr.io/cocoonstack/cocoon/ubuntu:24.04";

fn digest(b: &[u8]) -> String {
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(b)))
}

async fn zstd(b: &[u8]) -> Vec<u8> {
    let mut enc = async_compression::tokio::write::ZstdEncoder::new(Vec::new());
    enc.write_all(b).await.unwrap();
    enc.shutdown().await.unwrap();
    enc.into_inner()
}

struct Setup {
    reg: TestRegistry,
    h: runtime_support::Harness,
    id: String,
    v2_digest: String,
}

/// A real snapshot `vm` pushed as `vm:latest` (v1), rewritten as `vm:v2` (v2) and wrapped in `vm:idx`.
async fn setup() -> Setup {
    let reg = TestRegistry::start();
    let r = reg.transfer_client("", "n");
    let h = runtime_support::harness();
    h.sim.set_settings(|s| s.snapshot_memory_bytes = 3 << 20).unwrap();
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
    r.push_snapshot(&h.client, "vm", "vm", "latest", IMG).await.unwrap();

    use oci_client::client::{ClientConfig, ClientProtocol};
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    });
    let anon = oci_client::secrets::RegistryAuth::Anonymous;
    let at = |tag: &str| oci_client::Reference::with_tag(reg.host(), "vm".into(), tag.into());
    client
        .auth(&at("latest"), &anon, oci_client::RegistryOperation::Push)
        .await
        .unwrap();
    let (raw, v1_digest) = client
        .pull_manifest_raw(&at("latest"), &anon, &[media::OCI_MANIFEST])
        .await
        .unwrap();
    let mut m: Value = serde_json::from_slice(&raw).unwrap();
    let cfg_digest = m["config"]["digest"].as_str().unwrap().to_string();
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(reg.blob_path(&cfg_digest)).unwrap()).unwrap();

    // memory-ranges → two zstd chunks; every other layer stays raw.
    let mut layers = Vec::new();
    for l in m["layers"].as_array().unwrap().clone() {
        if l["annotations"][media::ANN_TITLE] != "memory-ranges" {
            layers.push(l);
            continue;
        }
        let bytes = std::fs::read(reg.blob_path(l["digest"].as_str().unwrap())).unwrap();
        let (a, b) = bytes.split_at(bytes.len() / 2 + 7);
        let mut chunks = Vec::new();
        for (i, part) in [a, b].iter().enumerate() {
            let z = zstd(part).await;
            let d = digest(&z);
            client.push_blob(&at("v2"), z.clone(), &d).await.unwrap();
            chunks.push(d.clone());
            layers.push(json!({"mediaType": format!("{}+zstd", media::VM_MEMORY), "digest": d, "size": z.len(),
                "annotations": {media::ANN_TITLE: "memory-ranges", media::ANN_CHUNK_INDEX: i.to_string(), media::ANN_CHUNK_COUNT: "2"}}));
        }
        cfg["files"]["memory-ranges"]["size"] = json!(bytes.len());
        cfg["files"]["memory-ranges"]["chunks"] = json!(chunks);
    }
    // Chunk layers listed in reverse: the config's chunk list is authoritative.
    layers.reverse();
    cfg["schemaVersion"] = json!("v2");
    let cfg_bytes = serde_json::to_vec(&cfg).unwrap();
    let cd = digest(&cfg_bytes);
    client.push_blob(&at("v2"), cfg_bytes.clone(), &cd).await.unwrap();
    m["artifactType"] = json!(media::SNAPSHOT_V2);
    m["config"] = json!({"mediaType": media::SNAPSHOT_CONFIG, "digest": cd, "size": cfg_bytes.len()});
    m["layers"] = json!(layers);
    let body = serde_json::to_vec(&m).unwrap();
    let v2_digest = digest(&body);
    client
        .push_manifest_raw(&at("v2"), body.clone(), media::OCI_MANIFEST.parse().unwrap())
        .await
        .unwrap();

    // An index: an arm64 decoy (the v1 manifest) first, the v2 manifest for linux/amd64.
    let idx = serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": [
        {"mediaType": media::OCI_MANIFEST, "digest": v1_digest, "size": raw.len(), "platform": {"os": "linux", "architecture": "arm64"}},
        {"mediaType": media::OCI_MANIFEST, "digest": v2_digest, "size": body.len(), "platform": {"os": "linux", "architecture": "amd64"}},
    ]}))
    .unwrap();
    client
        .push_manifest_raw(&at("idx"), idx, media::OCI_INDEX.parse().unwrap())
        .await
        .unwrap();
    Setup { reg, h, id, v2_digest }
}

#[tokio::test]
async fn v2_chunked_zstd_artifacts_and_indexes_pull_byte_for_byte() {
    let Setup { reg, h, id, v2_digest } = setup().await;
    let r = reg.transfer_client("", "n");
    let original = {
        let d = h.dir.path().join("orig");
        h.client.snapshot_export_to_dir("vm", &d).await.unwrap();
        dir_files(&d)
    };
    for (tag, local) in [("v2", "from-v2"), ("idx", "from-idx")] {
        let rep = pulled_byte_for_byte(&r, &h, &original, tag, local).await;
        assert_eq!(rep.snapshot_id, id);
        assert_eq!(rep.manifest_digest, v2_digest, "{tag}");
    }
    assert_eq!(
        r.snapshot_config("vm", "idx").await.unwrap().unwrap().schema_version,
        "v2"
    );
}

#[tokio::test]
async fn at_most_two_v2_or_index_pulls_run_at_once() {
    let Setup { reg, h, .. } = setup().await;
    let r = reg.transfer_client("", "n");
    let max_imports = |tag: &'static str| {
        let r = &r;
        let h = &h;
        async move {
            h.sim.delay("snapshot import", Some(3), 700).unwrap();
            let watch = async {
                let mut max = 0;
                for _ in 0..400 {
                    max = max.max(h.sim.pids_of("snapshot import").unwrap().len());
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                max
            };
            let pulls = async {
                let (na, nb, nc) = (format!("{tag}-a"), format!("{tag}-b"), format!("{tag}-c"));
                let (a, b, c) = tokio::join!(
                    r.pull_snapshot(&h.client, "vm", tag, &na),
                    r.pull_snapshot(&h.client, "vm", tag, &nb),
                    r.pull_snapshot(&h.client, "vm", tag, &nc),
                );
                a.unwrap();
                b.unwrap();
                c.unwrap();
            };
            let (max, ()) = tokio::join!(watch, pulls);
            max
        }
    };
    assert_eq!(max_imports("idx").await, 2, "index pulls are gated to 2 per node");
    assert_eq!(max_imports("v2").await, 2, "v2 pulls are gated to 2 per node");
    assert_eq!(max_imports("latest").await, 3, "v1 pulls are not gated");
}

#[tokio::test]
async fn a_v2_push_compresses_and_chunks_guest_memory_in_the_go_layout_and_pulls_back_byte_for_byte() {
    let reg = TestRegistry::start();
    let tuned = TransferSettings {
        zstd_level: 3,
        chunk_size: 1 << 20,
        ..TransferSettings::default()
    };
    let r = reg.transfer_client_tuned("", "n", RegistryAuth::Anonymous, tuned);
    let h = runtime_support::harness();
    let memory = (3 << 20) + 12_345; // four chunks, the last one short
    h.sim
        .set_settings(|s| {
            s.snapshot_memory_bytes = memory;
            s.snapshot_memory_zero_pct = 50;
            s.snapshot_memory_text_pct = 25;
            s.snapshot_cow_bytes = 64 << 20;
            s.snapshot_cow_data_bytes = 3 << 20; // sparse, packed data above the 1 MiB compression floor
        })
        .unwrap();
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
    let rep = r.push_snapshot(&h.client, "vm", "vm", "v2", IMG).await.unwrap();
    assert!(rep.v2, "{rep:?}");

    let m: Value = serde_json::from_slice(&std::fs::read(reg.blob_path(&rep.manifest_digest)).unwrap()).unwrap();
    assert_eq!(m["artifactType"], media::SNAPSHOT_V2);
    let cfg_digest = m["config"]["digest"].as_str().unwrap();
    let cfg: Value = serde_json::from_slice(&std::fs::read(reg.blob_path(cfg_digest)).unwrap()).unwrap();
    assert_eq!(cfg["schemaVersion"], "v2");
    let layers = m["layers"].as_array().unwrap();
    let of = |title: &str| -> Vec<&Value> {
        layers
            .iter()
            .filter(|l| l["annotations"][media::ANN_TITLE] == title)
            .collect()
    };
    // memory-ranges: four zstd chunks of 1 MiB uncompressed, annotated, in the config's order.
    let mem = of("memory-ranges");
    assert_eq!(mem.len(), 4);
    let mut stored = 0;
    for (i, l) in mem.iter().enumerate() {
        assert_eq!(l["mediaType"], format!("{}+zstd", media::VM_MEMORY));
        assert_eq!(l["annotations"][media::ANN_CHUNK_INDEX], i.to_string());
        assert_eq!(l["annotations"][media::ANN_CHUNK_COUNT], "4");
        assert_eq!(cfg["files"]["memory-ranges"]["chunks"][i], l["digest"]);
        // What the registry holds is the zstd frame of that chunk, whole.
        let blob = std::fs::read(reg.blob_path(l["digest"].as_str().unwrap())).unwrap();
        assert_eq!(blob.len() as u64, l["size"].as_u64().unwrap());
        let raw = zstd::stream::decode_all(&blob[..]).unwrap();
        assert_eq!(raw.len() as u64, if i < 3 { 1 << 20 } else { 12_345 }, "chunk {i}");
        stored += blob.len() as u64;
    }
    assert_eq!(cfg["files"]["memory-ranges"]["size"], memory);
    // Half zero pages and a quarter text: far smaller on the wire (random pages stay as they are).
    assert!(
        stored < memory * 45 / 100,
        "memory-ranges stored in {stored} bytes of {memory}"
    );
    // The sparse COW disk goes up packed (its data only) and keeps its map.
    let cow = &cfg["files"]["cow.raw"];
    assert!(cow["sparseMap"].is_string() && cow["sparseSize"] == 64 << 20, "{cow}");
    assert_eq!(cow["size"], 3 << 20);
    assert_eq!(of("cow.raw").len(), 3);
    // Files under 1 MiB stay raw, one blob each, with no chunk list.
    for small in ["config.json", "state.json", "cocoon.json"] {
        let l = of(small);
        assert_eq!(l.len(), 1, "{small}");
        assert!(!l[0]["mediaType"].as_str().unwrap().ends_with("+zstd"), "{small}");
        assert!(cfg["files"][small].get("chunks").is_none(), "{small}");
    }

    let original = {
        let d = h.dir.path().join("orig");
        h.client.snapshot_export_to_dir("vm", &d).await.unwrap();
        dir_files(&d)
    };
    r.pull_snapshot(&h.client, "vm", "v2", "restored").await.unwrap();
    let d = h.dir.path().join("restored");
    h.client.snapshot_export_to_dir("restored", &d).await.unwrap();
    let got = dir_files(&d);
    for (name, (size, bytes)) in &original {
        if name != "snapshot.json" {
            assert_eq!(*size, got[name].0, "{name}");
            assert!(*bytes == got[name].1, "{name}: contents differ");
        }
    }
    // And sparse again on disk.
    use std::os::unix::fs::MetadataExt;
    let blocks = std::fs::metadata(d.join("cow.raw")).unwrap().blocks() * 512;
    assert!(blocks < (32 << 20), "cow.raw allocated {blocks} bytes");
}

/// Pulls `vm:tag` into `local` and checks every file against `original` (snapshot.json aside).
async fn pulled_byte_for_byte(
    r: &registry_support::TransferClient,
    h: &runtime_support::Harness,
    original: &std::collections::BTreeMap<String, (u64, Vec<u8>)>,
    tag: &str,
    local: &str,
) -> vk_cocoon::registry::pull::PullReport {
    let report = r.pull_snapshot(&h.client, "vm", tag, local).await.unwrap();
    let d = h.dir.path().join(local);
    h.client.snapshot_export_to_dir(local, &d).await.unwrap();
    let got = dir_files(&d);
    for (name, (size, bytes)) in original {
        if name != "snapshot.json" {
            assert_eq!(*size, got[name].0, "{local} {name}");
            assert!(*bytes == got[name].1, "{local} {name}: contents differ");
        }
    }
    report
}

#[tokio::test]
async fn a_pull_is_byte_for_byte_whatever_its_budget_and_concurrency() {
    // The v2 artifact's memory chunks are cut unequal (one decodes past its file's share), so the
    // pull meets every case of the prefetch: blobs decoded ahead, a chunk handed over compressed,
    // blobs too big for the budget streamed by the writer.
    let Setup { reg, h, .. } = setup().await;
    let original = {
        let d = h.dir.path().join("orig");
        h.client.snapshot_export_to_dir("vm", &d).await.unwrap();
        dir_files(&d)
    };
    for (budget, concurrency) in [(1, 8), (64 << 10, 1), (2 << 20, 2), (32 << 20, 8)] {
        let tuned = TransferSettings {
            pull_budget: budget,
            concurrency,
            ..TransferSettings::default()
        };
        let r = reg.transfer_client_tuned("", "n", RegistryAuth::Anonymous, tuned);
        for tag in ["v2", "latest"] {
            pulled_byte_for_byte(&r, &h, &original, tag, &format!("{tag}-{budget}-{concurrency}")).await;
        }
    }
}

#[tokio::test]
async fn a_chunk_that_is_not_zstd_fails_the_pull_as_corrupt() {
    // `vm:bad` is `vm:v2` with its first memory chunk replaced by bytes that are not zstd (under
    // their own, correct digest): only decoding can tell.
    let Setup { reg, h, v2_digest, .. } = setup().await;
    use oci_client::client::{ClientConfig, ClientProtocol};
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    });
    let at = |tag: &str| oci_client::Reference::with_tag(reg.host(), "vm".into(), tag.into());
    client
        .auth(
            &at("bad"),
            &oci_client::secrets::RegistryAuth::Anonymous,
            oci_client::RegistryOperation::Push,
        )
        .await
        .unwrap();
    let mut m: Value = serde_json::from_slice(&std::fs::read(reg.blob_path(&v2_digest)).unwrap()).unwrap();
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(reg.blob_path(m["config"]["digest"].as_str().unwrap())).unwrap())
            .unwrap();
    let garbage = vec![0x5a_u8; 64 << 10];
    let bad = digest(&garbage);
    client.push_blob(&at("bad"), garbage.clone(), &bad).await.unwrap();
    let first = cfg["files"]["memory-ranges"]["chunks"][0].as_str().unwrap().to_string();
    cfg["files"]["memory-ranges"]["chunks"][0] = json!(bad);
    for l in m["layers"].as_array_mut().unwrap() {
        if l["digest"] == first {
            l["digest"] = json!(bad);
            l["size"] = json!(garbage.len());
        }
    }
    let cfg_bytes = serde_json::to_vec(&cfg).unwrap();
    let cd = digest(&cfg_bytes);
    client.push_blob(&at("bad"), cfg_bytes.clone(), &cd).await.unwrap();
    m["config"]["digest"] = json!(cd);
    m["config"]["size"] = json!(cfg_bytes.len());
    client
        .push_manifest_raw(
            &at("bad"),
            serde_json::to_vec(&m).unwrap(),
            media::OCI_MANIFEST.parse().unwrap(),
        )
        .await
        .unwrap();

    let r = reg.transfer_client("", "n");
    let err = r.pull_snapshot(&h.client, "vm", "bad", "from-bad").await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("zstd") && text.contains("memory-ranges") && text.contains(&bad),
        "the error names the chunk and why: {text}"
    );
    assert!(
        h.client.snapshot_inspect("from-bad").await.is_err(),
        "nothing half-imported is left"
    );
}

/// Pushes `vm:<tag>`: `vm:v2` with the last chunk of `memory-ranges` replaced by `blob` (stored under
/// its own, correct digest, with the media type `media_type`); the config's sizes are left as they are.
async fn with_last_memory_chunk(reg: &TestRegistry, v2_digest: &str, tag: &str, blob: Vec<u8>, media_type: &str) {
    use oci_client::client::{ClientConfig, ClientProtocol};
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    });
    let at = oci_client::Reference::with_tag(reg.host(), "vm".into(), tag.into());
    client
        .auth(
            &at,
            &oci_client::secrets::RegistryAuth::Anonymous,
            oci_client::RegistryOperation::Push,
        )
        .await
        .unwrap();
    let mut m: Value = serde_json::from_slice(&std::fs::read(reg.blob_path(v2_digest)).unwrap()).unwrap();
    let mut cfg: Value =
        serde_json::from_slice(&std::fs::read(reg.blob_path(m["config"]["digest"].as_str().unwrap())).unwrap())
            .unwrap();
    let d = digest(&blob);
    client.push_blob(&at, blob.clone(), &d).await.unwrap();
    let chunks = cfg["files"]["memory-ranges"]["chunks"].as_array_mut().unwrap();
    let last = chunks.last().unwrap().as_str().unwrap().to_string();
    *chunks.last_mut().unwrap() = json!(d);
    for l in m["layers"].as_array_mut().unwrap() {
        if l["digest"] == last {
            l["digest"] = json!(d);
            l["size"] = json!(blob.len());
            l["mediaType"] = json!(media_type);
        }
    }
    let cfg_bytes = serde_json::to_vec(&cfg).unwrap();
    let cd = digest(&cfg_bytes);
    client.push_blob(&at, cfg_bytes.clone(), &cd).await.unwrap();
    m["config"]["digest"] = json!(cd);
    m["config"]["size"] = json!(cfg_bytes.len());
    client
        .push_manifest_raw(
            &at,
            serde_json::to_vec(&m).unwrap(),
            media::OCI_MANIFEST.parse().unwrap(),
        )
        .await
        .unwrap();
}

/// The names of the tar entries in `stream`, up to its end or the first thing that is not an entry.
fn tar_names(stream: &[u8]) -> Vec<String> {
    let mut a = tar::Archive::new(stream);
    let Ok(entries) = a.entries() else { return Vec::new() };
    entries
        .map_while(Result::ok)
        .map(|e| e.path().unwrap().to_string_lossy().into_owned())
        .collect()
}

#[tokio::test]
async fn a_chunk_that_decodes_past_its_file_injects_no_tar_entry_into_the_import() {
    // The last chunk of memory-ranges decodes to its share and then a tar stream of its own: a file
    // `evil`, a symlink `link` to /etc, a second `snapshot.json`, and the end marker. The file's
    // entry ends exactly where that stream starts (its size is a multiple of 512), so an importer
    // that took every decoded byte would read them as entries of the import.
    let Setup { reg, h, v2_digest, .. } = setup().await;
    let cfg = reg.client("", "n").snapshot_config("vm", "v2").await.unwrap().unwrap();
    let memory = &cfg.files["memory-ranges"];
    assert_eq!(
        memory.size.unwrap() % 512,
        0,
        "the injected header lands on an entry boundary"
    );
    let last = memory.chunks.last().unwrap();
    let share = zstd::stream::decode_all(&std::fs::read(reg.blob_path(last)).unwrap()[..]).unwrap();
    let mut injected = tar::Builder::new(Vec::new());
    let mut head = tar::Header::new_ustar();
    head.set_size(512);
    head.set_mode(0o4755);
    head.set_cksum();
    injected.append_data(&mut head, "evil", &[b'x'; 512][..]).unwrap();
    let mut link = tar::Header::new_ustar();
    link.set_entry_type(tar::EntryType::Symlink);
    link.set_size(0);
    injected.append_link(&mut link, "link", "/etc").unwrap();
    let envelope = br#"{"version":1,"config":{"id":"EVIL","name":"evil"}}"#;
    let mut env = tar::Header::new_ustar();
    env.set_size(envelope.len() as u64);
    env.set_cksum();
    injected.append_data(&mut env, "snapshot.json", &envelope[..]).unwrap();
    let injected = injected.into_inner().unwrap();
    let mut decoded = share.clone();
    decoded.extend_from_slice(&injected);

    let zstd_media = format!("{}+zstd", media::VM_MEMORY);
    with_last_memory_chunk(&reg, &v2_digest, "evil-zstd", zstd(&decoded).await, &zstd_media).await;
    // The same bytes as a raw (uncompressed) part of the file.
    with_last_memory_chunk(&reg, &v2_digest, "evil-raw", decoded.clone(), media::VM_MEMORY).await;

    // Budget 1 streams every blob through the writer; the default decodes chunks ahead and hands over
    // the one past its share still compressed.
    for budget in [1, TransferSettings::default().pull_budget] {
        let tuned = TransferSettings {
            pull_budget: budget,
            ..TransferSettings::default()
        };
        let r = reg.client_tuned("", "n", RegistryAuth::Anonymous, tuned);
        for tag in ["evil-zstd", "evil-raw"] {
            let src = r.open_snapshot("vm", tag).await.unwrap();
            let mut sink: Vec<u8> = Vec::new();
            let progress = vk_cocoon::registry::Progress::new();
            let res = r.write_snapshot(&src, "local", &mut sink, &progress).await;
            let names = tar_names(&sink);
            assert!(
                !names.iter().any(|n| n == "evil" || n == "link")
                    && names.iter().filter(|n| *n == "snapshot.json").count() == 1,
                "{tag} (budget {budget}): the import read the entries {names:?}"
            );
            let e = res.expect_err("a file that decodes past its declared size fails the pull");
            assert!(
                matches!(&e, RegistryError::Corrupt { what, .. } if what == "memory-ranges"),
                "{tag}: {e:?}"
            );
            let text = e.to_string();
            assert!(
                text.contains(&format!("vm:{tag}")) && text.contains("re-push"),
                "{tag}: the error names the artifact and what to do: {text}"
            );
        }
    }
    // Through the daemon's import: refused, nothing imported.
    let r = reg.transfer_client("", "n");
    let e = r
        .pull_snapshot(&h.client, "vm", "evil-zstd", "from-evil")
        .await
        .unwrap_err();
    assert!(matches!(e.registry(), Some(RegistryError::Corrupt { .. })), "{e:?}");
    assert!(
        h.client.snapshot_inspect("from-evil").await.is_err(),
        "nothing half-imported is left"
    );
}
