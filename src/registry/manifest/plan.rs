//! The pull plan: which blobs make which tar entry of the import stream, in order, validated against
//! the media-type allowlist and the snapshot config (a manifest that cannot be imported faithfully is
//! refused here, before a byte is downloaded).

use super::*;
use crate::registry::errors::Cause;
use crate::registry::media::{self, ArtifactKind, LayerEncoding};
use std::collections::BTreeMap;

/// One blob that contributes bytes to a tar entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobPart {
    pub digest: String,
    pub size: u64,
    pub encoding: LayerEncoding,
}

/// One tar entry of the import stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePlan {
    pub title: String,
    pub mode: u32,
    /// The tar entry size (the packed data: for sparse files the sum of the segments).
    pub size: u64,
    pub sparse_map: Option<String>,
    pub sparse_size: Option<u64>,
    pub parts: Vec<BlobPart>,
}

impl FilePlan {
    pub fn stored_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.size).sum()
    }
}

/// Validates a snapshot manifest against its config and returns the tar entries in layer order.
/// Errors are plain texts (the caller wraps them with the artifact name); unknown media types come back as
/// `Err(PlanError::MediaType)` so the caller can type them.
pub fn snapshot_plan(m: &OciImageManifest, cfg: &SnapshotConfig) -> Result<Vec<FilePlan>, PlanError> {
    let v2 = match image_kind(m) {
        ArtifactKind::SnapshotV1 => false,
        ArtifactKind::SnapshotV2 => true,
        k => {
            return Err(PlanError::invalid(format!(
                "the artifact is a {} artifact, not a snapshot",
                k.name()
            )));
        }
    };
    let mut order: Vec<String> = Vec::new();
    let mut by_title: BTreeMap<String, Vec<&OciDescriptor>> = BTreeMap::new();
    for l in &m.layers {
        let title = title(l)
            .ok_or_else(|| PlanError::invalid(format!("layer {} has no {} annotation", l.digest, media::ANN_TITLE)))?
            .to_string();
        if title.contains('/') || title == "." || title == ".." || title == "snapshot.json" {
            return Err(PlanError::invalid(format!(
                "layer title {title:?} is not a bare snapshot file name"
            )));
        }
        let enc = media::snapshot_layer_encoding(&l.media_type).ok_or_else(|| PlanError::MediaType {
            title: title.to_string(),
            media_type: l.media_type.clone(),
        })?;
        let chunked =
            annotation(l, media::ANN_CHUNK_INDEX).is_some() || annotation(l, media::ANN_CHUNK_COUNT).is_some();
        if !v2 && (enc == LayerEncoding::Zstd || chunked) {
            return Err(PlanError::invalid(format!(
                "layer {title:?} is zstd-compressed or chunked, which a v1 snapshot artifact may not be"
            )));
        }
        if l.size < 0 {
            return Err(PlanError::invalid(format!("layer {title:?} has a negative size")));
        }
        if !by_title.contains_key(&title) {
            order.push(title.clone());
        }
        by_title.entry(title).or_default().push(l);
    }
    let mut plans = Vec::with_capacity(order.len());
    for title in order {
        let layers = &by_title[&title];
        let info = cfg.files.get(&title).cloned().unwrap_or_default();
        if !v2 && layers.len() > 1 {
            return Err(PlanError::invalid(format!(
                "file {title:?} has {} layers in a v1 snapshot artifact",
                layers.len()
            )));
        }
        let parts: Vec<&OciDescriptor> = if info.chunks.is_empty() {
            let mut ls = layers.clone();
            ls.sort_by_key(|l| {
                annotation(l, media::ANN_CHUNK_INDEX)
                    .and_then(|i| i.parse::<u64>().ok())
                    .unwrap_or(0)
            });
            ls
        } else {
            if info.chunks.len() != layers.len() {
                return Err(PlanError::invalid(format!(
                    "file {title:?}: the config lists {} chunks but the manifest has {} layers",
                    info.chunks.len(),
                    layers.len()
                )));
            }
            info.chunks
                .iter()
                .map(|d| {
                    layers.iter().copied().find(|l| &l.digest == d).ok_or_else(|| {
                        PlanError::invalid(format!(
                            "file {title:?}: chunk {d} of the config is not a layer of the manifest"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?
        };
        let parts: Vec<BlobPart> = parts
            .iter()
            .map(|l| BlobPart {
                digest: l.digest.clone(),
                size: l.size as u64,
                encoding: media::snapshot_layer_encoding(&l.media_type).unwrap_or(LayerEncoding::Raw),
            })
            .collect();
        let any_zstd = parts.iter().any(|p| p.encoding == LayerEncoding::Zstd);
        let size = match info.size {
            Some(s) => {
                if !any_zstd && s != parts.iter().map(|p| p.size).sum::<u64>() {
                    return Err(PlanError::invalid(format!(
                        "file {title:?}: the config size {s} differs from the layers' sizes"
                    )));
                }
                s
            }
            None if any_zstd => {
                return Err(PlanError::invalid(format!(
                    "file {title:?} is compressed but the config carries no uncompressed size"
                )));
            }
            None => parts.iter().map(|p| p.size).sum(),
        };
        let sparse_map = info.sparse_map.clone().filter(|s| !s.is_empty());
        if let Some(map) = &sparse_map {
            check_sparse_map(map, info.sparse_size, size).map_err(|why| PlanError::Invalid {
                detail: format!("file {title:?}: its sparse map {why}"),
                cause: Some(Cause::new(why)),
            })?;
        }
        plans.push(FilePlan {
            mode: file_mode(&title, info.mode)?,
            title,
            size,
            sparse_map,
            sparse_size: info.sparse_size,
            parts,
        });
    }
    if plans.is_empty() {
        return Err(PlanError::invalid("the snapshot artifact has no layers"));
    }
    Ok(plans)
}

/// The mode of a snapshot file's tar entry: its permission bits, 0640 when the config has none. The
/// import creates files with the mode of their entry, so anything beyond permission bits — setuid,
/// setgid, sticky, file-type bits — is refused: a snapshot file never needs them.
fn file_mode(title: &str, mode: u32) -> Result<u32, PlanError> {
    match mode {
        0 => Ok(0o640),
        m if m & !0o777 == 0 => Ok(m),
        m => Err(PlanError::invalid(format!(
            "file {title:?} has mode {m:#o}; a snapshot file's mode is permission bits only (at most 0777: no setuid, setgid or sticky bit)"
        ))),
    }
}

/// One segment of a `COCOON.sparse.map`: `l` bytes of data at offset `o` of the file.
#[derive(serde::Deserialize)]
struct SparseSegment {
    o: u64,
    l: u64,
}

/// The sparse map `map` must describe the entry's body exactly: its segments hold `size` bytes in
/// all (the body is their data, concatenated), in offset order without overlap, all within the
/// apparent size, which must be given. `Err` says what is wrong.
fn check_sparse_map(map: &str, apparent: Option<u64>, size: u64) -> Result<(), SparseMapError> {
    let apparent = apparent.ok_or(SparseMapError::NoApparentSize)?;
    let segments: Vec<SparseSegment> = serde_json::from_str(map).map_err(SparseMapError::NotSegments)?;
    let mut end = 0u64;
    let mut data = 0u64;
    for (i, s) in segments.iter().enumerate() {
        if s.o < end {
            return Err(SparseMapError::Overlap {
                index: i,
                offset: s.o,
                end,
            });
        }
        end =
            s.o.checked_add(s.l)
                .filter(|e| *e <= apparent)
                .ok_or(SparseMapError::PastEnd {
                    index: i,
                    len: s.l,
                    offset: s.o,
                    apparent,
                })?;
        data += s.l;
    }
    if data != size {
        return Err(SparseMapError::DataSize { data, size });
    }
    Ok(())
}

/// What is wrong with a file's sparse map; reads after "its sparse map".
#[derive(Debug, thiserror::Error)]
enum SparseMapError {
    #[error("has no apparent size (sparseSize)")]
    NoApparentSize,
    #[error("is not a JSON list of {{\"o\",\"l\"}} segments: {0}")]
    NotSegments(#[source] serde_json::Error),
    #[error("has segment {index} at offset {offset} before the end of the one before it ({end})")]
    Overlap { index: usize, offset: u64, end: u64 },
    #[error("has segment {index} ({len} bytes at {offset}) past the file's apparent size {apparent}")]
    PastEnd {
        index: usize,
        len: u64,
        offset: u64,
        apparent: u64,
    },
    #[error("holds {data} bytes of data, but the file's entry has {size}")]
    DataSize { data: u64, size: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// `detail` says what is wrong in words; `cause` keeps the error it comes from, when one
    /// does (a sparse map that is not JSON: the parser's error).
    Invalid {
        detail: String,
        cause: Option<Cause>,
    },
    MediaType {
        title: String,
        media_type: String,
    },
}

impl PlanError {
    /// A manifest or config that breaks a rule of its own (no error underneath).
    fn invalid(detail: impl Into<String>) -> Self {
        Self::Invalid {
            detail: detail.into(),
            cause: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn layer(title: &str, mt: &str, digest: &str, size: i64, extra: &[(&str, &str)]) -> Value {
        let mut ann = serde_json::Map::new();
        ann.insert(media::ANN_TITLE.into(), title.into());
        for (k, v) in extra {
            ann.insert((*k).into(), (*v).into());
        }
        json!({"mediaType": mt, "digest": digest, "size": size, "annotations": ann})
    }

    fn manifest(at: &str, layers: Vec<Value>) -> OciImageManifest {
        match parse_manifest(
            &serde_json::to_vec(&json!({
                "schemaVersion": 2, "mediaType": media::OCI_MANIFEST, "artifactType": at,
                "config": {"mediaType": media::SNAPSHOT_CONFIG, "digest": "sha256:c", "size": 2},
                "layers": layers,
            }))
            .unwrap(),
        )
        .unwrap()
        {
            OciManifest::Image(m) => m,
            OciManifest::ImageIndex(_) => panic!("parsed as an index"),
        }
    }

    #[test]
    fn v1_plan_keeps_layer_order_modes_and_sparse_records() {
        let m = manifest(
            media::SNAPSHOT_V1,
            vec![
                layer("cow.raw", media::DISK_RAW, "sha256:a", 10, &[]),
                layer("cocoon.json", media::OCTET_STREAM, "sha256:b", 3, &[]),
            ],
        );
        let mut cfg = SnapshotConfig::default();
        cfg.files.insert(
            "cow.raw".into(),
            FileInfo {
                mode: 0o600,
                sparse_map: Some("[{\"o\":0,\"l\":10}]".into()),
                sparse_size: Some(4096),
                ..Default::default()
            },
        );
        let p = snapshot_plan(&m, &cfg).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[0].title.as_str(), p[0].mode, p[0].size, p[0].sparse_size),
            ("cow.raw", 0o600, 10, Some(4096))
        );
        assert_eq!(p[0].sparse_map.as_deref(), Some("[{\"o\":0,\"l\":10}]"));
        assert_eq!((p[1].title.as_str(), p[1].mode, p[1].size), ("cocoon.json", 0o640, 3));
    }

    /// A sparse map that is not JSON: the message says so in words as before, and the parser's
    /// error is reachable down the source chain (the registry error keeps it as its cause).
    #[test]
    fn a_sparse_map_that_is_not_json_keeps_the_parser_error_as_its_source() {
        let m = manifest(
            media::SNAPSHOT_V1,
            vec![layer("cow.raw", media::DISK_RAW, "sha256:a", 10, &[])],
        );
        let mut cfg = SnapshotConfig::default();
        cfg.files.insert(
            "cow.raw".into(),
            FileInfo {
                mode: 0o600,
                sparse_map: Some("[{o:0}".into()),
                sparse_size: Some(4096),
                ..Default::default()
            },
        );
        let Err(PlanError::Invalid { detail, cause }) = snapshot_plan(&m, &cfg) else {
            panic!("a broken sparse map is invalid");
        };
        assert!(
            detail.starts_with("file \"cow.raw\": its sparse map is not a JSON list"),
            "{detail}"
        );
        let cause = cause.expect("the sparse map's error is kept");
        let parser = std::error::Error::source(&cause).expect("the JSON error under it");
        assert!(parser.downcast_ref::<serde_json::Error>().is_some(), "{parser:?}");
        assert!(detail.ends_with(&parser.to_string()), "{detail} / {parser}");
    }

    #[test]
    fn v1_refuses_zstd_chunks_unknown_types_and_missing_titles() {
        let m = manifest(
            media::SNAPSHOT_V1,
            vec![layer("mem", "application/octet-stream+zstd", "sha256:a", 1, &[])],
        );
        assert!(
            matches!(snapshot_plan(&m, &SnapshotConfig::default()), Err(PlanError::Invalid { detail: e, .. }) if e.contains("v1"))
        );
        let m = manifest(
            media::SNAPSHOT_V1,
            vec![layer(
                "mem",
                media::OCTET_STREAM,
                "sha256:a",
                1,
                &[(media::ANN_CHUNK_INDEX, "0")],
            )],
        );
        assert!(matches!(
            snapshot_plan(&m, &SnapshotConfig::default()),
            Err(PlanError::Invalid { .. })
        ));
        let m = manifest(
            media::SNAPSHOT_V1,
            vec![layer(
                "mem",
                "application/vnd.oci.image.layer.v1.tar",
                "sha256:a",
                1,
                &[],
            )],
        );
        assert_eq!(
            snapshot_plan(&m, &SnapshotConfig::default()),
            Err(PlanError::MediaType {
                title: "mem".into(),
                media_type: "application/vnd.oci.image.layer.v1.tar".into()
            })
        );
        let mut m = manifest(
            media::SNAPSHOT_V1,
            vec![layer("mem", media::OCTET_STREAM, "sha256:a", 1, &[])],
        );
        m.layers[0].annotations = None;
        assert!(
            matches!(snapshot_plan(&m, &SnapshotConfig::default()), Err(PlanError::Invalid { detail: e, .. }) if e.contains("title"))
        );
        let m = manifest(
            media::SNAPSHOT_V1,
            vec![layer("../x", media::OCTET_STREAM, "sha256:a", 1, &[])],
        );
        assert!(snapshot_plan(&m, &SnapshotConfig::default()).is_err());
        let m = manifest(
            media::OS_IMAGE,
            vec![layer("disk", media::DISK_QCOW2, "sha256:a", 1, &[])],
        );
        assert!(
            matches!(snapshot_plan(&m, &SnapshotConfig::default()), Err(PlanError::Invalid { detail: e, .. }) if e.contains("cloud-image"))
        );
    }

    #[test]
    fn modes_are_permission_bits_only() {
        assert_eq!(file_mode("f", 0), Ok(0o640));
        assert_eq!(file_mode("f", 0o600), Ok(0o600));
        assert_eq!(file_mode("f", 0o777), Ok(0o777));
        for m in [0o4755, 0o2755, 0o1777, 0o100640, 0o1000] {
            assert!(
                matches!(file_mode("f", m), Err(PlanError::Invalid { detail: e, .. }) if e.contains("permission bits")),
                "{m:o}"
            );
        }
    }

    #[test]
    fn sparse_maps_must_describe_the_body() {
        let ok =
            |map: &str, apparent: Option<u64>, size| check_sparse_map(map, apparent, size).map_err(|e| e.to_string());
        assert_eq!(ok(r#"[{"o":0,"l":512},{"o":4096,"l":512}]"#, Some(8192), 1024), Ok(()));
        assert_eq!(ok("[]", Some(4096), 0), Ok(()));
        assert_eq!(ok(r#"[{"o":0,"l":4096}]"#, Some(4096), 4096), Ok(()));
        for (map, apparent, size, why) in [
            (r#"[{"o":0,"l":512}]"#, Some(4096), 1024, "holds 512"),
            (
                r#"[{"o":0,"l":1024},{"o":2048,"l":512}]"#,
                Some(4096),
                1024,
                "holds 1536",
            ),
            (
                r#"[{"o":8192,"l":1024}]"#,
                Some(4096),
                1024,
                "past the file's apparent size",
            ),
            (r#"[{"o":18446744073709551615,"l":1024}]"#, Some(u64::MAX), 1024, "past"),
            (
                r#"[{"o":0,"l":512},{"o":256,"l":512}]"#,
                Some(4096),
                1024,
                "before the end",
            ),
            (
                r#"[{"o":512,"l":512},{"o":0,"l":512}]"#,
                Some(4096),
                1024,
                "before the end",
            ),
            ("[{o:0}", Some(4096), 1024, "not a JSON list"),
            (r#"[{"o":0,"l":1024}]"#, None, 1024, "apparent size"),
        ] {
            let e = ok(map, apparent, size).unwrap_err();
            assert!(e.contains(why), "{map}: {e}");
        }
    }

    #[test]
    fn v2_chunks_follow_the_config_order() {
        let m = manifest(
            media::SNAPSHOT_V2,
            vec![
                layer(
                    "memory-ranges",
                    "application/vnd.cocoonstack.vm.memory+zstd",
                    "sha256:2",
                    5,
                    &[(media::ANN_CHUNK_INDEX, "1")],
                ),
                layer(
                    "memory-ranges",
                    "application/vnd.cocoonstack.vm.memory+zstd",
                    "sha256:1",
                    6,
                    &[(media::ANN_CHUNK_INDEX, "0")],
                ),
                layer("state.json", media::VM_STATE, "sha256:3", 7, &[]),
            ],
        );
        let mut cfg = SnapshotConfig::default();
        cfg.files.insert(
            "memory-ranges".into(),
            FileInfo {
                mode: 416,
                size: Some(100),
                chunks: vec!["sha256:1".into(), "sha256:2".into()],
                ..Default::default()
            },
        );
        let p = snapshot_plan(&m, &cfg).unwrap();
        assert_eq!(
            p[0].parts.iter().map(|x| x.digest.as_str()).collect::<Vec<_>>(),
            ["sha256:1", "sha256:2"]
        );
        assert_eq!((p[0].size, p[0].parts[0].encoding), (100, LayerEncoding::Zstd));
        assert_eq!(p[1].size, 7);
        // Without the uncompressed size a compressed file cannot be framed.
        cfg.files.get_mut("memory-ranges").unwrap().size = None;
        assert!(snapshot_plan(&m, &cfg).is_err());
        // A chunk list naming a digest that is not a layer.
        cfg.files.get_mut("memory-ranges").unwrap().size = Some(100);
        cfg.files.get_mut("memory-ranges").unwrap().chunks[1] = "sha256:9".into();
        assert!(snapshot_plan(&m, &cfg).is_err());
    }
}
