//! Pure manifest logic on oci-client's manifest, index and descriptor types: parsing (manifest or index),
//! classification, index resolution, the camelCase snapshot config blob, the pull plan (which blobs make
//! which tar entry, validated against the allowlist) and the snapshot manifest a push writes.

use super::media::{self, ArtifactKind, LayerEncoding};
pub use oci_client::manifest::{ImageIndexEntry, OciDescriptor, OciImageIndex, OciImageManifest, OciManifest};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The biggest config blob we read (contracts B.3).
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;
/// The biggest manifest we accept.
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// Parses a manifest or an index. Which one is decided by the media type (or, without one, by the
/// presence of `manifests` without `config`), so a malformed document gets the error of its own kind.
pub fn parse_manifest(bytes: &[u8]) -> Result<OciManifest, String> {
    if bytes.len() > MAX_MANIFEST_BYTES {
        return Err(format!(
            "manifest is {} bytes, more than the {} allowed",
            bytes.len(),
            MAX_MANIFEST_BYTES
        ));
    }
    let v: Value = serde_json::from_slice(bytes).map_err(|e| format!("manifest is not valid JSON: {e}"))?;
    let version = v.get("schemaVersion").and_then(Value::as_i64).unwrap_or(0);
    if version != 2 {
        return Err(format!("unsupported manifest schemaVersion {version}"));
    }
    let media_type = v.get("mediaType").and_then(Value::as_str);
    let is_index = matches!(media_type, Some(media::OCI_INDEX) | Some(media::DOCKER_MANIFEST_LIST))
        || (media_type.is_none() && v.get("manifests").is_some() && v.get("config").is_none());
    if is_index {
        serde_json::from_value(v)
            .map(OciManifest::ImageIndex)
            .map_err(|e| format!("image index is malformed: {e}"))
    } else {
        serde_json::from_value(v)
            .map(OciManifest::Image)
            .map_err(|e| format!("manifest is malformed: {e}"))
    }
}

/// What an artifact is (an index is always an image index).
pub fn kind(m: &OciManifest) -> ArtifactKind {
    match m {
        OciManifest::ImageIndex(_) => ArtifactKind::ImageIndex,
        OciManifest::Image(m) => image_kind(m),
    }
}

pub fn image_kind(m: &OciImageManifest) -> ArtifactKind {
    media::classify(
        m.media_type.as_deref(),
        m.artifact_type.as_deref(),
        Some(m.config.media_type.as_str()),
    )
}

pub fn artifact_type(m: &OciManifest) -> Option<&str> {
    match m {
        OciManifest::Image(m) => m.artifact_type.as_deref(),
        OciManifest::ImageIndex(i) => i.artifact_type.as_deref(),
    }
}

pub fn annotations(m: &OciManifest) -> BTreeMap<String, String> {
    match m {
        OciManifest::Image(m) => m.annotations.clone(),
        OciManifest::ImageIndex(i) => i.annotations.clone(),
    }
    .unwrap_or_default()
}

/// The `org.opencontainers.image.title` of a layer, when set and non-empty.
pub fn title(d: &OciDescriptor) -> Option<&str> {
    d.annotations
        .as_ref()
        .and_then(|a| a.get(media::ANN_TITLE))
        .map(String::as_str)
        .filter(|t| !t.is_empty())
}

fn annotation<'a>(d: &'a OciDescriptor, key: &str) -> Option<&'a str> {
    d.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

/// The child of an index to use: `linux/amd64`, else the first whose architecture is not `unknown`.
pub fn resolve_index(index: &OciImageIndex) -> Option<&ImageIndexEntry> {
    let arch = |d: &ImageIndexEntry| d.platform.as_ref().map(|p| p.architecture.to_string());
    let os = |d: &ImageIndexEntry| d.platform.as_ref().map(|p| p.os.to_string());
    index
        .manifests
        .iter()
        .find(|d| os(d).as_deref() == Some("linux") && arch(d).as_deref() == Some("amd64"))
        .or_else(|| {
            index
                .manifests
                .iter()
                .find(|d| arch(d).as_deref().unwrap_or_default() != "unknown")
        })
}

/// One file of the snapshot in the config blob.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FileInfo {
    #[serde(default)]
    pub mode: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sparse_map: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sparse_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<String>,
}

/// The config blob (`manifest.SnapshotConfig`, camelCase).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotConfig {
    #[serde(default)]
    pub schema_version: String,
    #[serde(default)]
    pub snapshot_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_digest: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_type: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub image_blob_ids: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hypervisor: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu: i64,
    #[serde(default, skip_serializing_if = "is_zero_u")]
    pub memory: u64,
    #[serde(default, skip_serializing_if = "is_zero_u")]
    pub storage: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nics: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub windows: bool,
    #[serde(default)]
    pub files: BTreeMap<String, FileInfo>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub created_at: String,
    /// The complete original `snapshot.json` config object, so unknown keys survive the round trip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<Value>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}
