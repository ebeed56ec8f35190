//! Field and label selectors, the subset the apiserver supports for the served resources.
//!
//! Field selectors: `a=b`, `a==b`, `a!=b`, comma-joined (conjunction), on the field labels the
//! real apiserver supports for each served type ([`ResourceType::field_labels`]) — any other
//! field is a 400 `field label not supported: <field>`, as there. Events are selected on their
//! core/v1 form (`involvedObject.name`…) whichever API lists them, as the apiserver's internal
//! Event type is.
//! Label selectors: equality (`k=v`, `k==v`, `k!=v`), existence (`k`, `!k`) and set
//! (`k in (a,b)`, `k notin (a,b)`).

use crate::error::ApiError;
use crate::resource::ResourceType;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed field selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<Req>);

/// A parsed label selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Req>);

fn split_eq(term: &str) -> Option<(String, String, bool)> {
    if let Some((k, v)) = term.split_once("!=") {
        return Some((k.trim().into(), v.trim().into(), false));
    }
    if let Some((k, v)) = term.split_once("==") {
        return Some((k.trim().into(), v.trim().into(), true));
    }
    term.split_once('=')
        .map(|(k, v)| (k.trim().into(), v.trim().into(), true))
}

impl FieldSelector {
    /// Parses `spec.nodeName=node-a,metadata.namespace!=kube-system` for resource `rt`.
    pub fn parse(rt: ResourceType, s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (k, v, eq) = split_eq(term).ok_or_else(|| {
                ApiError::bad_request(format!(
                    "invalid field selector term {term:?}: expected key=value or key!=value"
                ))
            })?;
            if !rt.field_labels().contains(&k.as_str()) {
                return Err(ApiError::bad_request(format!("field label not supported: {k}")));
            }
            reqs.push(if eq { Req::Eq(k, v) } else { Req::NotEq(k, v) });
        }
        Ok(Self(reqs))
    }

    /// Whether the object satisfies every term. A missing field reads as ""; booleans and
    /// numbers as their JSON text (`spec.unschedulable=true`).
    pub fn matches(&self, obj: &Value) -> bool {
        if self.0.is_empty() {
            return true;
        }
        let core_event;
        let obj = if obj.get("apiVersion").and_then(Value::as_str) == Some("events.k8s.io/v1") {
            core_event = crate::events::to_core(obj);
            &core_event
        } else {
            obj
        };
        self.0.iter().all(|r| {
            // `source` selects on the reporting component, as the apiserver's Event field table does.
            let get = |path: &str| match (if path == "source" { "source.component" } else { path })
                .split('.')
                .try_fold(obj, |v, seg| v.get(seg))
            {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            match r {
                Req::Eq(k, v) => get(k) == *v,
                Req::NotEq(k, v) => get(k) != *v,
                _ => unreachable!("field selectors only hold equality terms"),
            }
        })
    }
}

fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_set(rest: &str, term: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!("invalid label selector term {term:?}: expected a (v1,v2) set"))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parses `app=web,tier!=db,env in (a,b),!legacy`.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in split_top_level(s).into_iter().map(str::trim).filter(|t| !t.is_empty()) {
            if let Some(k) = term.strip_prefix('!') {
                reqs.push(Req::NotExists(k.trim().into()));
            } else if let Some((k, rest)) = term.split_once(" notin ") {
                reqs.push(Req::NotIn(k.trim().into(), parse_set(rest, term)?));
            } else if let Some((k, rest)) = term.split_once(" in ") {
                reqs.push(Req::In(k.trim().into(), parse_set(rest, term)?));
            } else if let Some((k, v, eq)) = split_eq(term) {
                reqs.push(if eq { Req::Eq(k, v) } else { Req::NotEq(k, v) });
            } else {
                reqs.push(Req::Exists(term.into()));
            }
        }
        Ok(Self(reqs))
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
            Req::In(k, set) => get(k).is_some_and(|v| set.iter().any(|s| s == v)),
            Req::NotIn(k, set) => get(k).is_none_or(|v| !set.iter().any(|s| s == v)),
        })
    }
}

/// Everything a list or watch filters on.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// `Some(ns)` for a namespaced list path; `None` for all namespaces / cluster-scoped.
    pub namespace: Option<String>,
    pub fields: FieldSelector,
    pub labels: LabelSelector,
}

impl Filter {
    /// Whether the object passes the namespace, field and label filters.
    pub fn matches(&self, obj: &Value) -> bool {
        let ns_ok = match &self.namespace {
            Some(ns) => obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns.as_str()),
            None => true,
        };
        ns_ok && self.fields.matches(obj) && self.labels.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{NODES, PODS};
    use serde_json::json;

    #[test]
    fn field_selector_on_node_name() {
        let sel = FieldSelector::parse(PODS, "spec.nodeName=node-a").unwrap();
        assert!(sel.matches(&json!({"spec": {"nodeName": "node-a"}})));
        assert!(!sel.matches(&json!({"spec": {"nodeName": "node-b"}})));
        assert!(!sel.matches(&json!({"spec": {}})));
        let neg = FieldSelector::parse(PODS, "spec.nodeName!=").unwrap();
        assert!(neg.matches(&json!({"spec": {"nodeName": "x"}})));
        assert!(!neg.matches(&json!({"spec": {}})));
    }

    #[test]
    fn unsupported_field_is_a_bad_request() {
        let err = FieldSelector::parse(PODS, "spec.hostname=x").unwrap_err();
        assert_eq!(err.code, 400);
        assert_eq!(err.message, "field label not supported: spec.hostname");
        // Each type has its own labels.
        assert!(FieldSelector::parse(NODES, "spec.unschedulable=true").is_ok());
        assert!(FieldSelector::parse(NODES, "spec.nodeName=x").is_err());
    }

    #[test]
    fn label_selector_forms() {
        let obj = json!({"metadata": {"labels": {"app": "web", "env": "prod"}}});
        for (sel, want) in [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("env in (dev,prod)", true),
            ("env notin (dev,prod)", false),
            ("app=web,env in (dev)", false),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&obj),
                want,
                "selector {sel:?}"
            );
        }
    }
}
