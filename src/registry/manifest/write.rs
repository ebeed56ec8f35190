//! The snapshot manifest a push writes (v1, or v2 when a layer was compressed or chunked) and the
//! digest helper both halves of the registry code use.

use super::*;
use crate::registry::media;
use std::collections::BTreeMap;

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
