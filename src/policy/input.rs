//! One decision's input as policy authors write it (in `policy eval` files and case tables): a
//! Pod manifest plus the facts the daemon's host side would gather, turned into [`SlotFacts`]
//! exactly as the daemon decodes a live pod.

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::facts::{
    AdmissionContext, AdmissionFacts, BootOrigin, BootPath, BringUpFacts, ContainerResources, GuestFixupFacts,
    GuestNic, HibernateEvidence, LocalSnapshot, PreassignedRuntime, SlotFacts, SnapshotFacts, TranslationFacts,
};
use super::slot::Slot;
use crate::model::{PodFacts, VmSpec, first_container_resources};

/// A decision input file: `pod` is a Pod manifest, `host` the slot's host facts.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionInput {
    #[serde(default)]
    pub pod: Value,
    #[serde(default)]
    pub host: Value,
}

/// Host facts of `snapshot-before-destroy`; defaults: a registry and a running VM.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct SnapshotHost {
    #[serde(default = "yes")]
    pusher_configured: bool,
    #[serde(default = "yes")]
    vm_running: bool,
}

/// Host facts of `bring-up`; defaults: no local VM, no hibernate evidence, a registry, no local
/// snapshots, restore mode `mmap`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct BringUpHost {
    #[serde(default)]
    vm_exists_locally: bool,
    #[serde(default = "no_evidence")]
    evidence: HibernateEvidence,
    #[serde(default = "yes")]
    registry_configured: bool,
    #[serde(default)]
    local_snapshots: Vec<LocalSnapshot>,
    #[serde(default = "mmap")]
    node_restore_mode: String,
}

/// Host facts of `cpu-class-admission`; defaults: CreatePod on node `node`, unclassified.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct AdmissionHost {
    #[serde(default = "create")]
    context: AdmissionContext,
    #[serde(default = "node")]
    node_name: String,
    #[serde(default)]
    node_class: String,
}

/// Host facts of `resource-translation`; default: the clone path.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct TranslationHost {
    #[serde(default = "clone_path")]
    path: BootPath,
}

/// Host facts of `guest-fixup`; defaults: a clone with no NICs and no cloud-image overlay, the
/// VM id from the pod's `vm.cocoonstack.io/id` annotation (the host writes it before any guest
/// work), and the hypervisor from the pod's backend (cocoon's default, `cloud-hypervisor`, when
/// unspecified).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct GuestFixupHost {
    #[serde(default)]
    vm_id: Option<String>,
    #[serde(default)]
    hypervisor: Option<String>,
    #[serde(default)]
    nics: Vec<GuestNic>,
    #[serde(default = "clone_origin")]
    origin: BootOrigin,
    #[serde(default)]
    source_image: String,
    #[serde(default)]
    cloudimg_overlay: bool,
}

fn yes() -> bool {
    true
}
fn no_evidence() -> HibernateEvidence {
    HibernateEvidence::None
}
fn mmap() -> String {
    "mmap".into()
}
fn create() -> AdmissionContext {
    AdmissionContext::Create
}
fn node() -> String {
    "node".into()
}
fn clone_path() -> BootPath {
    BootPath::Clone
}
fn clone_origin() -> BootOrigin {
    BootOrigin::Clone
}

fn parse<T: DeserializeOwned>(what: &str, value: &Value) -> Result<T, String> {
    let value = if value.is_null() {
        Value::Object(Default::default())
    } else {
        value.clone()
    };
    serde_json::from_value(value).map_err(|e| format!("{what}: {e}"))
}

