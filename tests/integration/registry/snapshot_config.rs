//! A snapshot config is the registry's to write: the mode and the sparse map of each file go into
//! the import tar's headers, so they must keep the shape an export gives them — permission bits only,
//! and a sparse map that describes the entry's body exactly — or the artifact is refused before any
//! download. Against the real docker-registry.

use crate::registry_support;

use registry_support::{TestRegistry, push_raw_artifact};
use vk_cocoon::registry::RegistryError;
use vk_cocoon::registry::media;

#[tokio::test]
async fn file_modes_and_sparse_maps_from_the_config_keep_their_shape() {
    // A v1 artifact whose one file is 1024 bytes; only its config entry differs from case to case.
    let reg = TestRegistry::start();
    let r = reg.client("", "n");
    let file = |entry: serde_json::Value| {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": "v1", "snapshotId": "X", "files": {"memory-ranges": entry}
        }))
        .unwrap()
    };
    let sparse = |map: &str, size: Option<u64>| {
        let mut e = serde_json::json!({"mode": 0o640, "sparseMap": map});
        if let Some(s) = size {
            e["sparseSize"] = s.into();
        }
        e
    };
    let hostile = [
        ("setuid", serde_json::json!({"mode": 0o4755})),
        ("setgid", serde_json::json!({"mode": 0o2755})),
        ("sticky", serde_json::json!({"mode": 0o1777})),
        ("not-a-permission", serde_json::json!({"mode": 0o100640})),
        ("sparse-short", sparse(r#"[{"o":0,"l":512}]"#, Some(4096))),
        (
            "sparse-long",
            sparse(r#"[{"o":0,"l":1024},{"o":2048,"l":512}]"#, Some(4096)),
        ),
        ("sparse-past-the-end", sparse(r#"[{"o":8192,"l":1024}]"#, Some(4096))),
        (
            "sparse-overflow",
            sparse(r#"[{"o":18446744073709551615,"l":1024}]"#, Some(4096)),
        ),
        (
            "sparse-overlap",
            sparse(r#"[{"o":0,"l":512},{"o":256,"l":512}]"#, Some(4096)),
        ),
        ("sparse-not-json", sparse("[{o:0}", Some(4096))),
        ("sparse-no-apparent-size", sparse(r#"[{"o":0,"l":1024}]"#, None)),
    ];
    for (tag, entry) in hostile {
        push_raw_artifact(
            &reg,
            "vm",
            tag,
            media::SNAPSHOT_V1,
            (media::SNAPSHOT_CONFIG, &file(entry)),
            &[(media::VM_MEMORY, "memory-ranges", vec![7u8; 1024])],
        )
        .await;
        match r.open_snapshot("vm", tag).await {
            Ok(src) => {
                let mut sink: Vec<u8> = Vec::new();
                let written = r
                    .write_snapshot(&src, "local", &mut sink, &vk_cocoon::registry::Progress::new())
                    .await;
                let mut a = tar::Archive::new(&sink[..]);
                let mut described = Vec::new();
                for mut e in a.entries().unwrap().map_while(Result::ok) {
                    let meta = vk_cocoon::registry::tarfmt::entry_meta(&mut e).unwrap();
                    described.push(format!(
                        "{} mode {:o} sparse {:?}/{:?}",
                        meta.name, meta.mode, meta.sparse_map, meta.sparse_size
                    ));
                }
                panic!("{tag}: the import was handed {described:?} ({:?})", written.map(|_| ()));
            }
            Err(e) => {
                assert!(matches!(e, RegistryError::InvalidArtifact { .. }), "{tag}: {e:?}");
                let text = e.to_string();
                assert!(
                    text.contains("memory-ranges") && text.contains(&format!("vm:{tag}")),
                    "{tag}: {text}"
                );
            }
        }
    }
    // The shapes a push writes still go through: a plain 0640 file, and a sparse one whose map adds
    // up to its size within its apparent size.
    for (tag, entry) in [
        ("plain", serde_json::json!({"mode": 0o640})),
        ("sparse", sparse(r#"[{"o":0,"l":512},{"o":4096,"l":512}]"#, Some(8192))),
    ] {
        push_raw_artifact(
            &reg,
            "vm",
            tag,
            media::SNAPSHOT_V1,
            (media::SNAPSHOT_CONFIG, &file(entry)),
            &[(media::VM_MEMORY, "memory-ranges", vec![7u8; 1024])],
        )
        .await;
        let src = r.open_snapshot("vm", tag).await.unwrap();
        let mut sink: Vec<u8> = Vec::new();
        r.write_snapshot(&src, "local", &mut sink, &vk_cocoon::registry::Progress::new())
            .await
            .unwrap();
        let mut a = tar::Archive::new(&sink[..]);
        let mut e = a.entries().unwrap().nth(1).unwrap().unwrap();
        let meta = vk_cocoon::registry::tarfmt::entry_meta(&mut e).unwrap();
        assert_eq!(
            (meta.name.as_str(), meta.mode, meta.size),
            ("memory-ranges", 0o640, 1024),
            "{tag}"
        );
    }
}
