//! A create over a hibernated guest restores it and never boots it fresh: from the registry (an
//! unavailable registry fails closed until the retry), from a verified local copy, or refused
//! with a reason when a hibernate snapshot conflicts with the pod.

use super::*;

/// Lifecycle: L17
/// Lifecycle: L11, L18, L21.
/// Checklist rows: restore_test/EvidenceMatchingImageRestores
#[tokio::test(flavor = "multi_thread")]
async fn a_hibernated_guest_is_restored_instead_of_booted_fresh() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    // The guest hibernated elsewhere: its state sits under vm-h:hibernate only.
    seed_snapshot(&env, "vm-h", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(env.runtime.as_ref(), "vm-h", "vm-h", "hibernate", "snap:v1")
        .await
        .unwrap();
    env.runtime.snapshot_remove_if_exists("vm-h").await.unwrap();
    let d = start(&env, Options::default());
    let history = PodHistory::record(&env, "agent-0");
    create(
        &env,
        &managed("agent-0", "vm-h", &[("cocoonset.cocoonstack.io/image", "snap:v1")]),
    )
    .await;
    wait_ready(&env, "agent-0").await;
    // The restore the evidence derived is the daemon's own knowledge: no version of the pod
    // ever carries the marker (a later delete and recreate must derive it again, or not).
    history
        .first("the ready version recorded", |p| {
            kube::ResourceExt::annotations(p)
                .get("vm.cocoonstack.io/lifecycle-state")
                .map(String::as_str)
                == Some("ready")
        })
        .await;
    assert!(
        history
            .versions()
            .iter()
            .all(|p| !kube::ResourceExt::annotations(p).contains_key("vm.cocoonstack.io/restore-from-hibernate")),
        "the derived restore marker was written to the pod"
    );
    let argv = calls(&env, "vm clone")[0].join(" ");
    assert!(
        argv.ends_with(" vm-h-hibernate-import"),
        "restored from the pulled hibernate snapshot: {argv}"
    );
    eventually(10, "HibernateSnapshotExists event", || {
        has_event(&env, "agent-0", "HibernateSnapshotExists")
    })
    .await;
    assert!(
        !calls(&env, "snapshot rm")
            .iter()
            .any(|a| a.contains(&"fork-vm-h".to_string())),
        "a restore keeps the lineage's fork snapshot"
    );
    d.kill().await;
}

/// Lifecycle: L13.
/// Checklist rows: restore_test/CreatePodEvidenceFailClosedOnRegistryError
#[tokio::test(flavor = "multi_thread")]
async fn an_unavailable_registry_fails_closed_then_the_retry_restores() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "snap", "ghcr.io/x/base:1").await;
    registry.down.store(true, Ordering::SeqCst);
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-e", &[("cocoonset.cocoonstack.io/image", "snap")]),
    )
    .await;
    wait_failed_with(&env, "agent-0", "refusing fresh boot").await;
    eventually(10, "warning event", || {
        has_event(&env, "agent-0", "HibernateEvidenceUnavailable")
    })
    .await;
    assert!(
        vms(&env).await.iter().all(|v| v.name() != "vm-e"),
        "no VM boots while the evidence is unknown"
    );
    assert!(calls(&env, "vm clone").is_empty());
    // The registry comes back (no hibernate tag): the retried create boots it.
    registry.down.store(false, Ordering::SeqCst);
    wait_ready(&env, "agent-0").await;
    d.kill().await;
}

/// Lifecycle: L14, L15.
/// Checklist rows: restore_test/EvidenceImageConflictRefusesBoot,
/// restore_test/EvidenceForkFromConflict
#[tokio::test(flavor = "multi_thread")]
async fn conflicts_with_a_hibernate_snapshot_boot_nothing_and_say_why() {
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "vm-c", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(env.runtime.as_ref(), "vm-c", "vm-c", "hibernate", "snap:v1")
        .await
        .unwrap();
    seed_snapshot(&env, "vm-f", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(env.runtime.as_ref(), "vm-f", "vm-f", "hibernate", "snap:v1")
        .await
        .unwrap();
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("img-0", "vm-c", &[("cocoonset.cocoonstack.io/image", "snap:v2")]),
    )
    .await;
    create(
        &env,
        &managed(
            "src-0",
            "vm-f",
            &[
                ("cocoonset.cocoonstack.io/image", "snap:v1"),
                ("vm.cocoonstack.io/fork-from", "vm-other"),
            ],
        ),
    )
    .await;
    wait_failed_with(
        &env,
        "img-0",
        "was hibernated from image snap:v1 but the pod requests snap:v2",
    )
    .await;
    wait_failed_with(&env, "src-0", "explicit clone source").await;
    eventually(10, "events", || {
        has_event(&env, "img-0", "HibernateImageConflict") && has_event(&env, "src-0", "HibernateSourceConflict")
    })
    .await;
    // The bring-up policy says an operator must settle these: the pods wait, they do not fail.
    for name in ["img-0", "src-0"] {
        eventually(10, "the wait is explained", || {
            events(&env, name)
                .iter()
                .any(|(_, note)| note.contains("waiting for an operator"))
        })
        .await;
        assert_ne!(phase(&env, name).as_deref(), Some("Failed"), "{name}");
    }
    assert!(calls(&env, "vm clone").is_empty(), "nothing cloned");
    assert!(vms(&env).await.is_empty(), "nothing booted");
    d.kill().await;
}

