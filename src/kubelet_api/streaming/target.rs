//! The pod and VM a streaming request names, with the kubelet's refusals (before any upgrade,
//! as plain text the client shows).

use super::upgrade::Refusal;
use crate::kubelet_api::source::PodVm;
use crate::kubelet_api::state::ApiState;
use axum::http::StatusCode;

/// A pod with a live VM.
#[derive(Debug, Clone)]
pub struct Target {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub vm: PodVm,
}

/// Pod `namespace/pod` on this node, its `container` (when one is named) and its VM.
pub fn resolve(api: &ApiState, namespace: &str, pod_name: &str, container: Option<&str>) -> Result<Target, Refusal> {
    let Some((pod, vm)) = api.pods.pod(namespace, pod_name) else {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{pod_name} does not exist on node {}", api.node_name),
        ));
    };
    if let Some(container) = container {
        let containers: Vec<String> = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .map(|c| c.name.clone())
            .collect();
        if !containers.iter().any(|c| c == container) {
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!(
                    "container {container:?} is not in pod {namespace}/{pod_name} (containers: {})",
                    containers.join(", ")
                ),
            ));
        }
    }
    let Some(vm) = vm else {
        return Err(Refusal::new(
            StatusCode::CONFLICT,
            format!(
                "pod {namespace}/{pod_name} has no running VM (it is hibernated or still being created): nothing to connect to"
            ),
        ));
    };
    Ok(Target {
        namespace: namespace.to_string(),
        pod: pod_name.to_string(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        vm,
    })
}
