//! What the provider does with an artifact that is bad in itself (corrupt, or not in the shape it
//! declares): a pull that fails that way cannot succeed by being tried again, so the pod waits for an
//! operator (re-checked at the slowest pace) instead of pulling the same bytes on every retry.

use crate::provider_support::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_clone_from_a_corrupt_artifact_waits_for_an_operator_instead_of_retrying() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let oci = env.oci.as_ref().unwrap();
    let pushed = oci
        .client
        .push_snapshot(env.runtime.as_ref(), "base", "corrupt", "latest", "ghcr.io/x/base:1")
        .await
        .unwrap();
    {
        // Flip a byte of the memory blob in the registry's storage: its digest no longer matches.
        let server = oci.server.lock().unwrap();
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(server.blob_path(&pushed.manifest_digest)).unwrap()).unwrap();
        let memory = manifest["layers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["annotations"]["org.opencontainers.image.title"] == "memory-ranges")
            .unwrap()["digest"]
            .as_str()
            .unwrap()
            .to_string();
        let path = server.blob_path(&memory);
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
    }
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("clone", "vm-clone", &[("cocoonset.cocoonstack.io/image", "corrupt")]),
    )
    .await;
    let waits = |env: &Env| {
        events(env, "clone")
            .iter()
            .any(|(reason, note)| reason == "SnapshotPullFailed" && note.contains("waiting for an operator"))
    };
    eventually(60, "the pull's failure is reported", || {
        waits(&env) || has_event(&env, "clone", "ProviderCreateFailed")
    })
    .await;
    assert!(
        waits(&env) && !has_event(&env, "clone", "ProviderCreateFailed"),
        "a corrupt artifact is retried as a transient failure: {:?}",
        events(&env, "clone")
    );
    let note = events(&env, "clone")
        .into_iter()
        .find(|(reason, _)| reason == "SnapshotPullFailed")
        .unwrap()
        .1;
    assert!(note.contains("corrupt") && note.contains("re-push"), "{note}");
    assert!(vm_named(&env, "vm-clone").await.is_none(), "nothing boots from it");
    assert_ne!(
        phase(&env, "clone").as_deref(),
        Some("Failed"),
        "the pod waits, it is not failed"
    );
    d.kill().await;
}
