//! One decision's input as policy authors write it (in `policy eval` files and case tables): a
//! Pod manifest plus the facts the daemon's host side would gather, turned into a slot's facts
//! exactly as the daemon decodes a live pod.
//!
//! The JSON of facts and decisions is the contract's own shape: fields are named as in the WIT
//! (kebab-case), enum and variant cases as the Rust bindings name them (PascalCase: `Admit`,
//! `RetryLater`, `CloudHypervisor`), and a variant with a payload is a one-key map
//! (`{Found: {source: Registry, recorded-image: ""}}`). serde derives it from the bindings;
//! [`to_contract_json`] only renames the keys (WIT identifiers never hold `_`, so the renaming
//! is exact both ways).

use k8s_openapi::api::core::v1::Pod;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::slots::{PodInput, PolicySlot};
use crate::model::{pod_facts, vm_spec};

/// A decision input file: `pod` is a Pod manifest, `host` the slot's host facts.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionInput {
    #[serde(default)]
    pub pod: Value,
    #[serde(default)]
    pub host: Value,
}

/// Renames every object key with `from` → `to` (`_` ↔ `-`), recursively. Only a map holding
/// such a key is rebuilt, and only such keys are copied: the decision log renames every logged
/// decision's facts on its writer thread, which shares the cores with the decisions.
fn rename_keys(value: Value, from: char, to: char) -> Value {
    let mut value = value;
    rename_keys_in_place(&mut value, from, to);
    value
}

fn rename_keys_in_place(value: &mut Value, from: char, to: char) {
    match value {
        Value::Object(map) => {
            if map.keys().any(|k| k.contains(from)) {
                let mut buf = [0u8; 4];
                let to: &str = to.encode_utf8(&mut buf);
                *map = std::mem::take(map)
                    .into_iter()
                    .map(|(k, v)| {
                        if k.contains(from) {
                            (k.replace(from, to), v)
                        } else {
                            (k, v)
                        }
                    })
                    .collect::<Map<_, _>>();
            }
            map.values_mut().for_each(|v| rename_keys_in_place(v, from, to));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| rename_keys_in_place(v, from, to)),
        _ => {}
    }
}

/// A contract value as JSON with the WIT's field names.
pub fn to_contract_json(value: &impl Serialize) -> Value {
    rename_keys(
        serde_json::to_value(value).expect("contract types serialize to JSON"),
        '_',
        '-',
    )
}

/// A contract value from JSON with the WIT's field names.
pub fn from_contract_json<T: DeserializeOwned>(value: Value) -> Result<T, serde_json::Error> {
    serde_json::from_value(rename_keys(value, '-', '_'))
}

/// A PascalCase key names a variant case (field names are kebab-case).
fn is_case(key: &str) -> bool {
    key.starts_with(|c: char| c.is_ascii_uppercase())
}

/// The first key of `given` (a path like `nics[1].adress`) that `decoded` lacks: a key serde
/// ignored, which must not pass silently (a misspelt host fact).
fn unknown_key(given: &Value, decoded: &Value, path: &str) -> Option<String> {
    match (given, decoded) {
        (Value::Object(given), Value::Object(decoded)) => given.iter().find_map(|(key, value)| {
            let here = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            match decoded.get(key) {
                Some(inner) => unknown_key(value, inner, &here),
                None => Some(here),
            }
        }),
        (Value::Array(given), Value::Array(decoded)) => given
            .iter()
            .zip(decoded)
            .enumerate()
            .find_map(|(i, (g, d))| unknown_key(g, d, &format!("{path}[{i}]"))),
        _ => None,
    }
}