/// Lifecycle: L12, L16, L59.
/// Checklist rows: restore_test/BringUpVMRestoreFromHibernate,
/// restore_test/CreatePodDerivesRestoreFromLocalEvidence,
/// update_test/ResolveWakeSourceUsesLocalSnapshot,
/// wakeverify_test/ResolveWakeSourceVerifiedLocalHit,
/// wakeverify_test/ResolveWakeSourceStaleLocalDiscardsAndPulls
#[tokio::test(flavor = "multi_thread")]
async fn wake_sources_a_verified_local_copy_discards_a_stale_one_and_registry_less_nodes_use_local_evidence() {
    // Registry: a local copy whose id matches the :hibernate config is cloned directly.
    let env = env(true).await;
    let registry = env.registry.clone().unwrap();
    seed_snapshot(&env, "vm-w", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(env.runtime.as_ref(), "vm-w", "vm-w", "hibernate", "snap:v1")
        .await
        .unwrap();
    // A stale local copy: the tag was pushed from another snapshot.
    seed_snapshot(&env, "vm-s-other", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(env.runtime.as_ref(), "vm-s-other", "vm-s", "hibernate", "snap:v1")
        .await
        .unwrap();
    seed_snapshot(&env, "vm-s", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("w", "vm-w", &[("cocoonset.cocoonstack.io/image", "snap:v1")]),
    )
    .await;
    create(
        &env,
        &managed("s", "vm-s", &[("cocoonset.cocoonstack.io/image", "snap:v1")]),
    )
    .await;
    eventually(60, "both woke", || {
        lifecycle(&env, "w").as_deref() == Some("ready") && lifecycle(&env, "s").as_deref() == Some("ready")
    })
    .await;
    let sources: Vec<String> = calls(&env, "vm clone")
        .into_iter()
        .filter_map(|a| a.last().cloned())
        .collect();
    assert!(
        sources.contains(&"vm-w".to_string()),
        "verified local copy: {sources:?}"
    );
    assert!(
        sources.contains(&"vm-s-hibernate-import".to_string()),
        "stale local copy replaced by a pull: {sources:?}"
    );
    assert_eq!(registry.pulls.load(Ordering::SeqCst), 1);
    assert!(
        calls(&env, "snapshot rm")
            .iter()
            .any(|a| a.last().map(String::as_str) == Some("vm-s")),
        "the stale copy is discarded"
    );
    for argv in calls(&env, "vm clone") {
        assert!(
            argv.contains(&"--cpu-weight".to_string()),
            "every clone path passes the cgroup flags: {argv:?}"
        );
    }
    d.kill().await;

    // Registry-less: a local snapshot under the VM name is the evidence.
    let env = provider_support::env(false).await;
    seed_snapshot(&env, "vm-l", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("l", "vm-l", &[("cocoonset.cocoonstack.io/image", "whatever:v9")]),
    )
    .await;
    eventually(60, "restored", || lifecycle(&env, "l").as_deref() == Some("ready")).await;
    assert_eq!(calls(&env, "vm clone")[0].last().map(String::as_str), Some("vm-l"));
    eventually(10, "restore event", || has_event(&env, "l", "HibernateSnapshotExists")).await;
    d.kill().await;
}

/// A restore from a `:hibernate` tag pulled onto a node that lacks the guest's base image gets
/// the image first (by reference, once; the clone still passes `--pull`), a second guest of the
/// same image finds its digest and pulls nothing, and a guest of an http(s) cloud image is left
/// to cocoon's `--pull`.
/// Lifecycle: L26.
/// Checklist rows: restore_test/RestoreEnsuresOCIRefBaseImage,
/// restore_test/RestoreSkipsEnsureWhenDigestPresent, restore_test/RestorePullsHTTPBase
#[tokio::test(flavor = "multi_thread")]
async fn a_restore_on_a_node_without_the_base_image_gets_it_before_the_clone() {
    let origin = env(true).await;
    let registry = origin.registry.clone().unwrap();
    seed_snapshot(&origin, "vm-h", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(origin.runtime.as_ref(), "vm-h", "vm-h", "hibernate", "snap:v1")
        .await
        .unwrap();
    seed_snapshot(&origin, "vm-h2", "ghcr.io/x/base:1").await;
    registry
        .push_snapshot(origin.runtime.as_ref(), "vm-h2", "vm-h2", "hibernate", "snap:v1")
        .await
        .unwrap();
    let web = "https://images.test/noble.qcow2";
    seed_snapshot(&origin, "vm-w", web).await;
    registry
        .push_snapshot(origin.runtime.as_ref(), "vm-w", "vm-w", "hibernate", "web:v1")
        .await
        .unwrap();
    let mut env = env(false).await;
    env.registry = Some(registry);
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("h-0", "vm-h", &[("cocoonset.cocoonstack.io/image", "snap:v1")]),
    )
    .await;
    wait_ready(&env, "h-0").await;
    let seq: Vec<String> = env
        .sim
        .calls()
        .unwrap()
        .into_iter()
        .filter(|c| matches!(c.verb.as_str(), "image pull" | "vm clone"))
        .map(|c| c.argv.join(" "))
        .collect();
    assert_eq!(seq.len(), 2, "{seq:?}");
    assert!(seq[0].ends_with("ghcr.io/x/base:1"), "the base image first: {seq:?}");
    assert!(
        seq[1].ends_with(" vm-h-hibernate-import") && seq[1].contains("--pull"),
        "then the restore, still with --pull: {seq:?}"
    );

    // Another guest of the same base image: its digest is on the node now, nothing is pulled.
    create(
        &env,
        &managed("h2-0", "vm-h2", &[("cocoonset.cocoonstack.io/image", "snap:v1")]),
    )
    .await;
    wait_ready(&env, "h2-0").await;
    assert_eq!(calls(&env, "image pull").len(), 1, "the base image is pulled once");
    assert!(
        calls(&env, "vm clone")
            .last()
            .unwrap()
            .join(" ")
            .ends_with(" vm-h2-hibernate-import")
    );

    create(
        &env,
        &managed("w-0", "vm-w", &[("cocoonset.cocoonstack.io/image", "web:v1")]),
    )
    .await;
    wait_ready(&env, "w-0").await;
    assert_eq!(
        calls(&env, "image pull").len(),
        1,
        "the http base is not pulled by the daemon"
    );
    let clone = calls(&env, "vm clone").last().unwrap().join(" ");
    assert!(
        clone.ends_with(" vm-w-hibernate-import") && clone.contains("--pull"),
        "{clone}"
    );
    d.kill().await;
}

/// On a node without a registry, a hibernated guest whose local snapshot has gone cannot be
/// woken from anywhere: the wake fails on the pod and nothing boots fresh in its place.
/// Checklist rows: update_test/ResolveWakeSourceErrorsWhenLocalMissingAndNoPuller
#[tokio::test(flavor = "multi_thread")]
async fn a_registry_less_wake_without_its_local_snapshot_fails_and_boots_nothing() {
    let env = provider_support::env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("lw-0", "vm-lw", &[("cocoonset.cocoonstack.io/image", "base")]),
    )
    .await;
    wait_ready(&env, "lw-0").await;
    annotate(&env, "lw-0", &[("vm.cocoonstack.io/hibernate", Some("true"))]).await;
    eventually(30, "hibernated", || {
        lifecycle(&env, "lw-0").as_deref() == Some("hibernated")
    })
    .await;
    assert!(vm_named(&env, "vm-lw").await.is_none());
    env.runtime.snapshot_remove_if_exists("vm-lw").await.unwrap();
    let boots = calls(&env, "vm clone").len() + calls(&env, "vm run").len();
    annotate(&env, "lw-0", &[("vm.cocoonstack.io/hibernate", None)]).await;
    let message = wait_failed_with(&env, "lw-0", "vm-lw").await;
    assert!(vm_named(&env, "vm-lw").await.is_none(), "booted fresh: {message}");
    assert_eq!(
        calls(&env, "vm clone").len() + calls(&env, "vm run").len(),
        boots,
        "{message}"
    );
    d.kill().await;
}
