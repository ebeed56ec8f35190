//! What a hostile registry (or a token server it names) may send, and what the client does with it:
//! answers read whole stay within a few MiB and the stall timeout, credentials go only to the
//! registry's own host (token realms, upload locations), a token's lifetime cannot overflow, an
//! artifact's layer count is checked before any download, and a repository name or tag cannot climb
//! out of `OCI_REGISTRY`'s prefix. The hostile parties are small HTTP servers on loopback
//! (`registry_support::hostile`); the prefix escape runs against the real docker-registry.

use crate::registry_support;

use registry_support::hostile::{Hostile, Seen, Served, answer, stalled};
use registry_support::{TestRegistry, client_at, push_raw_artifact};
use std::time::Duration;
use vk_cocoon::registry::media;
use vk_cocoon::registry::{ManifestLookup, RegistryAuth, RegistryError, TransferSettings};

const MIB: u64 = 1 << 20;
/// More than any answer read whole may be, and small enough that the unbounded client of old reads it
/// all without endangering the machine.
const FLOOD: u64 = 256 * MIB;
/// What the server may have handed out when the client stops at its limit (a few MiB): what the
/// loopback socket buffers on both sides and the server's frames in flight hold besides.
const HUNG_UP_BY: u64 = 64 * MIB;

fn basic() -> RegistryAuth {
    RegistryAuth::Basic("node".into(), "s3cret-node-password".into())
}

fn tuned(stall_secs: u64) -> TransferSettings {
    TransferSettings {
        stall_timeout: Duration::from_secs(stall_secs),
        ..TransferSettings::default()
    }
}

