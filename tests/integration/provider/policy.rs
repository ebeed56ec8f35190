//! The provider acts on what a policy decides, whoever wrote it: swapping the bring-up policy
//! file at runtime changes the next CreatePod decision (a trap fails safe, the default restored
//! boots the retried create); a custom policy's refusals get the retry their `kind` says, not
//! one guessed from their reason tokens; a bring-up policy built at contract 0.1.0 still
//! serves CreatePod as before; and a policy spinning to its deadline stalls no other task.

use crate::provider_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use policy_artifacts::hostile;
use provider_support::*;
use vk_cocoon::policy::config::SlotConfig;
use vk_cocoon::policy::reload::PolicyReloader;
use vk_cocoon::policy::slots::BringUp;
use vk_cocoon::policy::{ContractVersion, LoadedPolicy, Origin, Slot};

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
        BTreeMap::from([(Slot::BringUp, SlotConfig::file(path.clone()))]),
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

    let default_digest = env.policies.digest(Slot::BringUp);
    replace(&path, hostile::TRAPPER);
    eventually(20, "the new component serves", || {
        env.policies.digest(Slot::BringUp) != default_digest
    })
    .await;

    create(
        &env,
        &managed("after", "vm-after", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_failed_with(&env, "after", "fail-safe").await;
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

const GATE: &str = "test.cocoonstack.io/gate";

/// Serves bring-up with `bytes` (a custom or an old component) from now on.
fn install_bring_up(env: &Env, name: &str, bytes: &[u8]) -> ContractVersion {
    let policy =
        LoadedPolicy::<BringUp>::load(env.policies.engine(), None, Origin::File(name.into()), bytes).expect("loads");
    let version = policy.version();
    env.policies.install(policy);
    version
}

/// Refusals of the bring-up slot seen so far.
fn refusals(env: &Env) -> u64 {
    env.policies.metrics().decisions(Slot::BringUp, "refuse")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_custom_policy_refusing_with_its_own_tokens_gets_the_retry_its_kind_says() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    assert_eq!(
        install_bring_up(&env, "custom-refuser.wasm", hostile::CUSTOM_REFUSER),
        ContractVersion::V0_3_0
    );
    let d = start(&env, Options::default());
    let gated = |name: &str, vm: &str, kind: &str| {
        managed(name, vm, &[("cocoonset.cocoonstack.io/image", "base"), (GATE, kind)])
    };

    // permanent: one decision, the pod is published Failed with the policy's Event reason.
    create(&env, &gated("permanent", "vm-permanent", "permanent")).await;
    eventually(60, "the permanently refused pod fails", || {
        phase(&env, "permanent").as_deref() == Some("Failed")
    })
    .await;
    assert!(has_event(&env, "permanent", "CreateBringUpFailed"));
    assert!(lifecycle_message(&env, "permanent").contains("the custom gate holds vm vm-permanent"));

    // retry-later: retried with backoff (the kubelet's ProviderCreateFailed), never Failed.
    let before = refusals(&env);
    create(&env, &gated("later", "vm-later", "retry-later")).await;
    eventually(60, "the create is retried", || {
        refusals(&env) >= before + 3 && has_event(&env, "later", "ProviderCreateFailed")
    })
    .await;
    assert_ne!(phase(&env, "later").as_deref(), Some("Failed"));
    assert!(vm_named(&env, "vm-later").await.is_none(), "a refusal boots nothing");

    // needs-operator: waits (an Event saying so), re-checked; the operator's edit of the pod
    // runs it at once, and once the gate is open the pod boots.
    create(&env, &gated("operator", "vm-operator", "needs-operator")).await;
    eventually(60, "the pod says it waits for an operator", || {
        events(&env, "operator")
            .iter()
            .any(|(reason, note)| reason == "CreateBringUpFailed" && note.contains("waiting for an operator"))
    })
    .await;
    assert_ne!(phase(&env, "operator").as_deref(), Some("Failed"));
    assert!(
        !has_event(&env, "operator", "ProviderCreateFailed"),
        "not the transient retry"
    );
    annotate(&env, "operator", &[(GATE, None)]).await;
    eventually(60, "the operator's fix boots the pod", || {
        lifecycle(&env, "operator").as_deref() == Some("ready")
    })
    .await;
    assert!(vm_named(&env, "vm-operator").await.is_some());

    // The retried pod boots too once its gate opens.
    annotate(&env, "later", &[(GATE, None)]).await;
    eventually(60, "the retried pod boots", || {
        lifecycle(&env, "later").as_deref() == Some("ready")
    })
    .await;
    assert_eq!(phase(&env, "permanent").as_deref(), Some("Failed"), "a rejection stays");
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bring_up_policy_built_at_0_1_0_serves_create_pod_as_before() {
    let env = env(true).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let old = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat/v0.1.0/bring-up.wasm"))
        .unwrap();
    assert_eq!(
        install_bring_up(&env, "bring-up@0.1.0.wasm", &old),
        ContractVersion::V0_1_0
    );
    let d = start(&env, Options::default());

    create(
        &env,
        &managed("clone", "vm-clone", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    eventually(60, "the 0.1.0 policy's clone is ready", || {
        lifecycle(&env, "clone").as_deref() == Some("ready")
    })
    .await;
    assert!(vm_named(&env, "vm-clone").await.is_some());

    // 0.1.0 refused a clone-from-dir conflict for good: the pod fails, as it did.
    create(
        &env,
        &managed(
            "conflict",
            "vm-conflict",
            &[
                ("cocoonset.cocoonstack.io/image", "base"),
                ("vm.cocoonstack.io/clone-from-dir", "/exports/x"),
                ("vm.cocoonstack.io/fork-from", "vm-clone"),
            ],
        ),
    )
    .await;
    eventually(60, "the refused pod fails", || {
        phase(&env, "conflict").as_deref() == Some("Failed")
    })
    .await;
    assert!(has_event(&env, "conflict", "CreateBringUpFailed"));
    assert!(lifecycle_message(&env, "conflict").contains("incompatible with fork-from"));
    d.kill().await;
}

/// A hostile admission policy that spins until its deadline holds up only its own pod: the
/// decision runs on its task's thread after the worker hands its other tasks to another thread,
/// so a node with a single worker still runs them meanwhile (its lease renewals, its other
/// pods). The create fails safe.
#[tokio::test(flavor = "multi_thread", worker_threads = 1)]
async fn a_policy_spinning_to_its_deadline_stalls_no_other_task() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};
    use vk_cocoon::kubelet::Provider;
    use vk_cocoon::policy::slots::CpuClassAdmission;

    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let spin = LoadedPolicy::<CpuClassAdmission>::load(
        env.policies.engine(),
        None,
        Origin::File("spin.wasm".into()),
        hostile::SPIN_FOREVER,
    )
    .expect("a loop is valid at load");
    env.policies.install(spin);
    let p = provider(&env, &Options::default());
    let pod = Arc::new(
        create(
            &env,
            &managed("spun", "vm-spun", &[("cocoonset.cocoonstack.io/image", "base")]),
        )
        .await,
    );

    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            let mut every = tokio::time::interval(Duration::from_millis(10));
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                ticks.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    // On the runtime's only worker, as the pod controller runs it.
    let started = Instant::now();
    let created = tokio::spawn(async move { p.create_pod(&pod).await }).await.unwrap();
    let spun = started.elapsed();
    let ticked = ticks.load(Ordering::SeqCst);
    ticker.abort();

    assert!(
        created.is_err(),
        "a decision stopped at its deadline fails safe: {created:?}"
    );
    assert!(
        spun >= Duration::from_secs(5),
        "the decision ran to its 5 s deadline ({spun:?})"
    );
    assert!(
        ticked >= 100,
        "the other task ticked {ticked} times in {spun:?} (every 10 ms): the spinning decision held the worker"
    );
    assert!(
        vm_named(&env, "vm-spun").await.is_none(),
        "the refused pod boots nothing"
    );
}
