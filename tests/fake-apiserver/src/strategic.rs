//! Strategic merge patch (`application/strategic-merge-patch+json`) for the served types, as the
//! apiserver applies it:
//!
//! * maps merge recursively; `null` removes a key; `{"$patch": "replace"}` replaces the map;
//! * a list with a patch-merge key (`conditions` by `type`, `containers` by `name`, …; the table
//!   below, from the API's `x-kubernetes-patch-merge-key`) merges element by element: a patch
//!   element replaces-by-merge the original with the same key, `{"<key>": …, "$patch": "delete"}`
//!   removes it, a `{"$patch": "replace"}` element makes the rest of the patch list the whole list;
//! * `finalizers` (a list of strings with the merge strategy) is a union;
//!   `$deleteFromPrimitiveList/<field>` removes strings from it;
//! * the merged list is in the patch's order, then the original elements the patch did not name
//!   (as the apiserver orders it when no `$setElementOrder` is given);
//! * any other list is replaced whole; `$setElementOrder/…` and `$retainKeys` are ignored.
//!
//! The merge key is chosen by field name, not by schema path: exact for pods, nodes, leases,
//! events and namespaces, the only types served.

use serde_json::{Map, Value};

/// The patch-merge key of a list field, if it has one.
fn merge_key(field: &str) -> Option<&'static str> {
    Some(match field {
        "conditions" | "addresses" => "type",
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "containerStatuses"
        | "initContainerStatuses"
        | "ephemeralContainerStatuses"
        | "env"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "ports" => "containerPort",
        "taints" => "key",
        "ownerReferences" => "uid",
        "podIPs" | "hostIPs" => "ip",
        _ => return None,
    })
}

/// List fields of strings merged as sets.
fn merges_as_set(field: &str) -> bool {
    field == "finalizers"
}

const DELETE_FROM_PRIMITIVE_LIST: &str = "$deleteFromPrimitiveList/";

/// Applies `patch` to `doc` in place.
pub fn merge(doc: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *doc = patch.clone();
        return;
    };
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        *doc = Value::Object(without_directives(patch));
        return;
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let target = doc.as_object_mut().expect("made an object above");
    for (key, value) in patch {
        if let Some(field) = key.strip_prefix(DELETE_FROM_PRIMITIVE_LIST) {
            if let (Some(Value::Array(list)), Some(gone)) = (target.get_mut(field), value.as_array()) {
                list.retain(|v| !gone.contains(v));
            }
            continue;
        }
        if key.starts_with('$') {
            continue;
        }
        match value {
            Value::Null => {
                target.remove(key);
            }
            Value::Array(items) => {
                let merged = match (target.get(key), merge_key(key)) {
                    (Some(Value::Array(original)), Some(k)) => merge_keyed(original, items, k),
                    (Some(Value::Array(original)), None) if merges_as_set(key) => merge_set(original, items),
                    _ => items.iter().map(strip).collect(),
                };
                target.insert(key.clone(), Value::Array(merged));
            }
            Value::Object(_) => merge(target.entry(key.clone()).or_insert(Value::Null), value),
            other => {
                target.insert(key.clone(), other.clone());
            }
        }
    }
}

fn merge_keyed(original: &[Value], patch: &[Value], key: &str) -> Vec<Value> {
    if patch
        .iter()
        .any(|p| p.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return patch.iter().filter(|p| p.get("$patch").is_none()).map(strip).collect();
    }
    let id = |v: &Value| v.get(key).cloned();
    let mut out = Vec::new();
    let mut named = Vec::new();
    for p in patch {
        let pid = id(p);
        named.push(pid.clone());
        if p.get("$patch").and_then(Value::as_str) == Some("delete") {
            continue;
        }
        let mut element = original
            .iter()
            .find(|o| pid.is_some() && id(o) == pid)
            .cloned()
            .unwrap_or(Value::Null);
        merge(&mut element, p);
        out.push(element);
    }
    out.extend(original.iter().filter(|o| !named.contains(&id(o))).cloned());
    out
}

fn merge_set(original: &[Value], patch: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for v in patch.iter().chain(original) {
        if !out.contains(v) {
            out.push(v.clone());
        }
    }
    out
}

fn strip(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(without_directives(m)),
        other => other.clone(),
    }
}

fn without_directives(m: &Map<String, Value>) -> Map<String, Value> {
    m.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .map(|(k, v)| (k.clone(), strip(v)))
        .collect()
}
