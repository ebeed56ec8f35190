//! DeletePod end to end: snapshot-before-destroy and `:latest` push with the base image, a
//! failed push keeps the VM and the delete retries (`DECISIONS.md` row 3), snapshot cleanup and the
//! keep-snapshot-on-delete flag.

use crate::provider_support;

use std::sync::atomic::Ordering;

use provider_support::*;

async fn wait_ready(env: &Env, name: &str) {
    eventually(60, &format!("{name} ready"), || {
        lifecycle(env, name).as_deref() == Some("ready")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_saves_and_pushes_latest_with_the_base_image_then_removes_the_vm_and_snapshots() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-d", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    assert!(vm_named(&env, "vm-d").await.is_some());
    delete(&env, "agent-0").await;
    eventually(60, "pod finalized", || get(&env, "agent-0").is_none()).await;
    assert_eq!(
        registry.pushes.lock().unwrap().clone(),
        vec![("vm-d".to_string(), "latest".to_string(), "base".to_string())]
    );
    assert_eq!(
        registry.annotations("vm-d", "latest").unwrap()["cocoonstack.snapshot.baseimage"],
        "base"
    );
    assert!(vm_named(&env, "vm-d").await.is_none(), "vm removed");
    assert!(
        env.runtime.snapshot_inspect("vm-d").await.unwrap_err().is_not_found(),
        "local snapshot dropped"
    );
    let rm: Vec<_> = calls(&env, "snapshot rm")
        .into_iter()
        .filter_map(|a| a.last().cloned())
        .collect();
    assert!(
        rm.contains(&"vm-d".to_string()) && rm.contains(&"fork-vm-d".to_string()),
        "{rm:?}"
    );
    // Save happened before the remove.
    let order: Vec<String> = env
        .sim
        .calls()
        .unwrap()
        .into_iter()
        .map(|c| c.verb)
        .filter(|v| v == "snapshot save" || v == "vm rm")
        .collect();
    assert_eq!(
        order.iter().rev().take(2).rev().cloned().collect::<Vec<_>>(),
        vec!["snapshot save", "vm rm"]
    );
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_push_keeps_the_vm_and_the_delete_retries_until_it_succeeds() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-k", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    registry.failing_pushes.store(3, Ordering::SeqCst);
    delete(&env, "agent-0").await;
    eventually(20, "DeleteKeptVM event", || has_event(&env, "agent-0", "DeleteKeptVM")).await;
    assert!(
        vm_named(&env, "vm-k").await.is_some(),
        "the VM is kept while its state is not saved"
    );
    assert!(
        get(&env, "agent-0").is_some(),
        "the pod stays until the delete succeeds"
    );
    eventually(60, "pod finalized after the registry recovers", || {
        get(&env, "agent-0").is_none()
    })
    .await;
    assert_eq!(registry.failing_pushes.load(Ordering::SeqCst), 0);
    assert!(registry.has("vm-k", "latest"));
    assert!(vm_named(&env, "vm-k").await.is_none());
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshot_policy_never_skips_the_save_and_keep_flag_keeps_the_local_snapshot() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed(
            "never-0",
            "vm-n",
            &[
                ("cocoonset.cocoonstack.io/image", "base"),
                ("cocoonset.cocoonstack.io/snapshot-policy", "never"),
            ],
        ),
    )
    .await;
    create(
        &env,
        &managed(
            "keep-0",
            "vm-keep",
            &[
                ("cocoonset.cocoonstack.io/image", "base"),
                ("cocoonset.cocoonstack.io/snapshot-policy", "never"),
                ("vm.cocoonstack.io/keep-snapshot-on-delete", "true"),
            ],
        ),
    )
    .await;
    wait_ready(&env, "never-0").await;
    wait_ready(&env, "keep-0").await;
    // A warm-wake cache of vm-keep on this node.
    let keep_vm = vm_named(&env, "vm-keep").await.unwrap();
    env.runtime.snapshot_save("vm-keep", &keep_vm.id).await.unwrap();
    delete(&env, "never-0").await;
    delete(&env, "keep-0").await;
    eventually(60, "both finalized", || {
        get(&env, "never-0").is_none() && get(&env, "keep-0").is_none()
    })
    .await;
    assert!(registry.pushes.lock().unwrap().is_empty(), "policy never: no push");
    assert!(vm_named(&env, "vm-n").await.is_none() && vm_named(&env, "vm-keep").await.is_none());
    assert!(
        env.runtime.snapshot_inspect("vm-keep").await.is_ok(),
        "keep-snapshot-on-delete keeps the local snapshot"
    );
    d.kill().await;
}

/// A delete that cocoon refuses outright (here its own name rule, as for a VM made under a name
/// cocoon no longer accepts) keeps the VM, but is not retried as if it could succeed: the pod
/// says it waits for an operator and what to do, and it finishes once the cause is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_cocoon_refuses_outright_waits_for_an_operator_and_says_what_to_do() {
    let env = env(true).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-p", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    let id = vm_named(&env, "vm-p").await.unwrap().id;
    env.sim
        .inject_failure("snapshot save", 1, "Error: invalid snapshot name \"vm-p\"", 1)
        .unwrap();
    delete(&env, "agent-0").await;
    eventually(60, "the kept VM's Event says the delete waits for an operator", || {
        events(&env, "agent-0").iter().any(|(reason, note)| {
            reason == "DeleteKeptVM"
                && note.contains("cannot succeed on a retry")
                && note.contains(&format!("cocoon vm rm {id}"))
                && note.ends_with("the VM is kept and the delete waits for an operator")
        })
    })
    .await;
    assert!(vm_named(&env, "vm-p").await.is_some(), "the VM is kept");
    // The operator's re-check finds the cause gone (the failure happened once): the delete ends.
    eventually(60, "pod finalized", || get(&env, "agent-0").is_none()).await;
    assert!(vm_named(&env, "vm-p").await.is_none());
    d.kill().await;
}
