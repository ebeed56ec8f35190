//! Semantics the fake shares with the real kube-apiserver, each checked on both servers.

use crate::{Server, api_err, on_both_servers, pod};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent, WatchParams,
};
use kube::runtime::events::{Event as KEvent, EventType, Recorder, Reporter};
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::time::Duration;

on_both_servers!(
    create_sets_uid_timestamp_and_increasing_resource_versions,
    a_missing_object_is_404_with_a_status_body,
    a_stale_resource_version_on_replace_is_a_conflict,
    patches_merge_and_the_status_subresource_takes_status_and_metadata_but_not_spec,
    strategic_merge_merges_keyed_lists_and_a_merge_patch_replaces_them,
    a_body_naming_another_uid_is_invalid_and_changes_nothing,
    graceful_pod_delete_sets_deletion_timestamp_and_grace_zero_removes,
    list_and_watch_filter_on_the_node_name,
    an_unsupported_field_selector_is_a_bad_request,
    a_streaming_list_ends_with_the_initial_events_bookmark,
    nodes_and_leases_with_conflicts,
    recorder_events_form_a_series_visible_in_both_event_apis,
    access_reviews_answer_for_the_caller,
);

fn pods(s: &Server) -> Api<Pod> {
    Api::namespaced(s.client.clone(), &s.ns)
}

