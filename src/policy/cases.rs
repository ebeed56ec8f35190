//! Case tables: YAML files that pin a policy's decisions, run inside the same sandbox the
//! daemon uses.
//!
//! ```yaml
//! slot: cpu-class-admission
//! component: my-policy.wasm        # optional; default: <table>.wasm beside, else the built-in
//! defaults:                        # merged under every case (JSON merge patch)
//!   pod: {metadata: {namespace: ns, name: p}}
//! cases:
//!   - name: classified pod on a matching node
//!     pod: {spec: {nodeSelector: {cocoonstack.io/snapshot-cpu-class: x}}}
//!     host: {node-class: x}
//!     expect: {verdict: Admit, reason: class-match}   # a subset of the decision's JSON
//!     message-contains: [provides]
//! ```
//!
//! Facts and decisions are written in the contract's JSON shape (see [`super::input`]).

use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use super::engine::PolicyEngine;
use super::input::{DecisionInput, facts_for, merge_contract, to_contract_json};
use super::loaded::LoadedPolicy;
use super::set::fail_safe_message;
use super::slots::{PolicySlot, Slot};

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct CaseTable {
    pub slot: Slot,
    /// Component under test, relative to the table's directory.
    #[serde(default)]
    pub component: Option<PathBuf>,
    #[serde(default)]
    pub defaults: DecisionInput,
    pub cases: Vec<Case>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Case {
    pub name: String,
    #[serde(default)]
    pub pod: Value,
    #[serde(default)]
    pub host: Value,
    /// Every key given must equal the decision's (objects compare recursively).
    pub expect: Value,
    #[serde(default)]
    pub message_contains: Vec<String>,
}

/// The outcome of one case.
#[derive(Debug, Clone)]
pub struct CaseResult {
    pub name: String,
    /// `None` when the case passed, else what differed.
    pub failure: Option<String>,
    pub decision: Value,
}

impl CaseTable {
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = fs::read_to_string(path).map_err(|e| format!("cannot read case table {}: {e}", path.display()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses a table's YAML; `name` says where it came from in messages.
    pub fn parse(text: &str, name: &str) -> Result<Self, String> {
        let table: CaseTable =
            serde_yaml_ng::from_str(text).map_err(|e| format!("case table {name} is malformed: {e}"))?;
        if table.cases.is_empty() {
            return Err(format!("case table {name} has no cases"));
        }
        Ok(table)
    }

    /// The component this table tests: `component:` if given, else `<stem>.wasm` beside the
    /// table (for `x.cases.yaml`, `x.wasm`), else `None` (the slot's built-in policy).
    pub fn component_path(&self, table_path: &Path) -> Option<PathBuf> {
        let dir = table_path.parent().unwrap_or(Path::new("."));
        if let Some(component) = &self.component {
            return Some(dir.join(component));
        }
        let name = table_path.file_name()?.to_str()?;
        let stem = name
            .strip_suffix(".cases.yaml")
            .or_else(|| name.strip_suffix(".cases.yml"))?;
        let beside = dir.join(format!("{stem}.wasm"));
        beside.exists().then_some(beside)
    }

    /// Runs every case against `policy` (the table's slot must be `S`'s; see [`Self::slot`]).
    pub fn run<S: PolicySlot>(&self, engine: &PolicyEngine, policy: &LoadedPolicy<S>) -> Vec<CaseResult> {
        self.cases
            .iter()
            .map(|case| self.run_case(engine, policy, case))
            .collect()
    }

    fn run_case<S: PolicySlot>(&self, engine: &PolicyEngine, policy: &LoadedPolicy<S>, case: &Case) -> CaseResult {
        let fail = |failure: String, decision: Value| CaseResult {
            name: case.name.clone(),
            failure: Some(failure),
            decision,
        };
        if self.slot != S::SLOT {
            return fail(
                format!("the table is for slot {}, not {}", self.slot, S::SLOT),
                Value::Null,
            );
        }
        let mut host = self.defaults.host.clone();
        if !case.host.is_null() {
            merge_contract(&mut host, &case.host);
        }
        let input = DecisionInput {
            pod: merged(&self.defaults.pod, &case.pod),
            host,
        };
        let facts = match facts_for::<S>(&input) {
            Ok(facts) => facts,
            Err(error) => return fail(format!("bad input: {error}"), Value::Null),
        };
        let decision = decision_json::<S>(engine, policy, &facts);
        if let Some(difference) = subset_difference(&case.expect, &decision, "") {
            return fail(difference, decision);
        }
        let message = decision.get("message").and_then(Value::as_str).unwrap_or("");
        if let Some(missing) = case
            .message_contains
            .iter()
            .find(|needle| !message.contains(needle.as_str()))
        {
            return fail(format!("message {message:?} does not contain {missing:?}"), decision);
        }
        CaseResult {
            name: case.name.clone(),
            failure: None,
            decision,
        }
    }
}

/// The decision the daemon would act on, as contract JSON: a failed policy's fail-safe
/// decision, with a `fail-safe` key saying what failed.
pub fn decision_json<S: PolicySlot>(engine: &PolicyEngine, policy: &LoadedPolicy<S>, facts: &S::Facts) -> Value {
    match policy.decide(engine, facts) {
        Ok(decision) => to_contract_json(&decision),
        Err(error) => {
            let mut json = to_contract_json(&S::fail_safe(facts, fail_safe_message::<S>(&error)));
            json["fail-safe"] = Value::String(error.to_string());
            json
        }
    }
}

fn merged(base: &Value, overlay: &Value) -> Value {
    let mut out = base.clone();
    if !overlay.is_null() {
        json_patch::merge(&mut out, overlay);
    }
    out
}

/// `None` when every key of `expected` is in `actual` with an equal value (recursively for
/// objects); otherwise the first difference, named by its path.
pub fn subset_difference(expected: &Value, actual: &Value, path: &str) -> Option<String> {
    match (expected, actual) {
        (Value::Object(want), Value::Object(have)) => want.iter().find_map(|(key, want_value)| {
            let here = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            match have.get(key) {
                Some(have_value) => subset_difference(want_value, have_value, &here),
                None => Some(format!(
                    "{here}: expected {want_value}, but the decision has no such field"
                )),
            }
        }),
        _ if expected == actual => None,
        _ => Some(format!(
            "{}: expected {expected}, got {actual}",
            if path.is_empty() { "decision" } else { path }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn subset_matching_names_the_first_difference() {
        let actual =
            json!({"outcome": {"Proceed": {"Clone": {"tag": "v1", "local-snapshot": "s"}}}, "reason": "clone"});
        assert_eq!(
            subset_difference(&json!({"outcome": {"Proceed": {"Clone": {"tag": "v1"}}}}), &actual, ""),
            None
        );
        assert_eq!(
            subset_difference(&json!({"outcome": {"Proceed": {"Clone": {"tag": "v2"}}}}), &actual, ""),
            Some("outcome.Proceed.Clone.tag: expected \"v2\", got \"v1\"".into())
        );
        assert!(
            subset_difference(&json!({"verdict": "Admit"}), &actual, "")
                .unwrap()
                .contains("no such field")
        );
    }

    #[test]
    fn case_overrides_merge_over_defaults() {
        let base = json!({"metadata": {"name": "p", "annotations": {"a": "1", "b": "2"}}});
        let overlay = json!({"metadata": {"annotations": {"b": null, "c": "3"}}});
        assert_eq!(
            merged(&base, &overlay),
            json!({"metadata": {"name": "p", "annotations": {"a": "1", "c": "3"}}})
        );
    }

    #[test]
    fn every_slot_has_a_default_table_for_its_own_slot() {
        let policies = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        for slot in Slot::ALL {
            let path = policies.join(slot.name()).join(format!("{slot}.cases.yaml"));
            let table = CaseTable::load(&path).unwrap_or_else(|e| panic!("{slot}: {e}"));
            assert_eq!(table.slot, slot, "{}", path.display());
        }
    }

    #[test]
    fn the_component_beside_a_table_is_found_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let table: CaseTable = serde_yaml_ng::from_str("slot: bring-up\ncases: []").unwrap();
        let path = dir.path().join("mine.cases.yaml");
        assert_eq!(table.component_path(&path), None);
        fs::write(dir.path().join("mine.wasm"), b"").unwrap();
        assert_eq!(table.component_path(&path), Some(dir.path().join("mine.wasm")));
    }
}
