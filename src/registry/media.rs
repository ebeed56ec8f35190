//! Pure media-type logic (snapshot and cloud-image artifacts): names, layer type by file name, the
//! reader allowlist, and artifact classification.

// The standard OCI / Docker types, as oci-client names them.
pub use oci_client::manifest::{
    IMAGE_CONFIG_MEDIA_TYPE as OCI_IMAGE_CONFIG, IMAGE_DOCKER_CONFIG_MEDIA_TYPE as DOCKER_IMAGE_CONFIG,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE as DOCKER_MANIFEST_LIST, IMAGE_MANIFEST_MEDIA_TYPE as DOCKER_MANIFEST,
    OCI_IMAGE_INDEX_MEDIA_TYPE as OCI_INDEX, OCI_IMAGE_MEDIA_TYPE as OCI_MANIFEST,
};
/// The OCI empty descriptor's type (cloud images use it as their config); oci-client does not name it.
pub const OCI_EMPTY: &str = "application/vnd.oci.empty.v1+json";

pub const SNAPSHOT_V1: &str = "application/vnd.cocoonstack.snapshot.v1+json";
pub const SNAPSHOT_V2: &str = "application/vnd.cocoonstack.snapshot.v2+json";
pub const SNAPSHOT_CONFIG: &str = "application/vnd.cocoonstack.snapshot.config.v1+json";
pub const OS_IMAGE: &str = "application/vnd.cocoonstack.os-image.v1+json";
pub const WINDOWS_IMAGE: &str = "application/vnd.cocoonstack.windows-image.v1+json";

pub const VM_CONFIG: &str = "application/vnd.cocoonstack.vm.config+json";
pub const VM_STATE: &str = "application/vnd.cocoonstack.vm.state+json";
pub const VM_MEMORY: &str = "application/vnd.cocoonstack.vm.memory";
pub const VM_CIDATA: &str = "application/vnd.cocoonstack.vm.cidata";
pub const DISK_QCOW2: &str = "application/vnd.cocoonstack.disk.qcow2";
pub const DISK_RAW: &str = "application/vnd.cocoonstack.disk.raw";
pub const OCTET_STREAM: &str = "application/octet-stream";

pub use oci_client::annotations::{
    ORG_OPENCONTAINERS_IMAGE_CREATED as ANN_CREATED, ORG_OPENCONTAINERS_IMAGE_TITLE as ANN_TITLE,
};
pub const ANN_BASEIMAGE: &str = "cocoonstack.snapshot.baseimage";
pub const ANN_FROM_NODE: &str = "cocoonstack.snapshot.from-node";
/// The pod (`<namespace>/<pod>`) whose guest a snapshot holds.
pub const ANN_OWNER: &str = "cocoonstack.snapshot.owner";
pub const ANN_CHUNK_INDEX: &str = "cocoonstack.chunk.index";
pub const ANN_CHUNK_COUNT: &str = "cocoonstack.chunk.count";

/// Media types sent in `Accept` when reading a manifest.
pub const MANIFEST_ACCEPT: &[&str] = &[OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_MANIFEST_LIST];

/// The `+zstd` form of a layer media type (v2 compressed layers).
pub fn zstd_media_type(media_type: &str) -> String {
    format!("{media_type}+zstd")
}

/// Layer media type of a snapshot file (B.3).
pub fn layer_media_type(file_name: &str) -> &'static str {
    match file_name {
        "config.json" => VM_CONFIG,
        "state.json" => VM_STATE,
        "cidata.img" => VM_CIDATA,
        n if n.starts_with("memory-range") => VM_MEMORY,
        n if n.ends_with(".qcow2") => DISK_QCOW2,
        n if n.ends_with(".raw") => DISK_RAW,
        _ => OCTET_STREAM,
    }
}

/// How a snapshot layer is encoded, by its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerEncoding {
    Raw,
    Zstd,
}