/// The `Bearer` challenge naming `realm`.
fn challenge(realm: &str) -> axum::response::Response {
    let value = format!(r#"Bearer realm="{realm}",service="hostile""#);
    answer(
        401,
        &[
            ("www-authenticate", value.as_str()),
            ("content-type", "application/json"),
        ],
        r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#.into(),
    )
}

fn has_bearer(s: &Seen, token: &str) -> bool {
    s.header("authorization") == Some(&format!("Bearer {token}"))
}

#[tokio::test]
async fn a_manifest_that_never_ends_is_cut_off_after_a_few_mib() {
    let reg = Hostile::start([127, 0, 0, 1], |s: &Seen, served: &Served| {
        if s.path().contains("/manifests/") {
            answer(200, &[("content-type", media::OCI_MANIFEST)], served.endless(FLOOD))
        } else {
            answer(200, &[], "{}".into())
        }
    })
    .await;
    let r = client_at(&reg.host(), "cocoon", "n", basic(), tuned(30));
    let e = r.manifest("vm", "hibernate").await.unwrap_err();
    let served = reg.served();
    assert!(
        served < HUNG_UP_BY,
        "the client read {} MiB of an endless manifest ({e})",
        served / MIB
    );
    assert!(matches!(e, RegistryError::InvalidArtifact { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("cocoon/vm:hibernate") || text.contains("vm:hibernate"),
        "{text}"
    );
    assert!(text.contains("MiB"), "the error says the limit: {text}");
}

#[tokio::test]
async fn a_manifest_that_stalls_fails_after_the_stall_timeout() {
    let reg = Hostile::start([127, 0, 0, 1], |s: &Seen, _: &Served| {
        if s.path().contains("/manifests/") {
            answer(200, &[("content-type", media::OCI_MANIFEST)], stalled())
        } else {
            answer(200, &[], "{}".into())
        }
    })
    .await;
    let r = client_at(&reg.host(), "cocoon", "n", basic(), tuned(2));
    let read = tokio::time::timeout(Duration::from_secs(20), r.manifest("vm", "hibernate")).await;
    let e = read
        .expect("the manifest read was still waiting for the body after 20 s")
        .unwrap_err();
    assert!(e.is_unavailable(), "{e:?}");
    assert!(e.to_string().contains("2 s"), "the error names the limit: {e}");
}

#[tokio::test]
async fn a_token_answer_that_never_ends_is_cut_off_after_a_few_mib() {
    let reg = Hostile::start([127, 0, 0, 1], |s: &Seen, served: &Served| {
        if s.path() == "/token" {
            return answer(200, &[("content-type", "application/json")], served.endless(FLOOD));
        }
        let realm = format!("http://{}/token", s.header("host").unwrap_or_default());
        challenge(&realm)
    })
    .await;
    let r = client_at(&reg.host(), "cocoon", "n", basic(), tuned(30));
    // The DELETE's own token exchange, and the manifest read's.
    let e = r.delete_manifest("vm", "hibernate").await.unwrap_err();
    assert!(
        reg.served() < HUNG_UP_BY,
        "the DELETE read {} MiB of an endless token answer ({e})",
        reg.served() / MIB
    );
    assert!(matches!(e, RegistryError::Denied { .. }), "{e:?}");
    let before = reg.served();
    let e = r.manifest("vm", "hibernate").await.unwrap_err();
    let read = reg.served() - before;
    assert!(
        read < HUNG_UP_BY,
        "the manifest read read {} MiB of an endless token answer ({e})",
        read / MIB
    );
    assert!(matches!(e, RegistryError::Denied { .. }), "{e:?}");
    assert!(e.to_string().contains("MiB"), "the error says the limit: {e}");
}

#[tokio::test]
async fn error_answers_are_read_only_as_far_as_the_message_needs() {
    let reg = Hostile::start([127, 0, 0, 1], |s: &Seen, served: &Served| {
        if s.path() == "/v2/" {
            answer(200, &[], "{}".into())
        } else {
            answer(500, &[("content-type", "text/plain")], served.endless(FLOOD))
        }
    })
    .await;
    let r = client_at(&reg.host(), "cocoon", "n", basic(), tuned(30));
    let e = r.delete_manifest("vm", "hibernate").await.unwrap_err();
    assert!(e.is_unavailable(), "{e:?}");
    let e2 = r.manifest("vm", "hibernate").await.unwrap_err();
    assert!(e2.is_unavailable(), "{e2:?}");
    assert!(
        reg.served() < 2 * HUNG_UP_BY,
        "the client read {} MiB of two endless error answers ({e} / {e2})",
        reg.served() / MIB
    );
    assert!(
        e.to_string().len() < 4096,
        "the message stays short: {} bytes",
        e.to_string().len()
    );
}

#[tokio::test]
async fn a_token_lifetime_of_u64_max_is_capped_not_a_panic() {
    let reg = Hostile::start([127, 0, 0, 1], |s: &Seen, _: &Served| {
        if s.path() == "/token" {
            return answer(
                200,
                &[("content-type", "application/json")],
                r#"{"token":"t0k","expires_in":18446744073709551615}"#.into(),
            );
        }
        if has_bearer(s, "t0k") {
            return answer(202, &[], axum::body::Body::empty());
        }
        let realm = format!("http://{}/token", s.header("host").unwrap_or_default());
        challenge(&realm)
    })
    .await;
    let r = client_at(&reg.host(), "cocoon", "n", basic(), tuned(30));
    r.delete_manifest("vm", "hibernate").await.unwrap();
    // The token was kept (for a bounded while): the second DELETE goes out with it at once.
    r.delete_manifest("vm", "hibernate").await.unwrap();
    let tokens = reg.seen().iter().filter(|s| s.path() == "/token").count();
    assert_eq!(tokens, 1, "{:?}", reg.seen());
}

#[tokio::test]
async fn credentials_never_go_to_a_token_realm_on_another_host() {
    // The registry (127.0.0.1) sends every client to a token realm on another host (127.0.0.2).
    let realm = Hostile::start([127, 0, 0, 2], |_: &Seen, _: &Served| {
        answer(
            200,
            &[("content-type", "application/json")],
            r#"{"token":"stolen"}"#.into(),
        )
    })
    .await;
    let realm_url = format!("http://{}/token", realm.host());
    let reg = {
        let realm_url = realm_url.clone();
        Hostile::start([127, 0, 0, 1], move |s: &Seen, _: &Served| {
            if has_bearer(s, "stolen") {
                answer(404, &[], axum::body::Body::empty())
            } else {
                challenge(&realm_url)
            }
        })
        .await
    };
    for auth in [
        basic(),
        RegistryAuth::Bearer("node-identity-token".into()),
        RegistryAuth::Anonymous,
    ] {
        let r = client_at(&reg.host(), "cocoon", "n", auth.clone(), tuned(30));
        let read = r.manifest("vm", "hibernate").await;
        let delete = r.delete_manifest("vm", "hibernate").await;
        let leaked: Vec<Seen> = realm
            .seen()
            .into_iter()
            .filter(|s| s.header("authorization").is_some())
            .collect();
        assert!(
            leaked.is_empty(),
            "the realm on another host received credentials: {leaked:?}"
        );
        assert!(
            realm.seen().is_empty(),
            "the realm on another host was asked: {:?}",
            realm.seen()
        );
        for res in [read.map(|_| ()), delete] {
            let e = res.unwrap_err();
            let text = e.to_string();
            assert!(
                matches!(e, RegistryError::UntrustedRealm { .. })
                    && text.contains(&realm_url)
                    && text.contains("OCI_REGISTRY_TOKEN_REALMS"),
                "the error names the realm and what to do: {e:?}"
            );
        }
    }
}

#[tokio::test]
async fn an_artifact_with_too_many_layers_is_refused_before_any_download() {
    let blob = b"policy-bytes".to_vec();
    let blob_digest = vk_cocoon::registry::manifest::sha256_digest(&blob);
    let layer = serde_json::json!({"mediaType": "application/wasm", "digest": blob_digest, "size": blob.len()});
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_MANIFEST,
        "artifactType": "application/vnd.cocoonstack.policy.v1",
        "config": {"mediaType": "application/json", "digest": vk_cocoon::registry::manifest::sha256_digest(b"{}"), "size": 2},
        "layers": vec![layer; 100],
    }))
    .unwrap();
    let digest = vk_cocoon::registry::manifest::sha256_digest(&manifest);
    let reg = Hostile::start([127, 0, 0, 1], move |s: &Seen, _: &Served| {
        if s.path().contains("/manifests/") {
            answer(200, &[("content-type", media::OCI_MANIFEST)], manifest.clone().into())
        } else if s.path().contains("/blobs/") {
            answer(
                200,
                &[("content-type", "application/octet-stream")],
                blob.clone().into(),
            )
        } else {
            answer(200, &[], "{}".into())
        }
    })
    .await;
    let r = client_at(&reg.host(), "", "n", RegistryAuth::Anonymous, tuned(30));
    let res = r.pull_artifact("policies/bring-up", &digest, 16 * MIB).await;
    let downloads = reg.seen().iter().filter(|s| s.path().contains("/blobs/")).count();
    let layers = res.as_ref().map(|a| a.as_ref().map(|a| a.layers.len()));
    assert_eq!(
        downloads, 0,
        "blobs fetched before the layer count was checked (layers read: {layers:?})"
    );
    let e = res.unwrap_err();
    assert!(matches!(e, RegistryError::InvalidArtifact { .. }), "{e:?}");
    assert!(e.to_string().contains("100 layers"), "{e}");
}

