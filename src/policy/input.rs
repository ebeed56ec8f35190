//! One decision's input as policy authors write it (in `policy eval` files and case tables): a
//! Pod manifest plus the facts the daemon's host side would gather, turned into [`SlotFacts`]
//! exactly as the daemon decodes a live pod.

use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::facts::{
    AdmissionContext, AdmissionFacts, BootPath, BringUpFacts, ContainerResources, HibernateEvidence, LocalSnapshot,
    PreassignedRuntime, SlotFacts, SnapshotFacts, TranslationFacts,
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

fn parse<T: DeserializeOwned>(what: &str, value: &Value) -> Result<T, String> {
    let value = if value.is_null() { Value::Object(Default::default()) } else { value.clone() };
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
        let SlotFacts::ResourceTranslation(f) = facts else { panic!() };
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
    fn evidence_is_written_as_a_tagged_map() {
        let facts = facts_for(
            Slot::BringUp,
            &input("host: {evidence: {kind: found, source: registry, recorded-image: 'a:b'}}"),
        )
        .unwrap();
        let SlotFacts::BringUp(f) = facts else { panic!() };
        assert_eq!(
            f.evidence,
            HibernateEvidence::Found { source: super::super::facts::EvidenceSource::Registry, recorded_image: "a:b".into() }
        );
    }
}
