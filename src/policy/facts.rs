//! The facts the host gathers for each slot, as plain Rust types, and their conversion into the
//! WIT records a component receives.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::bindings::{types as wit, wit_admission, wit_bring_up, wit_guest_fixup, wit_snapshot, wit_translation};
use super::slot::Slot;
use crate::model::{PodFacts, VmSpec};

/// Facts for `snapshot-before-destroy`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct SnapshotFacts {
    pub pod: PodFacts,
    pub spec: VmSpec,
    pub pusher_configured: bool,
    pub vm_running: bool,
}

/// What the host found about a hibernated guest under the pod's VM name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "kind",
    rename_all = "kebab-case",
    rename_all_fields = "kebab-case",
    deny_unknown_fields
)]
pub enum HibernateEvidence {
    NotChecked,
    None,
    Found {
        source: EvidenceSource,
        #[serde(default)]
        recorded_image: String,
    },
    Unavailable {
        error: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EvidenceSource {
    /// The registry's `<vm>:hibernate` tag.
    Registry,
    /// A local snapshot named after the VM (registry-less nodes).
    LocalSnapshot,
}

impl EvidenceSource {
    fn as_str(self) -> &'static str {
        match self {
            EvidenceSource::Registry => "registry",
            EvidenceSource::LocalSnapshot => "local-snapshot",
        }
    }
}

/// A snapshot in the node's local cocoon store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default, deny_unknown_fields)]
pub struct LocalSnapshot {
    pub name: String,
    pub id: String,
    pub image: String,
    pub image_digest: String,
    pub hypervisor: String,
}

/// Runtime annotations an operator pre-wrote (unmanaged pods).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct PreassignedRuntime {
    pub vm_id: String,
    pub ip: String,
    pub vnc_port: String,
}

impl PreassignedRuntime {
    pub fn from_annotations(annotations: &BTreeMap<String, String>) -> Self {
        use crate::model::annotations as key;
        let get = |k: &str| annotations.get(k).cloned().unwrap_or_default();
        PreassignedRuntime {
            vm_id: get(key::VM_ID),
            ip: get(key::IP),
            vnc_port: get(key::VNC_PORT),
        }
    }
}

/// Facts for `bring-up`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct BringUpFacts {
    pub pod: PodFacts,
    pub spec: VmSpec,
    pub vm_exists_locally: bool,
    pub evidence: HibernateEvidence,
    pub registry_configured: bool,
    pub local_snapshots: Vec<LocalSnapshot>,
    pub node_restore_mode: String,
    pub preassigned: PreassignedRuntime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AdmissionContext {
    Create,
    Update,
    StartupReconcile,
}

/// Facts for `cpu-class-admission`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct AdmissionFacts {
    pub pod: PodFacts,
    pub context: AdmissionContext,
    pub node_name: String,
    pub node_class: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BootPath {
    Clone,
    Run,
}

/// The first container's resources as raw quantity strings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct ContainerResources {
    pub requests: BTreeMap<String, String>,
    pub limits: BTreeMap<String, String>,
}

/// Facts for `resource-translation`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct TranslationFacts {
    pub pod: PodFacts,
    pub spec: VmSpec,
    pub path: BootPath,
    pub resources: Option<ContainerResources>,
}

/// How a VM that may need a guest fixup came up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BootOrigin {
    Clone,
    Fork,
    CloneFromDir,
    Wake,
}

/// One of the VM's network interfaces, from cocoon's `network_configs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default, deny_unknown_fields)]
pub struct GuestNic {
    /// cocoon's lower-case form.
    pub mac: String,
    /// "" when the NIC uses DHCP.
    pub ip: String,
    pub gateway: String,
    pub prefix: u32,
}

/// Facts for `guest-fixup`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct GuestFixupFacts {
    pub pod: PodFacts,
    pub spec: VmSpec,
    pub vm_id: String,
    /// What cocoon reports for the VM: `cloud-hypervisor` | `firecracker` | "".
    pub hypervisor: String,
    pub nics: Vec<GuestNic>,
    pub origin: BootOrigin,
    /// The clone source snapshot's base image; "" for fork and wake.
    pub source_image: String,
    /// `<COCOON_ROOT_DIR>/run/cloudhypervisor/<vm-id>/overlay.qcow2` exists.
    pub cloudimg_overlay: bool,
}

/// The facts of one decision, whichever slot it is for.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum SlotFacts {
    SnapshotBeforeDestroy(SnapshotFacts),
    BringUp(BringUpFacts),
    CpuClassAdmission(AdmissionFacts),
    ResourceTranslation(TranslationFacts),
    GuestFixup(GuestFixupFacts),
}

impl SlotFacts {
    pub fn slot(&self) -> Slot {
        match self {
            SlotFacts::SnapshotBeforeDestroy(_) => Slot::SnapshotBeforeDestroy,
            SlotFacts::BringUp(_) => Slot::BringUp,
            SlotFacts::CpuClassAdmission(_) => Slot::CpuClassAdmission,
            SlotFacts::ResourceTranslation(_) => Slot::ResourceTranslation,
            SlotFacts::GuestFixup(_) => Slot::GuestFixup,
        }
    }
}

// ---- conversion into the WIT records -------------------------------------------------------

