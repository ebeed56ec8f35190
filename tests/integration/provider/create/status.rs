//! What the apiserver sees of a create: the pod status before the ready annotation, and a
//! lifecycle write lost to an apiserver outage written again.

use super::*;

/// Lifecycle: L41, L42.
/// Checklist rows: create_test/CreatePodAdoptPublishesStatusBeforeReady
#[tokio::test(flavor = "multi_thread")]
async fn the_status_lands_before_the_ready_annotation() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    let history = PodHistory::record(&env, "order-0");
    create(
        &env,
        &managed("order-0", "vm-order", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "order-0").await;
    // The first stored version that says `lifecycle-state=ready` already carries the status:
    // the pod IP and a Ready condition that is True (the probe answered).
    let first_ready = history
        .first("a recorded version with lifecycle ready", |p| {
            p.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("vm.cocoonstack.io/lifecycle-state"))
                .map(String::as_str)
                == Some("ready")
        })
        .await;
    let status = first_ready.status.expect("status landed first");
    assert!(status.pod_ip.is_some(), "the pod IP landed before the ready annotation");
    let ready = status
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        ready.status, "True",
        "Ready landed before the ready annotation: {ready:?}"
    );
    d.kill().await;
}

/// The runtime annotations are written beside the first probe, not before it: the guest work
/// (the fixup, whose first step writes `post-clone-state`) still starts only once they landed,
/// so no stored version of the pod shows the fixup under way without the VM it runs in — even
/// when the runtime write needs a second attempt (its first fails, a retry interval apart).
/// Lifecycle: L42.
#[tokio::test(flavor = "multi_thread")]
async fn the_runtime_annotations_land_before_the_guest_fixup_starts() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    let history = PodHistory::record(&env, "fixup-0");
    // The clone takes a second; once `creating` landed, the pod's next write (the runtime
    // write's first attempt, after the clone) fails and is retried after `patch_retry`.
    env.sim.delay("vm clone", Some(1), 1_000).unwrap();
    create(
        &env,
        &managed("fixup-0", "vm-fixup", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    eventually(20, "lifecycle creating", || {
        lifecycle(&env, "fixup-0").as_deref() == Some("creating")
    })
    .await;
    env.server
        .inject_fault(Some(axum::http::Method::PATCH), "/pods/fixup-0", 500, 1);
    wait_ready(&env, "fixup-0").await;
    use vk_test_support::daemon::annotation;
    // The first version with the fixup's marker (waited for: the recorder may lag the store).
    history
        .first("a recorded version with post-clone-state", |p| {
            annotation(p, "vm.cocoonstack.io/post-clone-state").is_some()
        })
        .await;
    for version in history.versions() {
        if let Some(state) = annotation(&version, "vm.cocoonstack.io/post-clone-state") {
            assert!(
                annotation(&version, ID_KEY).is_some_and(|id| !id.is_empty())
                    && annotation(&version, IP_KEY).is_some_and(|ip| !ip.is_empty()),
                "post-clone-state={state} landed before the runtime annotations: {:?}",
                version.metadata.annotations
            );
        }
    }
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lifecycle_write_lost_to_an_apiserver_outage_is_reflushed() {
    let env = env(false).await;
    let d = start(&env, Options::default());
    // Every attempt of the provider's own write fails; the lifecycle reconciler lands it later.
    env.server
        .inject_fault(Some(axum::http::Method::PATCH), "/pods/lost-0", 500, 3);
    create(
        &env,
        &agent_pod("lost-0", &[("cocoonset.cocoonstack.io/managed", "true")]),
    )
    .await;
    eventually(60, "failed lifecycle re-flushed", || {
        lifecycle(&env, "lost-0").as_deref() == Some("failed")
    })
    .await;
    assert!(lifecycle_message(&env, "lost-0").contains("missing vm.cocoonstack.io/name"));
    d.kill().await;
}
