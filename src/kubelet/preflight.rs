//! RBAC preflight: before anything else at startup (the pod list, the node registration), ask the
//! apiserver whether this identity may make every API call the daemon makes, and stop with one
//! message naming each missing `verb resource[/subresource]` instead of failing mid-operation —
//! a pod half-created because its annotation patch was forbidden, say.
//!
//! The table of [`required`] permissions is the daemon's side of `deploy/rbac.yaml` (a unit test
//! checks the file grants all of them). Each is asked with a `SelfSubjectAccessReview` carrying
//! the same namespace, name and field selector the real call uses, so authorizers that look at
//! them (the Node authorizer does) answer for the call the daemon will actually make.

use futures::future::join_all;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    FieldSelectorAttributes, ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

/// The file operators apply to grant the daemon its permissions.
pub const RBAC_FILE: &str = "deploy/rbac.yaml";

/// One API permission the daemon needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    pub verb: &'static str,
    /// API group (`""` = core).
    pub group: &'static str,
    pub resource: &'static str,
    pub subresource: Option<&'static str>,
    /// `None` = every namespace (or a cluster-scoped resource).
    pub namespace: Option<&'static str>,
    /// The one object the daemon touches, when there is one (its Node, its Lease).
    pub name: Option<String>,
    /// The field selector of the daemon's list / watch.
    pub field_selector: Option<String>,
    /// What the daemon does with it.
    pub used_for: &'static str,
}

impl Permission {
    /// `verb resource[/subresource]`, the group added when it is not core (as `kubectl auth can-i` spells it).
    pub fn display_name(&self) -> String {
        let mut resource = self.resource.to_string();
        if !self.group.is_empty() {
            resource = format!("{resource}.{}", self.group);
        }
        if let Some(sub) = self.subresource {
            resource = format!("{resource}/{sub}");
        }
        format!("{} {resource}", self.verb)
    }

    fn review(&self) -> SelfSubjectAccessReview {
        SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(self.verb.into()),
                    group: Some(self.group.into()),
                    resource: Some(self.resource.into()),
                    subresource: self.subresource.map(Into::into),
                    namespace: self.namespace.map(Into::into),
                    name: self.name.clone(),
                    field_selector: self.field_selector.as_ref().map(|raw| FieldSelectorAttributes {
                        raw_selector: Some(raw.clone()),
                        requirements: None,
                    }),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            },
            ..Default::default()
        }
    }
}

/// Every permission the daemon uses (`src/kubelet` and the provider's patches and Events).
pub fn required(node: &str) -> Vec<Permission> {
    let on_node = Some(format!("spec.nodeName={node}"));
    let perm = |verb, group, resource, subresource, namespace, name: Option<&str>, used_for| Permission {
        verb,
        group,
        resource,
        subresource,
        namespace,
        name: name.map(str::to_string),
        field_selector: None,
        used_for,
    };
    let mut list = vec![
        Permission {
            field_selector: on_node.clone(),
            ..perm(
                "list",
                "",
                "pods",
                None,
                None,
                None,
                "the startup reconcile and the pod watch",
            )
        },
        Permission {
            field_selector: on_node,
            ..perm("watch", "", "pods", None, None, None, "the pod watch")
        },
        perm("get", "", "pods", None, None, None, "reading one pod"),
        perm(
            "patch",
            "",
            "pods",
            None,
            None,
            None,
            "the runtime and lifecycle annotations",
        ),
        perm("delete", "", "pods", None, None, None, "finishing a deletion, evicting"),
        perm("patch", "", "pods", Some("status"), None, None, "pod status"),
        perm("get", "", "nodes", None, None, Some(node), "node registration"),
        perm("create", "", "nodes", None, None, None, "node registration"),
        perm(
            "update",
            "",
            "nodes",
            None,
            None,
            Some(node),
            "node registration (labels, taint)",
        ),
        perm("patch", "", "nodes", Some("status"), None, Some(node), "node status"),
    ];
    for (verb, name) in [("get", Some(node)), ("create", None), ("update", Some(node))] {
        list.push(perm(
            verb,
            "coordination.k8s.io",
            "leases",
            None,
            Some("kube-node-lease"),
            name,
            "the node heartbeat Lease",
        ));
    }
    for verb in ["create", "patch"] {
        list.push(perm(
            verb,
            "events.k8s.io",
            "events",
            None,
            None,
            None,
            "Events about pods",
        ));
    }
    // The kubelet API (src/kubelet_api): who a caller is, what it may do, and the serving
    // certificate signed by the cluster.
    list.push(perm(
        "create",
        "authentication.k8s.io",
        "tokenreviews",
        None,
        None,
        None,
        "kubelet API: authenticating bearer tokens",
    ));
    list.push(perm(
        "create",
        "authorization.k8s.io",
        "subjectaccessreviews",
        None,
        None,
        None,
        "kubelet API: authorizing requests",
    ));
    for verb in ["create", "get", "list", "watch"] {
        list.push(perm(
            verb,
            "certificates.k8s.io",
            "certificatesigningrequests",
            None,
            None,
            None,
            "kubelet API: the serving certificate (kubernetes.io/kubelet-serving)",
        ));
    }
    list
}

/// Why the preflight stopped the daemon.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error("{}", missing_message(user.as_deref(), missing))]
    Missing {
        /// The identity, as the apiserver knows it (when it said).
        user: Option<String>,
        missing: Vec<Permission>,
    },
    #[error(
        "RBAC preflight: cannot ask the apiserver what this identity may do ({what}): {source}; check KUBECONFIG and that the apiserver is reachable"
    )]
    Unreachable {
        what: String,
        #[source]
        source: kube::Error,
    },
}

