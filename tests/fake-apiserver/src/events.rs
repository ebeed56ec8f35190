//! Events are stored once, as `events.k8s.io/v1`, the API kube-runtime's Recorder writes; the
//! core/v1 Event API (`kubectl get events`, `kubectl describe`) reads the same objects converted,
//! as the apiserver converts between the two versions of one stored Event.

use serde_json::{Map, Value, json};

/// The core/v1 form of an `events.k8s.io/v1` Event.
pub fn to_core(event: &Value) -> Value {
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!("v1"));
    out.insert("kind".into(), json!("Event"));
    let renames = [
        ("metadata", "metadata"),
        ("regarding", "involvedObject"),
        ("related", "related"),
        ("note", "message"),
        ("reason", "reason"),
        ("type", "type"),
        ("action", "action"),
        ("eventTime", "eventTime"),
        ("reportingController", "reportingComponent"),
        ("reportingInstance", "reportingInstance"),
        ("deprecatedSource", "source"),
        ("deprecatedFirstTimestamp", "firstTimestamp"),
        ("deprecatedLastTimestamp", "lastTimestamp"),
        ("deprecatedCount", "count"),
    ];
    for (from, to) in renames {
        if let Some(v) = event.get(from).filter(|v| !v.is_null()) {
            out.insert(to.into(), v.clone());
        }
    }
    if let Some(series) = event.get("series").filter(|v| v.is_object()) {
        let mut s = Map::new();
        for field in ["count", "lastObservedTime"] {
            if let Some(v) = series.get(field) {
                s.insert(field.into(), v.clone());
            }
        }
        out.insert("series".into(), Value::Object(s));
    }
    // core/v1 requires involvedObject; an Event without `regarding` still lists.
    out.entry("involvedObject").or_insert_with(|| json!({}));
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_renamed_as_the_apiserver_converts_them() {
        let v1 = json!({
            "apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e", "namespace": "ns"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "boom", "reason": "Failed",
            "type": "Warning", "reportingController": "vk-cocoon", "reportingInstance": "n1",
            "series": {"count": 3, "lastObservedTime": "2026-01-01T00:00:00.000000Z"},
        });
        let core = to_core(&v1);
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "boom");
        assert_eq!(core["reportingComponent"], "vk-cocoon");
        assert_eq!(core["series"]["count"], 3);
        assert!(core.get("note").is_none());
    }
}