async fn create_sets_uid_timestamp_and_increasing_resource_versions(s: &Server) {
    let pods = pods(s);
    let a = pods
        .create(&PostParams::default(), &pod(&s.ns, "a", None))
        .await
        .unwrap();
    let b = pods
        .create(&PostParams::default(), &pod(&s.ns, "b", None))
        .await
        .unwrap();
    assert!(a.metadata.uid.as_deref().is_some_and(|u| !u.is_empty()));
    assert_ne!(a.metadata.uid, b.metadata.uid);
    assert!(a.metadata.creation_timestamp.is_some());
    let rv = |p: &Pod| p.resource_version().unwrap().parse::<u64>().unwrap();
    assert!(rv(&b) > rv(&a), "{}", s.label);
    assert_eq!(a.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Pending"));

    let dup = api_err(
        pods.create(&PostParams::default(), &pod(&s.ns, "a", None))
            .await
            .unwrap_err(),
    );
    assert_eq!((dup.code, dup.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(dup.message, "pods \"a\" already exists", "{}", s.label);
}

async fn a_missing_object_is_404_with_a_status_body(s: &Server) {
    let pods = pods(s);
    let err = api_err(pods.get("nope").await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (404, "NotFound"));
    assert_eq!(err.message, "pods \"nope\" not found");
    assert_eq!(pods.get_opt("nope").await.unwrap(), None);
}

async fn a_stale_resource_version_on_replace_is_a_conflict(s: &Server) {
    let pods = pods(s);
    let created = pods
        .create(&PostParams::default(), &pod(&s.ns, "a", None))
        .await
        .unwrap();
    let mut first = created.clone();
    first.labels_mut().insert("x".into(), "1".into());
    let updated = pods.replace("a", &PostParams::default(), &first).await.unwrap();
    assert_ne!(updated.resource_version(), created.resource_version());

    let mut stale = created.clone();
    stale.labels_mut().insert("x".into(), "2".into());
    let err = api_err(pods.replace("a", &PostParams::default(), &stale).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message
            .contains("the object has been modified; please apply your changes to the latest version"),
        "{}: {}",
        s.label,
        err.message
    );
    assert_eq!(
        pods.get("a").await.unwrap().labels().get("x").map(String::as_str),
        Some("1")
    );
}

async fn patches_merge_and_the_status_subresource_takes_status_and_metadata_but_not_spec(s: &Server) {
    let pods = pods(s);
    let created = pods
        .create(&PostParams::default(), &pod(&s.ns, "a", Some("n1")))
        .await
        .unwrap();
    let uid = created.uid().unwrap();
    let pp = PatchParams::default();
    pods.patch(
        "a",
        &pp,
        &Patch::Merge(json!({"metadata": {"annotations": {"k": "v"}}})),
    )
    .await
    .unwrap();
    pods.patch(
        "a",
        &pp,
        &Patch::Strategic(json!({"metadata": {"annotations": {"k2": "v2"}}})),
    )
    .await
    .unwrap();
    let p: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/metadata/labels", "value": {"l": "1"}}])).unwrap();
    let after = pods.patch("a", &pp, &Patch::<()>::Json(p)).await.unwrap();
    assert_eq!(after.annotations().get("k").map(String::as_str), Some("v"));
    assert_eq!(after.annotations().get("k2").map(String::as_str), Some("v2"));
    assert_eq!(after.labels().get("l").map(String::as_str), Some("1"));

    // A status change through the main resource is ignored; through /status it lands.
    let ignored = pods
        .patch("a", &pp, &Patch::Merge(json!({"status": {"phase": "Running"}})))
        .await
        .unwrap();
    assert_eq!(ignored.status.unwrap().phase.as_deref(), Some("Pending"), "{}", s.label);
    let patched = pods
        .patch_status(
            "a",
            &pp,
            &Patch::Merge(json!({"metadata": {"uid": uid}, "status": {"phase": "Running", "podIP": "10.0.0.2"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
    assert_eq!(patched.status.as_ref().unwrap().pod_ip.as_deref(), Some("10.0.0.2"));
    // Through /status, metadata (labels, annotations) changes too, but the spec does not.
    let via_status = pods
        .patch_status(
            "a",
            &pp,
            &Patch::Merge(json!({
                "metadata": {"annotations": {"k": "changed"}},
                "spec": {"activeDeadlineSeconds": 5},
            })),
        )
        .await
        .unwrap();
    assert_eq!(
        via_status.annotations().get("k").map(String::as_str),
        Some("changed"),
        "{}",
        s.label
    );
    assert_eq!(via_status.spec.unwrap().active_deadline_seconds, None, "{}", s.label);
}

async fn strategic_merge_merges_keyed_lists_and_a_merge_patch_replaces_them(s: &Server) {
    let pods = pods(s);
    pods.create(&PostParams::default(), &pod(&s.ns, "a", Some("n1")))
        .await
        .unwrap();
    let pp = PatchParams::default();
    let condition = |t: &str, status: &str| json!({"type": t, "status": status});
    // In the order the server keeps them: the patch's elements first, then the ones it did not name.
    let types = |p: &Pod| -> Vec<(String, String)> {
        let conditions = p.status.as_ref().unwrap().conditions.clone().unwrap_or_default();
        conditions.into_iter().map(|c| (c.type_, c.status)).collect()
    };
    let set = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    };
    pods.patch_status(
        "a",
        &pp,
        &Patch::Merge(
            json!({"status": {"conditions": [condition("Ready", "False"), condition("Initialized", "True")]}}),
        ),
    )
    .await
    .unwrap();
    // Strategic: conditions merge by `type` (one replaced, one added, one kept).
    let merged = pods
        .patch_status(
            "a",
            &pp,
            &Patch::Strategic(
                json!({"status": {"conditions": [condition("Ready", "True"), condition("PodScheduled", "True")]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        types(&merged),
        set(&[("Ready", "True"), ("PodScheduled", "True"), ("Initialized", "True")]),
        "{}",
        s.label
    );
    // `$patch: delete` removes one element by its key.
    let deleted = pods
        .patch_status(
            "a",
            &pp,
            &Patch::Strategic(json!({"status": {"conditions": [{"type": "PodScheduled", "$patch": "delete"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(
        types(&deleted),
        set(&[("Ready", "True"), ("Initialized", "True")]),
        "{}",
        s.label
    );
    // Finalizers (a list of strings with the merge strategy) are a union, the patch's first.
    pods.patch(
        "a",
        &pp,
        &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/a"]}})),
    )
    .await
    .unwrap();
    let unioned = pods
        .patch(
            "a",
            &pp,
            &Patch::Strategic(json!({"metadata": {"finalizers": ["example.com/b"]}})),
        )
        .await
        .unwrap();
    assert_eq!(unioned.finalizers(), ["example.com/b", "example.com/a"], "{}", s.label);
    // A JSON merge patch replaces lists whole.
    let replaced = pods
        .patch_status(
            "a",
            &pp,
            &Patch::Merge(json!({"status": {"conditions": [condition("Ready", "False")]}})),
        )
        .await
        .unwrap();
    assert_eq!(types(&replaced), set(&[("Ready", "False")]), "{}", s.label);
    pods.patch("a", &pp, &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
}

async fn a_body_naming_another_uid_is_invalid_and_changes_nothing(s: &Server) {
    let pods = pods(s);
    let old = pods
        .create(&PostParams::default(), &pod(&s.ns, "a", Some("n1")))
        .await
        .unwrap();
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete("a", &now).await.unwrap();
    let new = pods
        .create(&PostParams::default(), &pod(&s.ns, "a", Some("n1")))
        .await
        .unwrap();
    assert_ne!(old.uid(), new.uid());

    // The uid-as-precondition idiom of status patches: a real apiserver answers 422 Invalid
    // (metadata.uid is immutable), not 409.
    for err in [
        pods.patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"uid": old.uid()}, "status": {"phase": "Failed"}})),
        )
        .await
        .unwrap_err(),
        pods.patch(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"uid": old.uid(), "annotations": {"x": "y"}}})),
        )
        .await
        .unwrap_err(),
    ] {
        let err = api_err(err);
        assert_eq!(
            (err.code, err.reason.as_str()),
            (422, "Invalid"),
            "{}: {err:?}",
            s.label
        );
        assert!(
            err.message.contains("metadata.uid: Invalid value") && err.message.contains("field is immutable"),
            "{}: {}",
            s.label,
            err.message
        );
    }
    let stored = pods.get("a").await.unwrap();
    assert_eq!(stored.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(stored.resource_version(), new.resource_version());
}

async fn graceful_pod_delete_sets_deletion_timestamp_and_grace_zero_removes(s: &Server) {
    let pods = pods(s);
    let bound = pods
        .create(&PostParams::default(), &pod(&s.ns, "bound", Some("n1")))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod(&s.ns, "unbound", None))
        .await
        .unwrap();

    pods.delete("bound", &DeleteParams::default()).await.unwrap();
    let marked = pods.get("bound").await.unwrap();
    assert!(marked.metadata.deletion_timestamp.is_some());
    assert_eq!(marked.metadata.deletion_grace_period_seconds, Some(30));
    // An unbound pod has nobody to wait for: removed at once.
    pods.delete("unbound", &DeleteParams::default()).await.unwrap();
    assert!(pods.get_opt("unbound").await.unwrap().is_none());

    // A uid precondition naming another incarnation is a conflict (409, unlike a body's uid).
    let wrong = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some("someone-else".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let err = api_err(pods.delete("bound", &wrong).await.unwrap_err());
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));
    assert!(
        err.message
            .contains("the UID in the precondition (someone-else) does not match"),
        "{}: {}",
        s.label,
        err.message
    );

    let right = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: bound.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    pods.delete("bound", &right).await.unwrap();
    assert!(pods.get_opt("bound").await.unwrap().is_none());
    assert_eq!(api_err(pods.delete("bound", &right).await.unwrap_err()).code, 404);
}

async fn list_and_watch_filter_on_the_node_name(s: &Server) {
    let (n1, n2) = (s.unique("n"), s.unique("n"));
    let all: Api<Pod> = Api::all(s.client.clone());
    let pods = pods(s);
    pods.create(&PostParams::default(), &pod(&s.ns, "mine", Some(&n1)))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod(&s.ns, "theirs", Some(&n2)))
        .await
        .unwrap();
    let on_n1 = format!("spec.nodeName={n1}");
    let list = all.list(&ListParams::default().fields(&on_n1)).await.unwrap();
    assert_eq!(
        list.items.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        vec!["mine"]
    );
    let rv = list.metadata.resource_version.clone().unwrap();

    let mut stream = all
        .watch(&WatchParams::default().fields(&on_n1), &rv)
        .await
        .unwrap()
        .boxed();
    pods.create(&PostParams::default(), &pod(&s.ns, "other", Some(&n2)))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod(&s.ns, "second", Some(&n1)))
        .await
        .unwrap();
    match next_event(&mut stream).await {
        Some(WatchEvent::Added(p)) => assert_eq!(p.name_any(), "second"),
        other => panic!("{}: expected ADDED second, got {other:?}", s.label),
    }
}

async fn an_unsupported_field_selector_is_a_bad_request(s: &Server) {
    let err = api_err(
        pods(s)
            .list(&ListParams::default().fields("spec.foo=x"))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (400, "BadRequest"));
    assert_eq!(err.message, "field label not supported: spec.foo", "{}", s.label);
}

async fn a_streaming_list_ends_with_the_initial_events_bookmark(s: &Server) {
    let pods = pods(s);
    pods.create(&PostParams::default(), &pod(&s.ns, "a", None))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod(&s.ns, "b", None))
        .await
        .unwrap();
    let mut stream = pods.watch(&WatchParams::streaming_lists(), "").await.unwrap().boxed();
    let mut added = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(WatchEvent::Added(p)) => added.push(p.name_any()),
            Some(WatchEvent::Bookmark(bm)) => {
                assert_eq!(
                    bm.metadata
                        .annotations
                        .get("k8s.io/initial-events-end")
                        .map(String::as_str),
                    Some("true"),
                    "{}",
                    s.label
                );
                break;
            }
            other => panic!("{}: unexpected {other:?}", s.label),
        }
    }
    added.sort();
    assert_eq!(added, ["a", "b"], "{}", s.label);
    pods.create(&PostParams::default(), &pod(&s.ns, "c", None))
        .await
        .unwrap();
    assert!(matches!(next_event(&mut stream).await, Some(WatchEvent::Added(p)) if p.name_any() == "c"));
}

async fn nodes_and_leases_with_conflicts(s: &Server) {
    let name = s.unique("node");
    let nodes: Api<Node> = Api::all(s.client.clone());
    let mut node = Node::default();
    node.metadata.name = Some(name.clone());
    let created = nodes.create(&PostParams::default(), &node).await.unwrap();
    assert!(created.metadata.namespace.is_none());
    let with_status = nodes
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"capacity": {"cpu": "4"}}})),
        )
        .await
        .unwrap();
    assert_eq!(with_status.status.unwrap().capacity.unwrap()["cpu"].0, "4");

    let leases: Api<Lease> = Api::namespaced(s.client.clone(), "kube-node-lease");
    let mut lease = Lease::default();
    lease.metadata.name = Some(name.clone());
    let l = leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut l2 = l.clone();
    l2.spec = Some(k8s_openapi::api::coordination::v1::LeaseSpec {
        holder_identity: Some(name.clone()),
        ..Default::default()
    });
    let renewed = leases.replace(&name, &PostParams::default(), &l2).await.unwrap();
    assert_ne!(renewed.resource_version(), l.resource_version());
    // The same body again is a no-op: nothing changes, so no conflict and no new version.
    l2.metadata.resource_version = renewed.resource_version();
    let again = leases.replace(&name, &PostParams::default(), &l2).await.unwrap();
    assert_eq!(again.resource_version(), renewed.resource_version(), "{}", s.label);
    // A stale version with a change is a conflict.
    let mut stale = l2.clone();
    stale.metadata.resource_version = l.resource_version();
    stale.spec.as_mut().unwrap().lease_duration_seconds = Some(40);
    let err = api_err(leases.replace(&name, &PostParams::default(), &stale).await.unwrap_err());
    assert_eq!(err.code, 409, "{}", s.label);
}