/// The one message for the operator: who, what is missing (each `verb resource[/subresource]`
/// and what it is for), and how to fix it.
pub fn missing_message(user: Option<&str>, missing: &[Permission]) -> String {
    let who = user.map_or_else(|| "this identity".to_string(), |u| format!("the identity {u}"));
    let items: Vec<String> = missing
        .iter()
        .map(|p| format!("{} ({})", p.display_name(), p.used_for))
        .collect();
    let mut message = format!(
        "RBAC preflight: {who} may not: {}; vk-cocoon needs every permission in {RBAC_FILE}: apply it and bind its ClusterRole vk-cocoon to this identity",
        items.join(", ")
    );
    if user.is_some_and(|u| u.starts_with("system:node:")) {
        message.push_str(
            " (a node identity, system:node:NAME, cannot patch pod metadata: run the daemon as the ServiceAccount or a user bound by that file)",
        );
    }
    message
}

/// Asks about every [`required`] permission; `Err(Missing)` names each one denied.
pub async fn check(client: &Client, node: &str) -> Result<(), PreflightError> {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let wanted = required(node);
    let answers = join_all(wanted.iter().map(|p| {
        let reviews = reviews.clone();
        async move { reviews.create(&PostParams::default(), &p.review()).await }
    }))
    .await;
    let mut missing = Vec::new();
    for (permission, answer) in wanted.into_iter().zip(answers) {
        let review = answer.map_err(|source| PreflightError::Unreachable {
            what: format!("SelfSubjectAccessReview for {}", permission.display_name()),
            source,
        })?;
        if !review.status.is_some_and(|s| s.allowed) {
            missing.push(permission);
        }
    }
    if missing.is_empty() {
        tracing::info!(node, "RBAC preflight: every permission the daemon needs is granted");
        return Ok(());
    }
    Err(PreflightError::Missing {
        user: whoami(client).await,
        missing,
    })
}

/// The identity's user name (SelfSubjectReview, allowed to every authenticated user), for the
/// message; `None` when the apiserver does not say.
async fn whoami(client: &Client) -> Option<String> {
    let reviews: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .ok()?;
    review.status?.user_info?.username
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    /// (group, resource[/sub]) → verbs granted by the ClusterRole in deploy/rbac.yaml.
    fn granted() -> BTreeMap<(String, String), BTreeSet<String>> {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rbac.yaml")).unwrap();
        let mut out: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = serde_json::Value::deserialize(doc).unwrap();
            if value["kind"] != "ClusterRole" {
                continue;
            }
            for rule in value["rules"].as_array().unwrap() {
                for group in rule["apiGroups"].as_array().unwrap() {
                    for resource in rule["resources"].as_array().unwrap() {
                        let verbs = rule["verbs"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|v| v.as_str().unwrap().to_string());
                        out.entry((group.as_str().unwrap().into(), resource.as_str().unwrap().into()))
                            .or_default()
                            .extend(verbs);
                    }
                }
            }
        }
        out
    }
    use serde::Deserialize;

    #[test]
    fn deploy_rbac_grants_every_permission_the_preflight_asks_for_and_no_more() {
        let granted = granted();
        let mut asked: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
        for p in required("n1") {
            let resource = match p.subresource {
                Some(sub) => format!("{}/{sub}", p.resource),
                None => p.resource.to_string(),
            };
            asked
                .entry((p.group.to_string(), resource))
                .or_default()
                .insert(p.verb.to_string());
        }
        assert_eq!(asked, granted, "deploy/rbac.yaml and the preflight table disagree");
    }

    #[test]
    fn the_message_names_each_missing_permission_and_the_rbac_file() {
        let missing: Vec<Permission> = required("n1")
            .into_iter()
            .filter(|p| {
                (p.verb == "patch" && p.resource == "pods")
                    || (p.resource == "events" && p.verb == "create")
                    || p.resource == "nodes" && p.subresource.is_some()
            })
            .collect();
        let m = missing_message(Some("system:node:n1"), &missing);
        assert!(m.contains("the identity system:node:n1 may not: "), "{m}");
        assert!(m.contains("patch pods (the runtime and lifecycle annotations)"), "{m}");
        assert!(m.contains("patch pods/status (pod status)"), "{m}");
        assert!(m.contains("patch nodes/status"), "{m}");
        assert!(m.contains("create events.events.k8s.io"), "{m}");
        assert!(m.contains("deploy/rbac.yaml"), "{m}");
        assert!(m.contains("a node identity"), "{m}");
        let plain = missing_message(None, &missing[..1]);
        assert!(
            plain.starts_with("RBAC preflight: this identity may not: patch pods "),
            "{plain}"
        );
        assert!(!plain.contains("node identity"), "{plain}");
    }

    #[test]
    fn reviews_carry_the_scope_of_the_real_call() {
        let all = required("n1");
        let list = all.iter().find(|p| p.verb == "list").unwrap().review();
        let attrs = list.spec.resource_attributes.unwrap();
        assert_eq!(
            attrs.field_selector.and_then(|f| f.raw_selector).as_deref(),
            Some("spec.nodeName=n1")
        );
        assert_eq!(attrs.namespace, None, "pods of every namespace");
        let lease = all
            .iter()
            .find(|p| p.resource == "leases" && p.verb == "update")
            .unwrap()
            .review();
        let attrs = lease.spec.resource_attributes.unwrap();
        assert_eq!(
            (
                attrs.namespace.as_deref(),
                attrs.name.as_deref(),
                attrs.group.as_deref()
            ),
            (Some("kube-node-lease"), Some("n1"), Some("coordination.k8s.io"))
        );
    }
}