fn is_zero_u(v: &u64) -> bool {
    *v == 0
}

impl SnapshotConfig {
    /// Builds the config from the export's `snapshot.json` envelope (`{"version":1,"config":{snake_case}}`).
    pub fn from_envelope(envelope: &[u8], created_at: String) -> Result<SnapshotConfig, String> {
        let v: Value = serde_json::from_slice(envelope).map_err(|e| format!("snapshot.json is not valid JSON: {e}"))?;
        let c = v
            .get("config")
            .and_then(Value::as_object)
            .ok_or("snapshot.json has no \"config\" object")?;
        let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let i = |k: &str| c.get(k).and_then(Value::as_i64).unwrap_or_default();
        let u = |k: &str| c.get(k).and_then(Value::as_u64).unwrap_or_default();
        Ok(SnapshotConfig {
            schema_version: "v1".into(),
            snapshot_id: s("id"),
            description: s("description"),
            image: s("image"),
            image_digest: s("image_digest"),
            image_type: s("image_type"),
            image_blob_ids: c
                .get("image_blob_ids")
                .and_then(Value::as_object)
                .map(|m| m.clone().into_iter().collect())
                .unwrap_or_default(),
            hypervisor: s("hypervisor"),
            cpu: i("cpu"),
            memory: u("memory"),
            storage: u("storage"),
            nics: i("nics"),
            network: s("network"),
            windows: c.get("windows").and_then(Value::as_bool).unwrap_or(false),
            files: BTreeMap::new(),
            created_at,
            engine: Some(Value::Object(c.clone())),
        })
    }

