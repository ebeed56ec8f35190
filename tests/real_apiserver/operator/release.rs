//! `hibernatePolicy: release` on a main-only set: suspending hibernates the main agent and then
//! deletes its pod, flagged `keep-snapshot-on-delete`, so its scheduling seat is free while the
//! node keeps its copy of the snapshot; resuming recreates the pod marked
//! `restore-from-hibernate`, which lands back on the node and restores from that copy without a
//! registry pull, and the operator drops the tag once the guest runs (by tag: the reason this
//! needs a registry that deletes by tag).

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_released_seat_wakes_from_the_copy_its_node_kept() {
    let Some(site) = Site::new("solo").await else {
        return;
    };
    let set = "solo";
    let vm = site.vm(set, 0);
    site.create_set(
        set,
        json!({"hibernatePolicy": "release", "agent": {"image": IMAGE_REF, "replicas": 0}}),
    )
    .await;
    site.wait_phase(set, "Running", 1).await;
    let first = site.vm_ids(&vm).await;
    assert_eq!(first.len(), 1, "{first:?}");
    let old_uid = site.pods().get("solo-0").await.unwrap().metadata.uid;

    // Suspend: hibernated, then the pod deleted; the tag in the registry, the snapshot kept on
    // the node, the node remembered on the set.
    site.patch_set(set, json!({"suspend": true})).await;
    let suspended = site
        .wait_set(set, "phase Suspended, pod released", |s| {
            s.is_some_and(|s| phase_of(s) == Some("Suspended") && object_annotation(s, HIBERNATED_ON_NODE).is_some())
        })
        .await
        .unwrap();
    assert_eq!(
        object_annotation(&suspended, HIBERNATED_ON_NODE),
        Some(site.machine.node.as_str())
    );
    site.wait_pod("solo-0", "released", |p| p.is_none()).await;
    assert!(site.vm_ids(&vm).await.is_empty(), "{vm} is removed");
    assert!(site.has_tag(&vm, "hibernate").await, "{vm}:hibernate pushed");
    assert!(
        !site.has_tag(&vm, "latest").await,
        "a hibernated pod's delete pushes nothing: it has no VM"
    );
    // The daemon drops a deleted pod's local snapshot unless the pod carried the operator's
    // `vm.cocoonstack.io/keep-snapshot-on-delete`.
    let kept = site.machine.runtime.snapshot_inspect(&vm).await;
    assert!(
        kept.is_ok(),
        "the node keeps its snapshot of {vm} (keep-snapshot-on-delete): {kept:?}"
    );

    // Resume: the pod comes back marked for restore, is placed on the same node, and the
    // daemon restores from the kept copy, checked against the tag; then the tag goes.
    let resumed = site.patch_set(set, json!({"suspend": false})).await;
    let pod = site
        .wait_pod("solo-0", "recreated and up", |p| {
            p.is_some_and(|p| p.metadata.uid != old_uid && ready_at(p, resumed))
        })
        .await
        .unwrap();
    assert_eq!(annotation(&pod, RESTORE), Some("true"));
    assert_eq!(node_of(&pod), Some(site.machine.node.as_str()));
    let ids = site.vm_ids(&vm).await;
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_ne!(ids, first, "a new incarnation of {vm}");
    assert_eq!(annotation(&pod, VM_ID), Some(ids[0].as_str()));
    let restored = format!("source=local snapshot {vm}, verified against {vm}:hibernate");
    assert!(
        site.daemon
            .log()
            .lines()
            .any(|l| l.contains("restored from hibernate") && l.contains(&restored)),
        "restored from the node's copy ({restored})"
    );
    assert_eq!(
        site.machine.calls("snapshot import"),
        Vec::<String>::new(),
        "nothing was pulled from the registry"
    );
    site.wait_tag(&vm, "hibernate", false).await;
    let running = site
        .wait_set(set, "Running, the node hint cleared", |s| {
            s.is_some_and(|s| {
                phase_of(s) == Some("Running")
                    && status_int(s, "readyAgents") == 1
                    && object_annotation(s, HIBERNATED_ON_NODE).is_none()
            })
        })
        .await
        .unwrap();
    assert_eq!(
        status_agents(&running),
        vec![("solo-0".to_string(), vm.clone(), ids[0].clone())]
    );
}
