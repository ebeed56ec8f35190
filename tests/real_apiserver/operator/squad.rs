//! A CocoonSet with sub-agents: up and Running, scaled up and down, suspended and resumed with
//! the default `hibernatePolicy: retain` (the pods stay, their guests go to `:hibernate`).

use kube::ResourceExt;

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_cocoonset_with_sub_agents_runs_scales_suspends_and_resumes_through_the_operator() {
    let Some(site) = Site::new("squad").await else {
        return;
    };
    let set = "squad";
    let (main, sub1, sub2) = (site.vm(set, 0), site.vm(set, 1), site.vm(set, 2));
    site.create_set(
        set,
        json!({
            "snapshotPolicy": "always",
            "agent": {"image": IMAGE_REF, "replicas": 2, "resources": {"requests": {"cpu": "100m"}}},
        }),
    )
    .await;

    // Up: the main agent placed by the scheduler (pool selector, provider toleration), the
    // sub-agents bound to its node and forked from it; every pod ready at the set's generation.
    let up = site.wait_phase(set, "Running", 3).await;
    let generation = up.metadata.generation.unwrap();
    // The operator counts an agent ready by its pod's Ready condition, which the daemon lands
    // just before the `lifecycle-state: ready` annotation: the last pod's annotation may still
    // be on its way when the set turns Running.
    for pod in ["squad-0", "squad-1", "squad-2"] {
        site.wait_pod(pod, "ready at the set's generation", |p| {
            p.is_some_and(|p| ready_at(p, generation))
        })
        .await;
    }
    let pods = site.pods_of(set).await;
    let names: Vec<_> = pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
    assert_eq!(names, ["squad-0", "squad-1", "squad-2"]);
    let roles: Vec<_> = pods
        .iter()
        .map(|p| p.labels().get(ROLE).cloned().unwrap_or_default())
        .collect();
    assert_eq!(roles, ["main", "sub-agent", "sub-agent"]);
    for pod in &pods {
        assert_eq!(
            node_of(pod),
            Some(site.machine.node.as_str()),
            "{:?}",
            pod.metadata.name
        );
        assert!(ready_at(pod, generation), "{:?}", pod.metadata);
        assert_eq!(annotation(pod, GENERATION), Some(generation.to_string().as_str()));
    }
    let scheduled = events_about(&site.admin, &site.ns, "squad-0").await;
    assert!(
        scheduled
            .iter()
            .any(|(_, reason, note)| reason == "Scheduled" && note.contains(&site.machine.node)),
        "the scheduler placed the main agent: {scheduled:?}"
    );
    for sub in &pods[1..] {
        assert_eq!(annotation(sub, FORK_FROM), Some(main.as_str()));
    }
    let mut before = Vec::new();
    for (pod, vm) in pods.iter().zip([&main, &sub1, &sub2]) {
        let ids = site.vm_ids(vm).await;
        assert_eq!(ids.len(), 1, "one VM {vm}: {ids:?}");
        assert_eq!(annotation(pod, VM_ID), Some(ids[0].as_str()));
        before.push(ids[0].clone());
    }
    let agents = status_agents(&up);
    assert_eq!(
        agents,
        vec![
            ("squad-0".to_string(), main.clone(), before[0].clone()),
            ("squad-1".to_string(), sub1.clone(), before[1].clone()),
            ("squad-2".to_string(), sub2.clone(), before[2].clone()),
        ],
        "status.agents names each pod's VM and id"
    );

    // Scale up to three sub-agents, then down to one: the extra pods go, their VMs with them,
    // each pushed to `:latest` first (snapshotPolicy always).
    let scaled = site.patch_set(set, json!({"agent": {"replicas": 3}})).await;
    site.wait_phase(set, "Running", 4).await;
    let sub3 = site.vm(set, 3);
    let pod3 = site
        .wait_pod("squad-3", "ready", |p| p.is_some_and(|p| ready_at(p, scaled)))
        .await
        .unwrap();
    assert_eq!(annotation(&pod3, FORK_FROM), Some(main.as_str()));
    assert_eq!(site.vm_ids(&sub3).await.len(), 1);
    site.patch_set(set, json!({"agent": {"replicas": 1}})).await;
    site.wait_phase(set, "Running", 2).await;
    for (pod, vm) in [("squad-2", &sub2), ("squad-3", &sub3)] {
        site.wait_pod(pod, "deleted", |p| p.is_none()).await;
        assert!(site.vm_ids(vm).await.is_empty(), "{vm} is removed with its pod");
        assert!(
            site.has_tag(vm, "latest").await,
            "{vm}:latest pushed before the VM went"
        );
    }

    // Suspend: every guest hibernates into `<vm>:hibernate`, the pods stay (retain).
    let suspended = site.patch_set(set, json!({"suspend": true})).await;
    site.wait_set(set, "phase Suspended", |s| {
        s.is_some_and(|s| phase_of(s) == Some("Suspended"))
    })
    .await;
    for (pod, vm) in [("squad-0", &main), ("squad-1", &sub1)] {
        let p = site.pods().get(pod).await.unwrap();
        assert!(hibernated_at(&p, suspended), "{pod}: {:?}", p.metadata.annotations);
        assert_eq!(annotation(&p, HIBERNATE), Some("true"));
        assert_eq!(annotation(&p, VM_ID), None, "{pod} runs no VM");
        assert!(site.vm_ids(vm).await.is_empty(), "{vm} is removed");
        assert!(site.has_tag(vm, "hibernate").await, "{vm}:hibernate pushed");
    }

    // Resume: both wake with new VMs, restored from their snapshots (the node's own copies,
    // verified against the tags).
    let resumed = site.patch_set(set, json!({"suspend": false})).await;
    site.wait_phase(set, "Running", 2).await;
    for (i, (pod, vm)) in [("squad-0", &main), ("squad-1", &sub1)].into_iter().enumerate() {
        let p = site
            .wait_pod(pod, "woken", |p| p.is_some_and(|p| ready_at(p, resumed)))
            .await
            .unwrap();
        let ids = site.vm_ids(vm).await;
        assert_eq!(ids.len(), 1, "{vm}: {ids:?}");
        assert_ne!(ids[0], before[i], "{vm} is a new incarnation");
        assert_eq!(annotation(&p, VM_ID), Some(ids[0].as_str()));
        assert_eq!(annotation(&p, HIBERNATE), None);
        let woken = events_about(&site.admin, &site.ns, pod).await;
        assert!(
            woken.iter().any(|(_, reason, note)| reason == "Woken"
                && note == &format!("cloned from local snapshot {vm}, verified against {vm}:hibernate")),
            "{pod}: {woken:?}"
        );
        // cocoon-operator v0.3.3 drops a `:hibernate` tag only when a CocoonHibernation wakes
        // its pod and when the set is deleted, not when a set resumes (see `deploy/operator.md`).
        assert!(
            site.has_tag(vm, "hibernate").await,
            "{vm}:hibernate stays after the resume"
        );
    }
    assert_eq!(
        site.machine.calls("snapshot import"),
        Vec::<String>::new(),
        "nothing was pulled from the registry"
    );
}

