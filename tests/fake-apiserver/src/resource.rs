//! The resource types this server serves.

/// One served resource type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceType {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Whether `/status` is a separate subresource (writes to the main resource then ignore `status`,
    /// writes to `/status` ignore everything but `status`).
    pub status_subresource: bool,
}

impl ResourceType {
    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Looks a served resource up by its URL coordinates.
    pub fn lookup(group: &str, version: &str, plural: &str) -> Option<ResourceType> {
        ALL.iter()
            .copied()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// The served resource for a kube `Resource` type, if any.
    pub fn of<K: kube::Resource<DynamicType = ()>>() -> Option<ResourceType> {
        Self::lookup(&K::group(&()), &K::version(&()), &K::plural(&()))
    }

    /// The field labels a field selector may name for this type (the apiserver's own table).
    pub fn field_labels(&self) -> &'static [&'static str] {
        match (self.group, self.plural) {
            ("", "pods") => &[
                "metadata.name",
                "metadata.namespace",
                "spec.nodeName",
                "spec.restartPolicy",
                "spec.schedulerName",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            ],
            ("", "nodes") => &["metadata.name", "spec.unschedulable"],
            ("", "namespaces") => &["metadata.name", "status.phase"],
            (_, "events") => &[
                "metadata.name",
                "metadata.namespace",
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ],
            _ => &["metadata.name", "metadata.namespace"],
        }
    }

    pub(crate) fn is_pod(&self) -> bool {
        *self == PODS
    }
}

pub const PODS: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "pods",
    kind: "Pod",
    namespaced: true,
    status_subresource: true,
};
pub const NODES: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "nodes",
    kind: "Node",
    namespaced: false,
    status_subresource: true,
};
pub const LEASES: ResourceType = ResourceType {
    group: "coordination.k8s.io",
    version: "v1",
    plural: "leases",
    kind: "Lease",
    namespaced: true,
    status_subresource: false,
};
pub const CORE_EVENTS: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "events",
    kind: "Event",
    namespaced: true,
    status_subresource: false,
};
/// `events.k8s.io/v1` — the API kube-runtime's `events::Recorder` (kube 5) writes to.
pub const EVENTS_V1: ResourceType = ResourceType {
    group: "events.k8s.io",
    version: "v1",
    plural: "events",
    kind: "Event",
    namespaced: true,
    status_subresource: false,
};
pub const NAMESPACES: ResourceType = ResourceType {
    group: "",
    version: "v1",
    plural: "namespaces",
    kind: "Namespace",
    namespaced: false,
    status_subresource: true,
};

/// Every served resource type.
pub const ALL: &[ResourceType] = &[PODS, NODES, LEASES, CORE_EVENTS, EVENTS_V1, NAMESPACES];