/// JSON merge patch (RFC 7386) over contract JSON, except that a variant case replaces another
/// case instead of merging beside it (`{Unavailable: …}` over `{Found: …}` is `{Unavailable: …}`).
pub fn merge_contract(base: &mut Value, overlay: &Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) if !switches_case(b, o) => {
            for (key, value) in o {
                if value.is_null() {
                    b.remove(key);
                } else {
                    merge_contract(b.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (base, overlay) => *base = overlay.clone(),
    }
}

fn switches_case(base: &Map<String, Value>, overlay: &Map<String, Value>) -> bool {
    !base.is_empty() && base.keys().all(|k| is_case(k)) && overlay.keys().any(|k| is_case(k) && !base.contains_key(k))
}

/// A serde error path (`nics[0].recorded_image`) in the WIT's spelling.
fn rename_keys_in_path(path: &str) -> String {
    path.replace('_', "-")
}

/// Builds the facts of slot `S` from a pod manifest and host facts: the pod decoded as the
/// daemon decodes it, the slot's defaults (see each slot's `default_facts`), then `host:`
/// merged over them (any fact can be set, a misspelt one is an error naming it).
pub fn facts_for<S: PolicySlot>(input: &DecisionInput) -> Result<S::Facts, String> {
    let manifest = if input.pod.is_null() {
        Value::Object(Map::new())
    } else {
        input.pod.clone()
    };
    let pod: Pod = serde_json::from_value(manifest).map_err(|e| format!("pod: {e}"))?;
    let defaults = S::default_facts(PodInput {
        pod: &pod,
        facts: pod_facts(&pod),
        spec: vm_spec::of_pod(&pod),
    });
    if input.host.is_null() {
        return Ok(defaults);
    }
    let mut merged = to_contract_json(&defaults);
    merge_contract(&mut merged, &input.host);
    S::fill_added_fields(&mut merged);
    let facts: S::Facts = serde_path_to_error::deserialize(rename_keys(merged.clone(), '-', '_')).map_err(|e| {
        let at = rename_keys_in_path(&e.path().to_string());
        format!("host facts for slot {}: {} (at {at})", S::SLOT, e.inner())
    })?;
    if let Some(key) = unknown_key(&merged, &to_contract_json(&facts), "") {
        return Err(format!("host facts for slot {}: no fact named {key}", S::SLOT));
    }
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::contract::bring_up::{EvidenceSource, FoundEvidence, HibernateEvidence};
    use crate::policy::contract::guest_fixup::{BootOrigin, Nic};
    use crate::policy::contract::resource_translation::BootPath;
    use crate::policy::contract::types::Backend;
    use crate::policy::slots::{BringUp, CpuClassAdmission, GuestFixup, ResourceTranslation};

    fn input(yaml: &str) -> DecisionInput {
        serde_yaml_ng::from_str(yaml).unwrap()
    }

    #[test]
    fn a_pod_manifest_decodes_like_a_live_pod() {
        let f = facts_for::<ResourceTranslation>(&input(
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
host: {path: Run}
"#,
        ))
        .unwrap();
        assert_eq!(f.spec.vm_name, "vm1");
        assert_eq!(f.spec.storage, "10Gi");
        assert_eq!(f.path, BootPath::Run);
        let res = f.resources.unwrap();
        assert_eq!(
            (res.requests[0].key.as_str(), res.requests[0].value.as_str()),
            ("cpu", "500m")
        );
        assert!(res.limits.iter().any(|kv| kv.key == "memory" && kv.value == "4Gi"));
    }

    #[test]
    fn unknown_host_facts_are_rejected_by_name() {
        let err = facts_for::<CpuClassAdmission>(&input("host: {node-clas: x}")).unwrap_err();
        assert!(err.contains("node-clas"), "{err}");
        let err = facts_for::<GuestFixup>(&input(
            "host: {nics: [{mac: 'aa:bb', ip: '', gateway: '', prefix: 0, adress: 10.0.0.2}]}",
        ))
        .unwrap_err();
        assert!(err.contains("nics[0].adress"), "{err}");
        let err =
            facts_for::<GuestFixup>(&input("host: {nics: [{mac: 'aa:bb', gateway: '', prefix: 0}]}")).unwrap_err();
        assert!(err.contains("missing field `ip`") && err.contains("nics[0]"), "{err}");
    }

    #[test]
    fn guest_fixup_host_facts_default_from_the_pod_and_parse_nics() {
        let f = facts_for::<GuestFixup>(&input(
            r#"
pod: {metadata: {annotations: {vm.cocoonstack.io/name: vm1, vm.cocoonstack.io/id: id-7, vm.cocoonstack.io/backend: firecracker}}}
host:
  origin: CloneFromDir
  nics: [{mac: "02:fc:00:00:00:01", ip: 10.0.0.2, gateway: 10.0.0.1, prefix: 24}, {mac: "02:fc:00:00:00:02", ip: "", gateway: "", prefix: 0}]
"#,
        ))
        .unwrap();
        assert_eq!((f.vm_id.as_str(), &f.hypervisor), ("id-7", &Backend::Firecracker));
        assert_eq!(f.origin, BootOrigin::CloneFromDir);
        assert_eq!(
            f.nics[0],
            Nic {
                mac: "02:fc:00:00:00:01".into(),
                ip: "10.0.0.2".into(),
                gateway: "10.0.0.1".into(),
                prefix: 24
            }
        );
        let f = facts_for::<GuestFixup>(&input("host: {vm-id: given}")).unwrap();
        assert_eq!(
            (f.vm_id.as_str(), &f.hypervisor, f.origin),
            ("given", &Backend::CloudHypervisor, BootOrigin::Clone)
        );
    }

    #[test]
    fn variants_are_one_key_maps_and_may_replace_the_default_case() {
        let f = facts_for::<BringUp>(&input(
            "host: {evidence: {Found: {source: Registry, recorded-image: 'a:b'}}}",
        ))
        .unwrap();
        assert_eq!(
            f.evidence,
            HibernateEvidence::Found(FoundEvidence {
                source: EvidenceSource::Registry,
                recorded_image: "a:b".into(),
                recorded_owner: String::new(),
            }),
            "a field added since the case was written (recorded-owner, 0.3.0) defaults to empty"
        );
        let mut value = serde_json::json!({"evidence": {"Found": {"source": "Registry"}}});
        merge_contract(&mut value, &serde_json::json!({"evidence": {"Unavailable": "503"}}));
        assert_eq!(value, serde_json::json!({"evidence": {"Unavailable": "503"}}));
        let f = facts_for::<BringUp>(&input("host: {evidence: NotChecked}")).unwrap();
        assert_eq!(f.evidence, HibernateEvidence::NotChecked);
        let json = to_contract_json(&f);
        assert_eq!(json["node-restore-mode"], "Mmap");
        assert_eq!(json["spec"]["snapshot-policy"], "Always");
    }
}
