//! The facts about a pod that every policy slot receives.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;

/// Identity and raw metadata of a pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub phase: String,
    pub annotations: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub node_selector: BTreeMap<String, String>,
    pub owner_references: Vec<OwnerRef>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct OwnerRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: String,
    pub controller: bool,
}

impl PodFacts {
    pub fn from_pod(pod: &Pod) -> Self {
        let meta = &pod.metadata;
        PodFacts {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            phase: pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default(),
            annotations: meta.annotations.clone().unwrap_or_default(),
            labels: meta.labels.clone().unwrap_or_default(),
            node_selector: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_selector.clone())
                .unwrap_or_default(),
            owner_references: meta
                .owner_references
                .iter()
                .flatten()
                .map(|o| OwnerRef {
                    api_version: o.api_version.clone(),
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                    controller: o.controller.unwrap_or(false),
                })
                .collect(),
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The first container's requests and limits as raw quantity strings; `None` without containers.
pub type Resources = (BTreeMap<String, String>, BTreeMap<String, String>);

pub fn first_container_resources(pod: &Pod) -> Option<Resources> {
    let container = pod.spec.as_ref()?.containers.first()?;
    let quantities = |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
        m.map(|m| m.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
            .unwrap_or_default()
    };
    let resources = container.resources.as_ref();
    Some((
        quantities(resources.and_then(|r| r.requests.as_ref())),
        quantities(resources.and_then(|r| r.limits.as_ref())),
    ))
}
