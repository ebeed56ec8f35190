//! The copy of a watched pod the daemon keeps for as long as the pod is tracked: the parts of the
//! object something in the daemon reads, nothing else.
//!
//! A pod as the apiserver sends it is mostly defaults the daemon never looks at: the projected
//! service-account volume and its mounts, the default tolerations, DNS and scheduling settings,
//! and `metadata.managedFields` (one `fieldsV1` tree per field manager, decoded into nested JSON
//! maps). Decoded into k8s-openapi's types, that was about 19 KiB of heap per pod, half of it in
//! `spec.volumes` and the containers, and it was the largest part of the daemon's memory with
//! 1,000 pods (issue 15 item 8). The kept copy of the same pod is about 8.5 KiB.
//!
//! What is kept, and who reads it:
//! - `metadata` whole but for `managedFields`: identity, labels, annotations (the VM spec and the
//!   lifecycle), owner references (policy facts), deletion timestamps (the kubelet core);
//! - `status` whole: the status writer keeps condition transition times, the start time and the
//!   host IP from it, and compares against it before writing;
//! - of `spec`: the node name and node selector (policy facts), and of each container and init
//!   container its name, image and resources (the status's image, the resource-translation
//!   policy, `kubectl logs` / `exec` container names, stats).
//!
//! Dropping the rest is safe because the daemon never writes a pod object back whole: annotations
//! and status go out as merge patches, which leave every field they do not name as it is on the
//! apiserver. The kubelet API's `/pods` serves these copies, as it served them without
//! `managedFields` before.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

/// The copy of `pod` to keep (see the module doc).
pub fn keep(pod: Pod) -> Arc<Pod> {
    let Pod {
        mut metadata,
        spec,
        status,
    } = pod;
    metadata.managed_fields = None;
    Arc::new(Pod {
        metadata,
        spec: spec.map(kept_spec),
        status,
    })
}

fn kept_spec(spec: PodSpec) -> PodSpec {
    PodSpec {
        containers: spec.containers.into_iter().map(kept_container).collect(),
        init_containers: spec
            .init_containers
            .map(|containers| containers.into_iter().map(kept_container).collect()),
        node_name: spec.node_name,
        node_selector: spec.node_selector,
        ..PodSpec::default()
    }
}

