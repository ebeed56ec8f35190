//! A CocoonHibernation of one sub-agent and its wake, then the set's deletion with the
//! operator's garbage collection of the registry tags, by tag.

use super::*;

/// Waits until CocoonHibernation `name` reports `phase`.
async fn wait_hibernation(site: &Site, name: &str, phase: &str) -> DynamicObject {
    let watch = await_condition(site.hibernations(), name, |h: Option<&DynamicObject>| {
        h.is_some_and(|h| phase_of(h) == Some(phase))
    });
    match tokio::time::timeout(Duration::from_secs(STEP_SECS), watch).await {
        Ok(result) => result.unwrap().expect("the hibernation exists"),
        Err(_) => panic!(
            "timed out after {STEP_SECS} s waiting for CocoonHibernation {}/{name}: phase {phase}\n{}",
            site.ns,
            site.report().await
        ),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cocoonhibernation_hibernates_and_wakes_one_sub_agent_and_deleting_the_set_collects_its_tags() {
    let Some(site) = Site::new("crew").await else {
        return;
    };
    let set = "crew";
    let (main, sub1, sub2) = (site.vm(set, 0), site.vm(set, 1), site.vm(set, 2));
    site.create_set(
        set,
        json!({"snapshotPolicy": "main-only", "agent": {"image": IMAGE_REF, "replicas": 2}}),
    )
    .await;
    site.wait_phase(set, "Running", 3).await;
    let first = site.vm_ids(&sub1).await;

    // Hibernate crew-1 alone.
    let nap = json!({
        "apiVersion": format!("{}/{}", op::GROUP, op::VERSION),
        "kind": "CocoonHibernation",
        "metadata": {"name": "nap", "namespace": site.ns},
        "spec": {"podRef": {"name": "crew-1"}, "desire": "Hibernate"},
    });
    site.hibernations()
        .create(&PostParams::default(), &serde_json::from_value(nap).unwrap())
        .await
        .unwrap();
    let hibernated = wait_hibernation(&site, "nap", "Hibernated").await;
    assert_eq!(
        hibernated.data.pointer("/status/vmName").and_then(Value::as_str),
        Some(sub1.as_str())
    );
    let pod = site.pods().get("crew-1").await.unwrap();
    assert_eq!(lifecycle(&pod), Some("hibernated"), "{:?}", pod.metadata.annotations);
    assert_eq!(annotation(&pod, HIBERNATE), Some("true"));
    assert_eq!(annotation(&pod, VM_ID), None);
    assert!(site.vm_ids(&sub1).await.is_empty(), "{sub1} is removed");
    assert!(site.has_tag(&sub1, "hibernate").await, "{sub1}:hibernate pushed");
    for vm in [&main, &sub2] {
        assert_eq!(site.vm_ids(vm).await.len(), 1, "{vm} keeps running");
        assert!(!site.has_tag(vm, "hibernate").await, "{vm} is not hibernated");
    }
    // The set counts it out: two of three agents ready, crew-1 listed without a VM.
    let during = site
        .wait_set(set, "2 of 3 agents ready", |s| {
            s.is_some_and(|s| status_int(s, "readyAgents") == 2 && status_int(s, "desiredAgents") == 3)
        })
        .await
        .unwrap();
    let agents = status_agents(&during);
    assert!(
        agents.contains(&("crew-1".to_string(), sub1.clone(), String::new())),
        "{agents:?}"
    );

    // Wake it: a new VM from the snapshot, and the operator drops the tag once it runs.
    site.hibernations()
        .patch(
            "nap",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"desire": "Wake"}})),
        )
        .await
        .unwrap();
    wait_hibernation(&site, "nap", "Active").await;
    let pod = site
        .wait_pod("crew-1", "woken", |p| p.is_some_and(is_up))
        .await
        .unwrap();
    let ids = site.vm_ids(&sub1).await;
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_ne!(ids, first, "a new incarnation of {sub1}");
    assert_eq!(annotation(&pod, VM_ID), Some(ids[0].as_str()));
    site.wait_tag(&sub1, "hibernate", false).await;
    site.wait_phase(set, "Running", 3).await;

    // Hibernated again, then the whole set deleted: the operator deletes the pods and garbage-
    // collects the tags by tag — `:hibernate` everywhere, and under `main-only` every
    // sub-agent's `:latest` (a stale one planted here), keeping the main's, which the daemon
    // pushed when its pod went.
    site.hibernations()
        .patch(
            "nap",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"desire": "Hibernate"}})),
        )
        .await
        .unwrap();
    wait_hibernation(&site, "nap", "Hibernated").await;
    assert!(site.has_tag(&sub1, "hibernate").await);
    site.registry()
        .push_snapshot(site.machine.runtime.as_ref(), IMAGE_REF, &sub2, "latest", IMAGE_REF)
        .await
        .unwrap();
    site.delete_set(set).await;
    site.wait_set(set, "deleted", |s| s.is_none()).await;
    assert!(site.pods_of(set).await.is_empty(), "the pods are gone");
    for vm in [&main, &sub1, &sub2] {
        assert!(site.vm_ids(vm).await.is_empty(), "{vm} is removed");
        assert!(!site.has_tag(vm, "hibernate").await, "{vm}:hibernate collected");
    }
    assert!(
        site.has_tag(&main, "latest").await,
        "the main's :latest stays (main-only)"
    );
    assert!(!site.has_tag(&sub2, "latest").await, "{sub2}:latest collected");
    assert!(!site.has_tag(&sub1, "latest").await, "no :latest for {sub1}");

    // The hibernation's own finalizer lets it go.
    site.hibernations()
        .delete("nap", &DeleteParams::default())
        .await
        .unwrap();
    let gone = await_condition(site.hibernations(), "nap", |h: Option<&DynamicObject>| h.is_none());
    tokio::time::timeout(Duration::from_secs(STEP_SECS), gone)
        .await
        .expect("the hibernation is deleted")
        .unwrap();
}
