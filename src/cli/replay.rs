//! `vk-cocoon policy eval --from-log LINE [--component X.wasm]`: a decision the daemon logged
//! (VK_DECISION_LOG), decided again by another component on the same facts — the regression check
//! before a rollout. Prints the new decision; exits 1 when it differs from the logged one.

use std::io::BufRead;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, anyhow};
use serde_json::Value;

use vk_cocoon::policy::cases::{decision_json, subset_difference};
use vk_cocoon::policy::decision_log::DecisionRecord;
use vk_cocoon::policy::input::from_contract_json;
use vk_cocoon::policy::{PolicyEngine, PolicySlot, SlotVisitor, with_slot};

struct Replay<'a> {
    engine: &'a PolicyEngine,
    record: &'a DecisionRecord,
    component: Option<&'a Path>,
}

impl SlotVisitor for Replay<'_> {
    /// (the decision as contract JSON, what decided it)
    type Output = anyhow::Result<(Value, String)>;
    fn visit<S: PolicySlot>(self) -> Self::Output {
        let facts: S::Facts = from_contract_json(self.record.facts.clone())
            .map_err(|e| anyhow!("the logged facts are not {} facts of this contract: {e}", S::SLOT))?;
        let policy = super::policy::load_component::<S>(self.engine, self.component)?;
        let against = format!(
            "the {} (sha256:{}, {})",
            policy.origin(),
            &policy.digest()[..12],
            policy.version()
        );
        Ok((decision_json(self.engine, &policy, &facts), against))
    }
}

fn read_line(line: &str) -> anyhow::Result<String> {
    if line != "-" {
        return Ok(line.to_string());
    }
    std::io::stdin()
        .lock()
        .lines()
        .map_while(Result::ok)
        .find(|l| !l.trim().is_empty())
        .ok_or_else(|| anyhow!("no decision log line on stdin"))
}

pub fn replay(engine: &PolicyEngine, line: &str, component: Option<&Path>) -> anyhow::Result<ExitCode> {
    let text = read_line(line)?;
    let record: DecisionRecord = serde_json::from_str(text.trim())
        .context("not a decision log line (VK_DECISION_LOG writes one JSON object per decision)")?;
    let replay = Replay {
        engine,
        record: &record,
        component,
    };
    let (mut decision, against) = with_slot(record.slot, replay)?;
    let failed = decision.as_object_mut().and_then(|m| m.remove("fail-safe"));
    println!("{}", serde_json::to_string_pretty(&decision)?);
    eprintln!(
        "decision {} (slot {}, {} by {} from {}) replayed against {against}",
        record.id, record.slot, record.time, record.component, record.source
    );
    if record.facts_truncated {
        eprintln!(
            "note: some logged facts were longer than the log keeps and were cut; this replay decided on the cut facts"
        );
    }
    if record.facts_redacted {
        eprintln!(
            "note: some logged facts looked like secrets and were logged as their length and digest; this replay decided on those"
        );
    }
    if let Some(error) = &failed {
        eprintln!("the component failed ({error}): this is the fail-safe decision the daemon would take");
    }
    let difference = if failed.is_some() != record.fail_safe.is_some() {
        Some(format!(
            "the logged decision {} the fail-safe, this one {}",
            if record.fail_safe.is_some() { "was" } else { "was not" },
            if failed.is_some() { "is" } else { "is not" }
        ))
    } else {
        subset_difference(&record.decision, &decision, "")
            .or_else(|| subset_difference(&decision, &record.decision, ""))
    };
    match difference {
        None => {
            eprintln!("same decision as logged");
            Ok(ExitCode::SUCCESS)
        }
        Some(difference) => {
            eprintln!("differs from the logged decision: {difference}");
            Ok(ExitCode::FAILURE)
        }
    }
}