/// Builds the facts of `slot` from a pod manifest and host facts.
pub fn facts_for(slot: Slot, input: &DecisionInput) -> Result<SlotFacts, String> {
    let pod: Pod = parse("pod", &input.pod)?;
    let pod_facts = PodFacts::from_pod(&pod);
    let spec = VmSpec::decode(&pod_facts.annotations);
    let host = &input.host;
    let what = format!("host facts for slot {slot}");
    Ok(match slot {
        Slot::SnapshotBeforeDestroy => {
            let h: SnapshotHost = parse(&what, host)?;
            SlotFacts::SnapshotBeforeDestroy(SnapshotFacts {
                pod: pod_facts,
                spec,
                pusher_configured: h.pusher_configured,
                vm_running: h.vm_running,
            })
        }
        Slot::BringUp => {
            let h: BringUpHost = parse(&what, host)?;
            SlotFacts::BringUp(BringUpFacts {
                preassigned: PreassignedRuntime::from_annotations(&pod_facts.annotations),
                pod: pod_facts,
                spec,
                vm_exists_locally: h.vm_exists_locally,
                evidence: h.evidence,
                registry_configured: h.registry_configured,
                local_snapshots: h.local_snapshots,
                node_restore_mode: h.node_restore_mode,
            })
        }
        Slot::CpuClassAdmission => {
            let h: AdmissionHost = parse(&what, host)?;
            SlotFacts::CpuClassAdmission(AdmissionFacts {
                pod: pod_facts,
                context: h.context,
                node_name: h.node_name,
                node_class: h.node_class,
            })
        }
        Slot::ResourceTranslation => {
            let h: TranslationHost = parse(&what, host)?;
            SlotFacts::ResourceTranslation(TranslationFacts {
                resources: first_container_resources(&pod)
                    .map(|(requests, limits)| ContainerResources { requests, limits }),
                pod: pod_facts,
                spec,
                path: h.path,
            })
        }
        Slot::GuestFixup => {
            let h: GuestFixupHost = parse(&what, host)?;
            let vm_id = h
                .vm_id
                .unwrap_or_else(|| PreassignedRuntime::from_annotations(&pod_facts.annotations).vm_id);
            let hypervisor = h.hypervisor.unwrap_or_else(|| match spec.backend.as_str() {
                "" => "cloud-hypervisor".into(),
                backend => backend.into(),
            });
            SlotFacts::GuestFixup(GuestFixupFacts {
                pod: pod_facts,
                spec,
                vm_id,
                hypervisor,
                nics: h.nics,
                origin: h.origin,
                source_image: h.source_image,
                cloudimg_overlay: h.cloudimg_overlay,
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(yaml: &str) -> DecisionInput {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn a_pod_manifest_decodes_like_a_live_pod() {
        let facts = facts_for(
            Slot::ResourceTranslation,
            &input(
                r#"
pod:
  apiVersion: v1
  kind: Pod
  metadata:
    namespace: ns
    name: p
    annotations: {vm.cocoonstack.io/name: vm1, cocoonset.cocoonstack.io/storage: 10Gi}
  spec:
    containers:
    - name: agent
      resources: {requests: {cpu: 500m}, limits: {cpu: "2", memory: 4Gi}}
host: {path: run}
"#,
            ),
        )
        .unwrap();
        let SlotFacts::ResourceTranslation(f) = facts else {
            panic!()
        };
        assert_eq!(f.spec.vm_name, "vm1");
        assert_eq!(f.spec.storage, "10Gi");
        assert_eq!(f.path, BootPath::Run);
        let res = f.resources.unwrap();
        assert_eq!(res.requests["cpu"], "500m");
        assert_eq!(res.limits["memory"], "4Gi");
    }

    #[test]
    fn unknown_host_facts_are_rejected_by_name() {
        let err = facts_for(Slot::CpuClassAdmission, &input("host: {node-clas: x}")).unwrap_err();
        assert!(err.contains("node-clas"), "{err}");
    }

    #[test]
    fn guest_fixup_host_facts_default_from_the_pod_and_parse_nics() {
        let facts = facts_for(
            Slot::GuestFixup,
            &input(
                r#"
pod: {metadata: {annotations: {vm.cocoonstack.io/name: vm1, vm.cocoonstack.io/id: id-7, vm.cocoonstack.io/backend: firecracker}}}
host:
  origin: clone-from-dir
  nics: [{mac: "02:fc:00:00:00:01", ip: 10.0.0.2, gateway: 10.0.0.1, prefix: 24}, {mac: "02:fc:00:00:00:02"}]
"#,
            ),
        )
        .unwrap();
        let SlotFacts::GuestFixup(f) = facts else { panic!() };
        assert_eq!((f.vm_id.as_str(), f.hypervisor.as_str()), ("id-7", "firecracker"));
        assert_eq!(f.origin, BootOrigin::CloneFromDir);
        assert_eq!(
            f.nics[0],
            GuestNic {
                mac: "02:fc:00:00:00:01".into(),
                ip: "10.0.0.2".into(),
                gateway: "10.0.0.1".into(),
                prefix: 24
            }
        );
        assert_eq!(
            f.nics[1],
            GuestNic {
                mac: "02:fc:00:00:00:02".into(),
                ..GuestNic::default()
            },
            "a NIC without ip is DHCP"
        );
        assert_eq!((f.source_image.as_str(), f.cloudimg_overlay), ("", false));

        let SlotFacts::GuestFixup(f) = facts_for(Slot::GuestFixup, &input("host: {vm-id: given}")).unwrap() else {
            panic!()
        };
        assert_eq!(
            (f.vm_id.as_str(), f.hypervisor.as_str(), f.origin),
            ("given", "cloud-hypervisor", BootOrigin::Clone)
        );
        assert!(f.nics.is_empty());
    }

    #[test]
    fn a_misspelt_nic_field_is_rejected_by_name() {
        let err = facts_for(
            Slot::GuestFixup,
            &input("host: {nics: [{mac: 'aa:bb', adress: 10.0.0.2}]}"),
        )
        .unwrap_err();
        assert!(err.contains("adress"), "{err}");
    }

    #[test]
    fn evidence_is_written_as_a_tagged_map() {
        let facts = facts_for(
            Slot::BringUp,
            &input("host: {evidence: {kind: found, source: registry, recorded-image: 'a:b'}}"),
        )
        .unwrap();
        let SlotFacts::BringUp(f) = facts else { panic!() };
        assert_eq!(
            f.evidence,
            HibernateEvidence::Found {
                source: super::super::facts::EvidenceSource::Registry,
                recorded_image: "a:b".into()
            }
        );
    }
}
