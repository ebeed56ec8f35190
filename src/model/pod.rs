//! The facts about a pod that every policy slot receives, decoded from the Pod object.

use k8s_openapi::api::core::v1::Pod;

use crate::policy::contract::resource_translation::ContainerResources;
use crate::policy::contract::types::{KeyValue, OwnerReference, PodFacts, PodPhase};

/// `status.phase` as the contract types it: exact API-server spellings, anything else `Unknown`.
pub fn phase(text: Option<&str>) -> PodPhase {
    match text {
        None | Some("") => PodPhase::Unset,
        Some("Pending") => PodPhase::Pending,
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        Some(_) => PodPhase::Unknown,
    }
}

/// `status.phase` back in the API server's spelling ("" when unset).
pub fn phase_name(phase: PodPhase) -> &'static str {
    match phase {
        PodPhase::Unset => "",
        PodPhase::Pending => "Pending",
        PodPhase::Running => "Running",
        PodPhase::Succeeded => "Succeeded",
        PodPhase::Failed => "Failed",
        PodPhase::Unknown => "Unknown",
    }
}

impl PodFacts {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

fn pairs<'a>(map: impl IntoIterator<Item = (&'a String, &'a String)>) -> Vec<KeyValue> {
    map.into_iter()
        .map(|(key, value)| KeyValue {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
}

/// Identity and raw metadata of a pod, as every slot receives them.
pub fn pod_facts(pod: &Pod) -> PodFacts {
    let meta = &pod.metadata;
    PodFacts {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        phase: phase(pod.status.as_ref().and_then(|s| s.phase.as_deref())),
        annotations: pairs(meta.annotations.iter().flatten()),
        labels: pairs(meta.labels.iter().flatten()),
        node_selector: pairs(
            pod.spec
                .as_ref()
                .and_then(|s| s.node_selector.as_ref())
                .into_iter()
                .flatten(),
        ),
        owner_references: meta
            .owner_references
            .iter()
            .flatten()
            .map(|o| OwnerReference {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
                name: o.name.clone(),
                uid: o.uid.clone(),
                controller: o.controller.unwrap_or(false),
            })
            .collect(),
    }
}

/// The first container's requests and limits as raw quantity strings; `None` without containers.
pub fn first_container_resources(pod: &Pod) -> Option<ContainerResources> {
    let container = pod.spec.as_ref()?.containers.first()?;
    let quantities =
        |m: Option<&std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            m.map(|m| {
                m.iter()
                    .map(|(k, v)| KeyValue {
                        key: k.clone(),
                        value: v.0.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
        };
    let resources = container.resources.as_ref();
    Some(ContainerResources {
        requests: quantities(resources.and_then(|r| r.requests.as_ref())),
        limits: quantities(resources.and_then(|r| r.limits.as_ref())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_exact_api_spellings() {
        assert_eq!(phase(None), PodPhase::Unset);
        assert_eq!(phase(Some("Running")), PodPhase::Running);
        assert_eq!(phase(Some("running")), PodPhase::Unknown);
        assert_eq!(phase(Some("Unknown")), PodPhase::Unknown);
        for p in [
            PodPhase::Pending,
            PodPhase::Running,
            PodPhase::Succeeded,
            PodPhase::Failed,
        ] {
            assert_eq!(phase(Some(phase_name(p))), p);
        }
    }
}