/// The reader allowlist: exactly the snapshot layer types, optionally `+zstd`. `None` = refuse.
pub fn snapshot_layer_encoding(media_type: &str) -> Option<LayerEncoding> {
    let (base, enc) = match media_type.strip_suffix("+zstd") {
        Some(b) => (b, LayerEncoding::Zstd),
        None => (media_type, LayerEncoding::Raw),
    };
    [
        VM_CONFIG,
        VM_STATE,
        VM_MEMORY,
        VM_CIDATA,
        DISK_QCOW2,
        DISK_RAW,
        OCTET_STREAM,
    ]
    .contains(&base)
    .then_some(enc)
}

/// Disk layer media types of a cloud image (B.4), including `.part` splits and the legacy windows names.
pub fn is_cloud_disk_layer(media_type: &str) -> bool {
    let base = media_type.strip_prefix("application/vnd.cocoonstack.").unwrap_or("");
    let base = base.strip_prefix("windows.").unwrap_or(base);
    matches!(base, "disk.qcow2" | "disk.qcow2.part" | "disk.raw" | "disk.raw.part")
}

/// What an artifact is (cocoon-common `manifest.Classify`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactKind {
    SnapshotV1,
    SnapshotV2,
    CloudImage,
    ContainerImage,
    ImageIndex,
    Unknown,
}

impl ArtifactKind {
    pub fn name(self) -> &'static str {
        match self {
            ArtifactKind::SnapshotV1 | ArtifactKind::SnapshotV2 => "snapshot",
            ArtifactKind::CloudImage => "cloud-image",
            ArtifactKind::ContainerImage => "container-image",
            ArtifactKind::ImageIndex => "image-index",
            ArtifactKind::Unknown => "unknown",
        }
    }
    pub fn is_snapshot(self) -> bool {
        matches!(self, ArtifactKind::SnapshotV1 | ArtifactKind::SnapshotV2)
    }
}

/// Classifies by `artifactType` first, then config media type, then the top-level media type.
pub fn classify(
    media_type: Option<&str>,
    artifact_type: Option<&str>,
    config_media_type: Option<&str>,
) -> ArtifactKind {
    match artifact_type {
        Some(SNAPSHOT_V1) => return ArtifactKind::SnapshotV1,
        Some(SNAPSHOT_V2) => return ArtifactKind::SnapshotV2,
        Some(OS_IMAGE) | Some(WINDOWS_IMAGE) => return ArtifactKind::CloudImage,
        _ => {}
    }
    match config_media_type {
        // A snapshot pushed without artifactType still carries the snapshot config type.
        Some(OCI_IMAGE_CONFIG) | Some(DOCKER_IMAGE_CONFIG) => return ArtifactKind::ContainerImage,
        _ => {}
    }
    match media_type {
        Some(OCI_INDEX) | Some(DOCKER_MANIFEST_LIST) => ArtifactKind::ImageIndex,
        _ => ArtifactKind::Unknown,
    }
}