    /// The `snapshot.json` envelope for `cocoon snapshot import`, with the name replaced by `local_name`.
    pub fn envelope(&self, local_name: &str) -> Vec<u8> {
        let mut c = match &self.engine {
            Some(Value::Object(m)) => m.clone(),
            _ => {
                let mut m = Map::new();
                let mut put = |k: &str, v: Value| {
                    let empty = matches!(&v, Value::String(s) if s.is_empty()) || v == 0 || v == Value::Bool(false);
                    if !empty {
                        m.insert(k.to_string(), v);
                    }
                };
                put("id", self.snapshot_id.clone().into());
                put("description", self.description.clone().into());
                put("image", self.image.clone().into());
                put("image_digest", self.image_digest.clone().into());
                put("image_type", self.image_type.clone().into());
                put("hypervisor", self.hypervisor.clone().into());
                put("cpu", self.cpu.into());
                put("memory", self.memory.into());
                put("storage", self.storage.into());
                put("nics", self.nics.into());
                put("network", self.network.clone().into());
                put("windows", self.windows.into());
                if !self.image_blob_ids.is_empty() {
                    m.insert(
                        "image_blob_ids".into(),
                        Value::Object(self.image_blob_ids.clone().into_iter().collect()),
                    );
                }
                m
            }
        };
        c.insert("name".into(), Value::String(local_name.to_string()));
        serde_json::to_vec(&serde_json::json!({"version": 1, "config": c})).expect("JSON of a map")
    }
}

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
            return Err(PlanError::Invalid(format!(
                "the artifact is a {} artifact, not a snapshot",
                k.name()
            )));
        }
    };
    let mut order: Vec<String> = Vec::new();
    let mut by_title: BTreeMap<String, Vec<&OciDescriptor>> = BTreeMap::new();
    for l in &m.layers {
        let title = title(l)
            .ok_or_else(|| PlanError::Invalid(format!("layer {} has no {} annotation", l.digest, media::ANN_TITLE)))?
            .to_string();
        if title.contains('/') || title == "." || title == ".." || title == "snapshot.json" {
            return Err(PlanError::Invalid(format!(
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
            return Err(PlanError::Invalid(format!(
                "layer {title:?} is zstd-compressed or chunked, which a v1 snapshot artifact may not be"
            )));
        }
        if l.size < 0 {
            return Err(PlanError::Invalid(format!("layer {title:?} has a negative size")));
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
            return Err(PlanError::Invalid(format!(
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
                return Err(PlanError::Invalid(format!(
                    "file {title:?}: the config lists {} chunks but the manifest has {} layers",
                    info.chunks.len(),
                    layers.len()
                )));
            }
            info.chunks
                .iter()
                .map(|d| {
                    layers.iter().copied().find(|l| &l.digest == d).ok_or_else(|| {
                        PlanError::Invalid(format!(
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
                    return Err(PlanError::Invalid(format!(
                        "file {title:?}: the config size {s} differs from the layers' sizes"
                    )));
                }
                s
            }
            None if any_zstd => {
                return Err(PlanError::Invalid(format!(
                    "file {title:?} is compressed but the config carries no uncompressed size"
                )));
            }
            None => parts.iter().map(|p| p.size).sum(),
        };
        plans.push(FilePlan {
            title,
            mode: if info.mode == 0 { 0o640 } else { info.mode },
            size,
            sparse_map: info.sparse_map.clone().filter(|s| !s.is_empty()),
            sparse_size: info.sparse_size,
            parts,
        });
    }
    if plans.is_empty() {
        return Err(PlanError::Invalid("the snapshot artifact has no layers".into()));
    }
    Ok(plans)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    Invalid(String),
    MediaType { title: String, media_type: String },
}

/// A pushed layer (one blob: a whole file, or one chunk of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedLayer {
    pub title: String,
    pub media_type: String,
    pub digest: String,
    /// Stored bytes (compressed when the media type ends in `+zstd`).
    pub size: u64,
    /// `(index, count)` of a chunk of a file split into several blobs.
    pub chunk: Option<(usize, usize)>,
}

impl PushedLayer {
    fn descriptor(&self) -> OciDescriptor {
        let mut ann = BTreeMap::from([(media::ANN_TITLE.to_string(), self.title.clone())]);
        if let Some((index, count)) = self.chunk {
            ann.insert(media::ANN_CHUNK_INDEX.to_string(), index.to_string());
            ann.insert(media::ANN_CHUNK_COUNT.to_string(), count.to_string());
        }
        OciDescriptor {
            media_type: self.media_type.clone(),
            digest: self.digest.clone(),
            size: self.size as i64,
            annotations: Some(ann),
            ..Default::default()
        }
    }
}

/// The snapshot manifest a push writes: v1, or v2 when a layer was compressed or chunked (B.3). Every
/// annotation (created, baseimage, from-node) is in it, so one PUT writes the finished artifact.
pub fn snapshot_manifest(
    v2: bool,
    config_digest: &str,
    config_size: u64,
    layers: &[PushedLayer],
    annotations: BTreeMap<String, String>,
) -> Vec<u8> {
    let m = OciImageManifest {
        schema_version: 2,
        media_type: Some(media::OCI_MANIFEST.to_string()),
        artifact_type: Some(if v2 { media::SNAPSHOT_V2 } else { media::SNAPSHOT_V1 }.to_string()),
        config: OciDescriptor {
            media_type: media::SNAPSHOT_CONFIG.to_string(),
            digest: config_digest.to_string(),
            size: config_size as i64,
            ..Default::default()
        },
        layers: layers.iter().map(PushedLayer::descriptor).collect(),
        subject: None,
        annotations: Some(annotations),
    };
    serde_json::to_vec(&m).expect("JSON of a manifest")
}

/// `sha256:<hex>` of bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
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

    #[test]
    fn v1_refuses_zstd_chunks_unknown_types_and_missing_titles() {
        let m = manifest(
            media::SNAPSHOT_V1,
            vec![layer("mem", "application/octet-stream+zstd", "sha256:a", 1, &[])],
        );
        assert!(
            matches!(snapshot_plan(&m, &SnapshotConfig::default()), Err(PlanError::Invalid(e)) if e.contains("v1"))
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
            Err(PlanError::Invalid(_))
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
            matches!(snapshot_plan(&m, &SnapshotConfig::default()), Err(PlanError::Invalid(e)) if e.contains("title"))
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
            matches!(snapshot_plan(&m, &SnapshotConfig::default()), Err(PlanError::Invalid(e)) if e.contains("cloud-image"))
        );
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

    #[test]
    fn index_resolution() {
        let idx = parse_manifest(
            &serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": [
                {"mediaType": media::OCI_MANIFEST, "digest": "sha256:arm", "size": 1, "platform": {"os": "linux", "architecture": "arm64"}},
                {"mediaType": media::OCI_MANIFEST, "digest": "sha256:amd", "size": 1, "platform": {"os": "linux", "architecture": "amd64"}},
            ]}))
            .unwrap(),
        )
        .unwrap();
        assert_eq!(kind(&idx), ArtifactKind::ImageIndex);
        let OciManifest::ImageIndex(idx) = idx else {
            panic!("not an index")
        };
        assert_eq!(resolve_index(&idx).unwrap().digest, "sha256:amd");
        let idx2 = parse_manifest(
            &serde_json::to_vec(&json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": [
                {"mediaType": media::OCI_MANIFEST, "digest": "sha256:att", "size": 1, "platform": {"os": "unknown", "architecture": "unknown"}},
                {"mediaType": media::OCI_MANIFEST, "digest": "sha256:arm", "size": 1, "platform": {"os": "linux", "architecture": "arm64"}},
            ]}))
            .unwrap(),
        )
        .unwrap();
        let OciManifest::ImageIndex(idx2) = idx2 else {
            panic!("not an index")
        };
        assert_eq!(resolve_index(&idx2).unwrap().digest, "sha256:arm");
        // A document without a media type is an index when it lists manifests and has no config.
        let bare = parse_manifest(br#"{"schemaVersion":2,"manifests":[]}"#).unwrap();
        assert_eq!(kind(&bare), ArtifactKind::ImageIndex);
        assert!(
            parse_manifest(br#"{"schemaVersion":1}"#)
                .unwrap_err()
                .contains("schemaVersion 1")
        );
        assert!(
            parse_manifest(br#"{"schemaVersion":2,"config":{}}"#)
                .unwrap_err()
                .contains("malformed")
        );
    }

    #[test]
    fn config_from_envelope_and_back() {
        let env = br#"{"version":1,"config":{"id":"SNAP1","name":"vm-a","image":"img:1","image_digest":"sha256:i","hypervisor":"cloud-hypervisor","cpu":2,"memory":1024,"future_key":"kept"}}"#;
        let c = SnapshotConfig::from_envelope(env, "2026-01-01T00:00:00Z".into()).unwrap();
        assert_eq!(
            (
                c.snapshot_id.as_str(),
                c.image.as_str(),
                c.image_digest.as_str(),
                c.hypervisor.as_str(),
                c.cpu
            ),
            ("SNAP1", "img:1", "sha256:i", "cloud-hypervisor", 2)
        );
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["snapshotId"], "SNAP1");
        assert_eq!(json["imageDigest"], "sha256:i");
        assert_eq!(json["schemaVersion"], "v1");
        let back: Value = serde_json::from_slice(&c.envelope("local-x")).unwrap();
        assert_eq!(back["version"], 1);
        assert_eq!(back["config"]["name"], "local-x");
        assert_eq!(back["config"]["future_key"], "kept");
        assert_eq!(back["config"]["id"], "SNAP1");
        // Without the engine copy the envelope is rebuilt from the typed fields.
        let mut c2 = c.clone();
        c2.engine = None;
        let back: Value = serde_json::from_slice(&c2.envelope("l")).unwrap();
        assert_eq!(
            (
                back["config"]["id"].as_str(),
                back["config"]["memory"].as_u64(),
                back["config"].get("storage")
            ),
            (Some("SNAP1"), Some(1024), None)
        );
        assert!(SnapshotConfig::from_envelope(b"{}", String::new()).is_err());
    }

    #[test]
    fn snapshot_manifest_shape_and_annotations() {
        let ann = BTreeMap::from([
            (media::ANN_CREATED.to_string(), "t".to_string()),
            (media::ANN_FROM_NODE.to_string(), "node-a".to_string()),
        ]);
        let layer = |chunk| PushedLayer {
            title: "memory-ranges".into(),
            media_type: media::layer_media_type("memory-ranges").into(),
            digest: "sha256:m".into(),
            size: 5,
            chunk,
        };
        let raw = snapshot_manifest(false, "sha256:c", 9, &[layer(None)], ann.clone());
        let OciManifest::Image(m) = parse_manifest(&raw).unwrap() else {
            panic!()
        };
        assert_eq!(image_kind(&m), ArtifactKind::SnapshotV1);
        assert_eq!(m.layers[0].media_type, media::VM_MEMORY);
        assert_eq!(title(&m.layers[0]), Some("memory-ranges"));
        assert_eq!(annotation(&m.layers[0], media::ANN_CHUNK_INDEX), None);
        assert_eq!(
            (m.config.size, m.config.media_type.as_str()),
            (9, media::SNAPSHOT_CONFIG)
        );
        assert_eq!(m.annotations.as_ref(), Some(&ann));

        let raw = snapshot_manifest(true, "sha256:c", 9, &[layer(Some((1, 3)))], ann);
        let OciManifest::Image(m) = parse_manifest(&raw).unwrap() else {
            panic!()
        };
        assert_eq!(image_kind(&m), ArtifactKind::SnapshotV2);
        assert_eq!(
            (
                annotation(&m.layers[0], media::ANN_CHUNK_INDEX),
                annotation(&m.layers[0], media::ANN_CHUNK_COUNT)
            ),
            (Some("1"), Some("3"))
        );
    }
}
