//! Cloud images for mode=run against a real registry: disk layers sorted by title are concatenated into
//! `cocoon image import <repo:tag>`; present images are not re-imported unless forced; snapshot artifacts
//! are refused ("use mode=clone"); container images and absent tags are left to `cocoon image pull`.

use crate::registry_support;

use crate::runtime_support;
use registry_support::{TestRegistry, push_raw_artifact};
use sha2::Digest;
use vk_cocoon::provider::ports::CloudImageResult as CloudImage;
use vk_cocoon::registry::RegistryError;
use vk_cocoon::registry::media;
use vk_cocoon::runtime::CocoonRuntime;

fn qcow_parts() -> (Vec<u8>, Vec<u8>) {
    let mut p0 = b"QFI\xfb".to_vec();
    p0.extend((0..300_000u32).map(|i| (i % 251) as u8));
    let p1: Vec<u8> = (0..200_000u32).map(|i| (i % 13) as u8).collect();
    (p0, p1)
}

/// Lifecycle: L31.
/// Checklist rows: create_test/EnsureRunImageDispatch, create_test/EnsureRunImageWarmHitNoImport,
/// create_test/EnsureRunImageLaterForceReimports
#[tokio::test]
async fn a_cloud_image_is_imported_from_its_disk_layers_in_title_order() {
    let reg = TestRegistry::start();
    let r = reg.transfer_client("cocoon", "n");
    let h = runtime_support::harness();
    let (p0, p1) = qcow_parts();
    // Pushed out of order: the title decides.
    push_raw_artifact(
        &reg,
        "cocoon/ubuntu",
        "24.04",
        media::OS_IMAGE,
        (media::OCI_EMPTY, b"{}"),
        &[
            (
                "application/vnd.cocoonstack.disk.qcow2.part",
                "ubuntu.qcow2.part-001",
                p1.clone(),
            ),
            (
                "application/vnd.cocoonstack.disk.qcow2.part",
                "ubuntu.qcow2.part-000",
                p0.clone(),
            ),
        ],
    )
    .await;
    let got = r.ensure_cloud_image(&h.client, "ubuntu:24.04", false).await.unwrap();
    assert_eq!(got, CloudImage::Imported("ubuntu:24.04".into()));
    let img = h.client.image_inspect("ubuntu:24.04").await.unwrap();
    let whole = [p0.as_slice(), p1.as_slice()].concat();
    assert_eq!(
        img.id,
        hex::encode(sha2::Sha256::digest(&whole)),
        "bytes concatenated in title order"
    );
    assert_eq!(img.size, whole.len() as u64);
    assert_eq!(img.kind, "cloudimg");

    let imports = || {
        h.sim
            .calls()
            .unwrap()
            .iter()
            .filter(|c| c.verb == "image import")
            .count()
    };
    assert_eq!(imports(), 1);
    // Present and not forced: nothing imported.
    assert_eq!(
        r.ensure_cloud_image(&h.client, "ubuntu:24.04", false).await.unwrap(),
        CloudImage::Imported("ubuntu:24.04".into())
    );
    assert_eq!(imports(), 1);
    // Forced: imported again.
    r.ensure_cloud_image(&h.client, "ubuntu:24.04", true).await.unwrap();
    assert_eq!(imports(), 2);
}

#[tokio::test]
async fn snapshots_are_refused_and_other_kinds_are_left_to_image_pull() {
    let reg = TestRegistry::start();
    let r = reg.transfer_client("", "n");
    let h = runtime_support::harness();
    push_raw_artifact(
        &reg,
        "snap",
        "latest",
        media::SNAPSHOT_V1,
        (media::SNAPSHOT_CONFIG, br#"{"schemaVersion":"v1","snapshotId":"S"}"#),
        &[(media::VM_MEMORY, "memory-ranges", vec![0; 10])],
    )
    .await;
    let e = r.ensure_cloud_image(&h.client, "snap", false).await.unwrap_err();
    assert!(
        matches!(e.registry(), Some(RegistryError::SnapshotArtifact { .. })),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("snap:latest") && e.to_string().contains("use mode=clone"),
        "{e}"
    );

    push_raw_artifact(
        &reg,
        "busybox",
        "1",
        "",
        (media::OCI_IMAGE_CONFIG, b"{}"),
        &[("application/vnd.oci.image.layer.v1.tar", "l", vec![1])],
    )
    .await;
    assert_eq!(
        r.ensure_cloud_image(&h.client, "busybox:1", false).await.unwrap(),
        CloudImage::NotACloudImage
    );
    assert_eq!(
        r.ensure_cloud_image(&h.client, "absent:tag", false).await.unwrap(),
        CloudImage::NotACloudImage
    );

    // A cloud image with a non-disk layer is refused with its media type.
    push_raw_artifact(
        &reg,
        "weird",
        "1",
        media::OS_IMAGE,
        (media::OCI_EMPTY, b"{}"),
        &[("application/x-iso9660", "disk.iso", vec![1])],
    )
    .await;
    let e = r.ensure_cloud_image(&h.client, "weird:1", false).await.unwrap_err();
    assert!(
        matches!(e.registry(), Some(RegistryError::UnsupportedMediaType { .. }))
            && e.to_string().contains("application/x-iso9660"),
        "{e:?}"
    );
    assert!(h.sim.calls().unwrap().iter().all(|c| c.verb != "image import"));
}

#[tokio::test]
async fn a_corrupted_cloud_image_layer_fails_the_import() {
    let reg = TestRegistry::start();
    let r = reg.transfer_client("", "n");
    let h = runtime_support::harness();
    let (p0, _) = qcow_parts();
    let d = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&p0)));
    push_raw_artifact(
        &reg,
        "img",
        "1",
        media::OS_IMAGE,
        (media::OCI_EMPTY, b"{}"),
        &[(media::DISK_QCOW2, "disk.qcow2", p0.clone())],
    )
    .await;
    let mut bad = p0.clone();
    bad[100_000] ^= 1;
    std::fs::write(reg.blob_path(&d), bad).unwrap();
    let e = r.ensure_cloud_image(&h.client, "img:1", false).await.unwrap_err();
    assert!(matches!(e.registry(), Some(RegistryError::Corrupt { .. })), "{e:?}");
    assert!(
        h.client.image_inspect("img:1").await.is_err(),
        "a corrupt image was registered"
    );
}