fn pairs(map: &BTreeMap<String, String>) -> Vec<wit::KeyValue> {
    map.iter()
        .map(|(key, value)| wit::KeyValue {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
}

pub(crate) fn wit_pod(pod: &PodFacts) -> wit::PodFacts {
    wit::PodFacts {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        phase: pod.phase.clone(),
        annotations: pairs(&pod.annotations),
        labels: pairs(&pod.labels),
        node_selector: pairs(&pod.node_selector),
        owner_references: pod
            .owner_references
            .iter()
            .map(|o| wit::OwnerReference {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
                name: o.name.clone(),
                uid: o.uid.clone(),
                controller: o.controller,
            })
            .collect(),
    }
}

pub(crate) fn wit_spec(spec: &VmSpec) -> wit::VmSpec {
    wit::VmSpec {
        vm_name: spec.vm_name.clone(),
        image: spec.image.clone(),
        mode: spec.mode.clone(),
        os: spec.os.clone(),
        storage: spec.storage.clone(),
        network: spec.network.clone(),
        snapshot_policy: spec.snapshot_policy.clone(),
        fork_from: spec.fork_from.clone(),
        clone_from_dir: spec.clone_from_dir.clone(),
        managed: spec.managed,
        force_pull: spec.force_pull,
        no_direct_io: spec.no_direct_io,
        conn_type: spec.conn_type.clone(),
        backend: spec.backend.clone(),
        probe_port: spec.probe_port.clone(),
        restore_from_hibernate: spec.restore_from_hibernate,
    }
}

impl SnapshotFacts {
    pub(crate) fn to_wit(&self) -> wit_snapshot::Facts {
        wit_snapshot::Facts {
            pod: wit_pod(&self.pod),
            spec: wit_spec(&self.spec),
            pusher_configured: self.pusher_configured,
            vm_running: self.vm_running,
        }
    }
}

impl BringUpFacts {
    pub(crate) fn to_wit(&self) -> wit_bring_up::Facts {
        use wit_bring_up::{FoundEvidence, HibernateEvidence as Wit};
        let evidence = match &self.evidence {
            HibernateEvidence::NotChecked => Wit::NotChecked,
            HibernateEvidence::None => Wit::None,
            HibernateEvidence::Found { source, recorded_image } => Wit::Found(FoundEvidence {
                source: source.as_str().into(),
                recorded_image: recorded_image.clone(),
            }),
            HibernateEvidence::Unavailable { error } => Wit::Unavailable(error.clone()),
        };
        wit_bring_up::Facts {
            pod: wit_pod(&self.pod),
            spec: wit_spec(&self.spec),
            vm_exists_locally: self.vm_exists_locally,
            evidence,
            registry_configured: self.registry_configured,
            local_snapshots: self
                .local_snapshots
                .iter()
                .map(|s| wit_bring_up::LocalSnapshot {
                    name: s.name.clone(),
                    id: s.id.clone(),
                    image: s.image.clone(),
                    image_digest: s.image_digest.clone(),
                    hypervisor: s.hypervisor.clone(),
                })
                .collect(),
            node_restore_mode: self.node_restore_mode.clone(),
            preassigned_vm_id: self.preassigned.vm_id.clone(),
            preassigned_ip: self.preassigned.ip.clone(),
            preassigned_vnc_port: self.preassigned.vnc_port.clone(),
        }
    }
}

impl AdmissionFacts {
    pub(crate) fn to_wit(&self) -> wit_admission::Facts {
        wit_admission::Facts {
            pod: wit_pod(&self.pod),
            context: match self.context {
                AdmissionContext::Create => wit_admission::AdmissionContext::Create,
                AdmissionContext::Update => wit_admission::AdmissionContext::Update,
                AdmissionContext::StartupReconcile => wit_admission::AdmissionContext::StartupReconcile,
            },
            node_name: self.node_name.clone(),
            node_class: self.node_class.clone(),
        }
    }
}

impl TranslationFacts {
    pub(crate) fn to_wit(&self) -> wit_translation::Facts {
        wit_translation::Facts {
            pod: wit_pod(&self.pod),
            spec: wit_spec(&self.spec),
            path: match self.path {
                BootPath::Clone => wit_translation::BootPath::Clone,
                BootPath::Run => wit_translation::BootPath::Run,
            },
            resources: self.resources.as_ref().map(|r| wit_translation::ContainerResources {
                requests: pairs(&r.requests),
                limits: pairs(&r.limits),
            }),
        }
    }
}

impl GuestFixupFacts {
    pub(crate) fn to_wit(&self) -> wit_guest_fixup::Facts {
        wit_guest_fixup::Facts {
            pod: wit_pod(&self.pod),
            spec: wit_spec(&self.spec),
            vm_id: self.vm_id.clone(),
            hypervisor: self.hypervisor.clone(),
            nics: self
                .nics
                .iter()
                .map(|n| wit_guest_fixup::Nic {
                    mac: n.mac.clone(),
                    ip: n.ip.clone(),
                    gateway: n.gateway.clone(),
                    prefix: n.prefix,
                })
                .collect(),
            origin: match self.origin {
                BootOrigin::Clone => wit_guest_fixup::BootOrigin::Clone,
                BootOrigin::Fork => wit_guest_fixup::BootOrigin::Fork,
                BootOrigin::CloneFromDir => wit_guest_fixup::BootOrigin::CloneFromDir,
                BootOrigin::Wake => wit_guest_fixup::BootOrigin::Wake,
            },
            source_image: self.source_image.clone(),
            cloudimg_overlay: self.cloudimg_overlay,
        }
    }
}