/// After a retained suspend and resume, cocoon-operator v0.3.3 leaves each VM's `:hibernate`
/// tag in the registry, and a sub-agent slot that leaves and comes back gets a pod with
/// `fork-from` and no restore marker. The daemon remembers which guest it woke from that tag, so
/// the leftover is no hibernated state: the slot is forked from the main agent again (before,
/// each rebuild was refused `HibernateSourceConflict` until the operator dead-lettered the pod).
#[tokio::test(flavor = "multi_thread")]
async fn a_sub_agent_slot_that_returns_after_a_resume_is_forked_again() {
    let Some(site) = Site::new("return").await else {
        return;
    };
    let set = "squad";
    site.create_set(set, json!({"agent": {"image": IMAGE_REF, "replicas": 1}}))
        .await;
    site.wait_phase(set, "Running", 2).await;
    site.patch_set(set, json!({"suspend": true})).await;
    site.wait_set(set, "phase Suspended", |s| {
        s.is_some_and(|s| phase_of(s) == Some("Suspended"))
    })
    .await;
    site.patch_set(set, json!({"suspend": false})).await;
    site.wait_phase(set, "Running", 2).await;

    site.patch_set(set, json!({"agent": {"replicas": 0}})).await;
    site.wait_pod("squad-1", "deleted", |p| p.is_none()).await;
    let back = site.patch_set(set, json!({"agent": {"replicas": 1}})).await;
    site.wait_phase(set, "Running", 2).await;
    // The set's status can still show the two ready agents from before the slot left (the
    // operator had not yet counted the departure): the returning pod itself is waited for.
    let pod = site
        .wait_pod("squad-1", "the returning slot up", |p| {
            p.is_some_and(|p| ready_at(p, back))
        })
        .await
        .unwrap();
    assert_eq!(annotation(&pod, FORK_FROM), Some(site.vm(set, 0).as_str()));
}