/// Splits a registry-relative `repo[:tag]` with the shared `ParseRef` rule; an empty tag
/// (`repo:`) means `latest`, since a registry has no empty tag.
pub fn parse_ref(reference: &str) -> (String, String) {
    let (repo, tag) = vk_policy_support::naming::parse_ref(reference);
    let tag = if tag.is_empty() {
        vk_policy_support::naming::DEFAULT_SNAPSHOT_TAG
    } else {
        tag
    };
    (repo.to_string(), tag.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_types_by_name() {
        for (n, t) in [
            ("config.json", VM_CONFIG),
            ("state.json", VM_STATE),
            ("memory-ranges", VM_MEMORY),
            ("memory-range-1", VM_MEMORY),
            ("cidata.img", VM_CIDATA),
            ("overlay.qcow2", DISK_QCOW2),
            ("extra.qcow2", DISK_QCOW2),
            ("cow.raw", DISK_RAW),
            ("data-abc.raw", DISK_RAW),
            ("cocoon.json", OCTET_STREAM),
            ("vmstate", OCTET_STREAM),
            ("mem", OCTET_STREAM),
        ] {
            assert_eq!(layer_media_type(n), t, "{n}");
        }
    }

    #[test]
    fn allowlist() {
        assert_eq!(snapshot_layer_encoding(VM_MEMORY), Some(LayerEncoding::Raw));
        assert_eq!(
            snapshot_layer_encoding("application/vnd.cocoonstack.vm.memory+zstd"),
            Some(LayerEncoding::Zstd)
        );
        assert_eq!(
            snapshot_layer_encoding("application/octet-stream+zstd"),
            Some(LayerEncoding::Zstd)
        );
        assert_eq!(
            snapshot_layer_encoding("application/vnd.oci.image.layer.v1.tar+gzip"),
            None
        );
        assert_eq!(
            snapshot_layer_encoding("application/vnd.cocoonstack.vm.memory+gzip"),
            None
        );
        assert_eq!(snapshot_layer_encoding(""), None);
    }

    #[test]
    fn cloud_disk_layers() {
        for t in [
            "application/vnd.cocoonstack.disk.qcow2",
            "application/vnd.cocoonstack.disk.qcow2.part",
            "application/vnd.cocoonstack.disk.raw",
            "application/vnd.cocoonstack.disk.raw.part",
            "application/vnd.cocoonstack.windows.disk.qcow2",
            "application/vnd.cocoonstack.windows.disk.raw.part",
        ] {
            assert!(is_cloud_disk_layer(t), "{t}");
        }
        for t in [
            "application/vnd.cocoonstack.vm.memory",
            "application/octet-stream",
            "application/vnd.cocoonstack.disk.vhd",
        ] {
            assert!(!is_cloud_disk_layer(t), "{t}");
        }
    }

    #[test]
    fn classification() {
        assert_eq!(
            classify(Some(OCI_MANIFEST), Some(SNAPSHOT_V1), Some(SNAPSHOT_CONFIG)),
            ArtifactKind::SnapshotV1
        );
        assert_eq!(
            classify(Some(OCI_MANIFEST), Some(SNAPSHOT_V2), Some(SNAPSHOT_CONFIG)),
            ArtifactKind::SnapshotV2
        );
        assert_eq!(
            classify(Some(OCI_MANIFEST), Some(OS_IMAGE), Some(OCI_EMPTY)),
            ArtifactKind::CloudImage
        );
        assert_eq!(
            classify(Some(OCI_MANIFEST), Some(WINDOWS_IMAGE), Some(OCI_EMPTY)),
            ArtifactKind::CloudImage
        );
        assert_eq!(
            classify(Some(OCI_MANIFEST), None, Some(OCI_IMAGE_CONFIG)),
            ArtifactKind::ContainerImage
        );
        assert_eq!(
            classify(Some(DOCKER_MANIFEST), None, Some(DOCKER_IMAGE_CONFIG)),
            ArtifactKind::ContainerImage
        );
        assert_eq!(classify(Some(OCI_INDEX), None, None), ArtifactKind::ImageIndex);
        assert_eq!(
            classify(Some(DOCKER_MANIFEST_LIST), None, None),
            ArtifactKind::ImageIndex
        );
        assert_eq!(
            classify(Some(OCI_MANIFEST), Some("application/x-other"), Some("application/x")),
            ArtifactKind::Unknown
        );
    }

    #[test]
    fn refs() {
        assert_eq!(parse_ref("vm-a"), ("vm-a".into(), "latest".into()));
        assert_eq!(parse_ref("vm-a:hibernate"), ("vm-a".into(), "hibernate".into()));
        assert_eq!(parse_ref("a/b:c:d"), ("a/b".into(), "c:d".into()));
        assert_eq!(parse_ref("vm-a:"), ("vm-a".into(), "latest".into()));
    }
}