async fn recorder_events_form_a_series_visible_in_both_event_apis(s: &Server) {
    let p = pods(s)
        .create(&PostParams::default(), &pod(&s.ns, "a", Some("n1")))
        .await
        .unwrap();
    let recorder = Recorder::new(
        s.client.clone(),
        Reporter {
            controller: "vk-cocoon".into(),
            instance: Some("n1".into()),
        },
    );
    let ev = KEvent {
        type_: EventType::Warning,
        reason: "Boom".into(),
        note: Some("x".into()),
        action: "Create".into(),
        secondary: None,
    };
    recorder.publish(&ev, &p.object_ref(&())).await.unwrap();
    recorder.publish(&ev, &p.object_ref(&())).await.unwrap();
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(s.client.clone(), &s.ns);
    let listed = events.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), 1, "{}: the second publish patches the series", s.label);
    assert_eq!(listed[0].reason.as_deref(), Some("Boom"));
    assert_eq!(listed[0].series.as_ref().map(|s| s.count), Some(2));
    // `kubectl describe` and `kubectl get events` read core/v1: the same Event, converted.
    let core: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(s.client.clone(), &s.ns);
    let listed = core.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), 1, "{}", s.label);
    let e = &listed[0];
    assert_eq!(
        (e.reason.as_deref(), e.message.as_deref(), e.type_.as_deref()),
        (Some("Boom"), Some("x"), Some("Warning")),
        "{}",
        s.label
    );
    assert_eq!(e.involved_object.name.as_deref(), Some("a"));
    assert_eq!(e.reporting_component.as_deref(), Some("vk-cocoon"));
    assert_eq!(e.series.as_ref().and_then(|s| s.count), Some(2), "{}", s.label);
}