fn kept_container(container: Container) -> Container {
    Container {
        name: container.name,
        image: container.image,
        resources: container.resources,
        ..Container::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::provider::ProviderPodStatus;
    use crate::kubelet::status::{build_pod_status, matches};
    use crate::model::{first_container_resources, pod_facts, vm_spec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// A clone pod as a real kube-apiserver returns it once the daemon has run it: the
    /// defaults and admission additions (service-account volume, tolerations), the daemon's
    /// annotations and status, and two field managers.
    fn served_pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "agent-17", "namespace": "team-a", "uid": "0b8a7c5e-1f2d",
                "resourceVersion": "123456", "creationTimestamp": "2026-12-02T10:00:00Z",
                "labels": {"app": "agent"},
                "annotations": {
                    "vm.cocoonstack.io/managed": "true", "vm.cocoonstack.io/vm-name": "vm-17",
                    "vm.cocoonstack.io/lifecycle": "ready", "vm.cocoonstack.io/ip": "127.0.0.18"
                },
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "agent-5d",
                                     "uid": "9f8e", "controller": true}],
                "managedFields": [
                    {"manager": "kubectl", "operation": "Update", "apiVersion": "v1",
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:containers": {}}}},
                    {"manager": "vk-cocoon", "operation": "Update", "apiVersion": "v1",
                     "subresource": "status", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}
                ]
            },
            "spec": {
                "nodeName": "vk-node", "nodeSelector": {"cocoonstack.io/cpu-class": "epyc-9004"},
                "containers": [{
                    "name": "agent", "image": "ghcr.io/x/base:1", "imagePullPolicy": "IfNotPresent",
                    "resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "2", "memory": "4Gi"}},
                    "env": [{"name": "MODE", "value": "agent"}],
                    "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
                    "volumeMounts": [{"mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                                      "name": "kube-api-access-x7k2p", "readOnly": true}]
                }],
                "initContainers": [{"name": "seed", "image": "busybox"}],
                "dnsPolicy": "ClusterFirst", "enableServiceLinks": true, "restartPolicy": "Always",
                "schedulerName": "default-scheduler", "securityContext": {}, "serviceAccountName": "default",
                "terminationGracePeriodSeconds": 30,
                "tolerations": [
                    {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists", "tolerationSeconds": 300}
                ],
                "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"items": [{"key": "ca.crt", "path": "ca.crt"}], "name": "kube-root-ca.crt"}}
                ]}}]
            },
            "status": {
                "phase": "Running", "hostIP": "127.0.0.1", "podIP": "127.0.0.18",
                "podIPs": [{"ip": "127.0.0.18"}], "startTime": "2026-12-02T10:00:01Z",
                "conditions": [
                    {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-02T10:00:01Z"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-02T10:00:02Z"}
                ],
                "containerStatuses": [{"name": "agent", "image": "ghcr.io/x/base:1", "imageID": "", "ready": true,
                                       "restartCount": 0, "started": true,
                                       "state": {"running": {"startedAt": "2026-12-02T10:00:02Z"}}}]
            }
        }))
        .expect("a valid pod")
    }

    #[test]
    fn the_kept_copy_gives_every_reader_what_the_served_pod_gives() {
        let mut served = served_pod();
        // Being deleted: the core reads the deletion timestamp.
        served.metadata.deletion_timestamp = served.metadata.creation_timestamp.clone();
        served.metadata.deletion_grace_period_seconds = Some(30);
        let kept = keep(served.clone());
        assert_eq!(pod_facts(&kept), pod_facts(&served), "policy facts");
        assert_eq!(vm_spec::of_pod(&kept), vm_spec::of_pod(&served), "the VM spec");
        assert_eq!(
            first_container_resources(&kept),
            first_container_resources(&served),
            "the resource-translation input"
        );
        let names = |p: &Pod| {
            let spec = p.spec.as_ref().unwrap();
            let init = spec.init_containers.iter().flatten();
            init.chain(&spec.containers).map(|c| c.name.clone()).collect::<Vec<_>>()
        };
        assert_eq!(names(&kept), ["seed", "agent"], "container names for logs and exec");
        assert!(kept.metadata.deletion_timestamp.is_some());
        assert_eq!(kept.metadata.deletion_timestamp, served.metadata.deletion_timestamp);
        assert_eq!(kept.metadata.deletion_grace_period_seconds, Some(30));
        assert_eq!(kept.metadata.resource_version, served.metadata.resource_version);
    }

    #[test]
    fn the_status_writer_builds_and_compares_the_same_status_from_the_kept_copy() {
        let served = served_pod();
        let kept = keep(served.clone());
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        for status in [
            ProviderPodStatus::pending("Booting", None),
            ProviderPodStatus::failed("SnapshotMissing", "no snapshot"),
        ] {
            assert_eq!(
                build_pod_status(&kept, &status, &now),
                build_pod_status(&served, &status, &now),
                "the status written for {status:?}"
            );
            assert_eq!(
                matches(kept.status.as_ref(), &status),
                matches(served.status.as_ref(), &status)
            );
        }
    }

    #[test]
    fn what_no_reader_needs_is_not_kept() {
        let kept = keep(served_pod());
        assert!(kept.metadata.managed_fields.is_none());
        let spec = kept.spec.as_ref().unwrap();
        assert!(spec.volumes.is_none() && spec.tolerations.is_none() && spec.security_context.is_none());
        let agent = &spec.containers[0];
        assert!(agent.volume_mounts.is_none() && agent.env.is_none() && agent.termination_message_path.is_none());
    }
}