#[tokio::test]
async fn a_repository_name_or_tag_cannot_climb_out_of_the_registry_prefix() {
    // `other:t` lives outside the prefix `team` this node is given.
    let reg = TestRegistry::start();
    push_raw_artifact(
        &reg,
        "other",
        "t",
        media::SNAPSHOT_V1,
        (
            media::SNAPSHOT_CONFIG,
            br#"{"schemaVersion":"v1","snapshotId":"X","files":{}}"#,
        ),
        &[(media::VM_MEMORY, "memory-ranges", vec![1, 2, 3])],
    )
    .await;
    let outside = reg.client("", "n");
    let r = reg.client("team", "n");
    for (repo, tag) in [
        ("../other", "t"),
        ("x/../../other", "t"),
        ("%2e%2e/other", "t"),
        ("vm", "../../../other/manifests/t"),
        ("vm", "..%2f..%2f..%2fother%2fmanifests%2ft"),
        ("Other", "t"),
    ] {
        let read = r.manifest(repo, tag).await;
        assert!(
            !matches!(read, Ok(ManifestLookup::Found(_))),
            "{repo}:{tag} read {read:?} outside the prefix"
        );
        let e = read.unwrap_err();
        assert!(matches!(e, RegistryError::InvalidName { .. }), "{repo}:{tag}: {e:?}");
        // A delete would have removed another team's artifact.
        let e = r.delete_manifest(repo, tag).await.unwrap_err();
        assert!(matches!(e, RegistryError::InvalidName { .. }), "{repo}:{tag}: {e:?}");
        assert!(
            matches!(outside.manifest("other", "t").await.unwrap(), ManifestLookup::Found(_)),
            "{repo}:{tag}: the node deleted an artifact outside its prefix"
        );
    }
}

#[tokio::test]
async fn an_upload_sent_to_another_host_carries_no_credentials() {
    // The registry accepts an upload session and names a Location on another host (127.0.0.2).
    let elsewhere = Hostile::start([127, 0, 0, 2], |_: &Seen, _: &Served| {
        answer(201, &[], axum::body::Body::empty())
    })
    .await;
    let location = format!("http://{}/upload/1", elsewhere.host());
    let reg = Hostile::start([127, 0, 0, 1], move |s: &Seen, _: &Served| match s.method.as_str() {
        "HEAD" => answer(404, &[], axum::body::Body::empty()),
        "POST" => answer(202, &[("location", location.as_str())], axum::body::Body::empty()),
        _ => answer(201, &[], axum::body::Body::empty()),
    })
    .await;
    let r = client_at(&reg.host(), "cocoon", "n", basic(), tuned(30));
    let upload = vk_cocoon::registry::ArtifactUpload {
        artifact_type: "application/vnd.cocoonstack.policy.v1".into(),
        config_media_type: "application/json".into(),
        config: b"{}".to_vec(),
        layers: Vec::new(),
        annotations: Default::default(),
    };
    let res = r.push_artifact("policies/bring-up", "v1", &upload).await;
    let leaked: Vec<Seen> = elsewhere
        .seen()
        .into_iter()
        .filter(|s| s.header("authorization").is_some())
        .collect();
    assert!(
        leaked.is_empty(),
        "the other host received credentials: {leaked:?} ({res:?})"
    );
    let e = res.unwrap_err();
    assert!(
        e.to_string().contains(&elsewhere.host()),
        "the error names where the upload was sent: {e}"
    );
}