async fn access_reviews_answer_for_the_caller(s: &Server) {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(s.client.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some("patch".into()),
                resource: Some("pods".into()),
                ..Default::default()
            }),
            non_resource_attributes: None,
        },
        ..Default::default()
    };
    let answered = reviews.create(&PostParams::default(), &review).await.unwrap();
    assert!(
        answered.status.is_some_and(|st| st.allowed),
        "{}: an administrator may",
        s.label
    );
    let me = Api::<SelfSubjectReview>::all(s.client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    let groups = me
        .status
        .and_then(|st| st.user_info)
        .and_then(|u| u.groups)
        .unwrap_or_default();
    assert!(groups.iter().any(|g| g == "system:masters"), "{}: {groups:?}", s.label);
}

/// The next raw watch event that is not a BOOKMARK: an apiserver may send bookmarks at any time
/// to a watch that allows them, so tests of other events must step over them.
pub async fn next_event(
    stream: &mut futures::stream::BoxStream<'static, kube::Result<WatchEvent<Pod>>>,
) -> Option<WatchEvent<Pod>> {
    loop {
        let event = tokio::time::timeout(Duration::from_secs(10), stream.try_next())
            .await
            .expect("a watch event in time");
        match event.expect("the watch stream stays healthy") {
            Some(WatchEvent::Bookmark(_)) => continue,
            other => return other,
        }
    }
}
