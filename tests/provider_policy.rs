//! Swapping the bring-up policy file at runtime changes the next CreatePod decision: a
//! component that traps makes bring-up fail safe (no VM, an Event and the lifecycle message);
//! restoring the default lets the retried create boot.

mod provider_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use policy_artifacts::hostile;
use provider_support::*;
use vk_cocoon::policy::Slot;
use vk_cocoon::policy::config::SlotConfig;
use vk_cocoon::policy::reload::PolicyReloader;

fn replace(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_swapped_bring_up_policy_decides_the_next_create() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bring-up.wasm");
    std::fs::write(&path, Slot::BringUp.default_component()).unwrap();
    let reloader = Arc::new(PolicyReloader::new(
        env.policies.clone(),
        BTreeMap::from([(
            Slot::BringUp,
            SlotConfig {
                path: path.clone(),
                cases: None,
            },
        )]),
    ));
    reloader.load_all().unwrap();
    let _watcher = reloader.clone().watch().unwrap();
    let d = start(&env, Options::default());

    create(
        &env,
        &managed("before", "vm-before", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    eventually(60, "first pod ready", || {
        lifecycle(&env, "before").as_deref() == Some("ready")
    })
    .await;

    let default_digest = env.policies.current(Slot::BringUp).digest().to_string();
    replace(&path, hostile::TRAPPER);
    eventually(20, "the new component serves", || {
        env.policies.current(Slot::BringUp).digest() != default_digest
    })
    .await;

    create(
        &env,
        &managed("after", "vm-after", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    eventually(60, "fail-safe refusal published", || {
        lifecycle(&env, "after").as_deref() == Some("failed")
    })
    .await;
    assert!(
        lifecycle_message(&env, "after").contains("fail-safe"),
        "{}",
        lifecycle_message(&env, "after")
    );
    eventually(10, "event", || has_event(&env, "after", "BringUpPolicyFailed")).await;
    assert!(
        vm_named(&env, "vm-after").await.is_none(),
        "the fail-safe decision boots nothing"
    );

    // Back to the default: the retried create (a policy failure is transient) boots it.
    replace(&path, Slot::BringUp.default_component());
    eventually(60, "second pod ready after the swap back", || {
        lifecycle(&env, "after").as_deref() == Some("ready")
    })
    .await;
    assert!(vm_named(&env, "vm-after").await.is_some());
    d.kill().await;
}
