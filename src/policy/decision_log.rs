//! The decision log (`VK_DECISION_LOG`): one JSON line per decision — id, time, slot, component
//! digest and contract version, the facts (long strings cut), the decision, whether the
//! fail-safe was taken and why, and the latency — to stderr or to a file rotated at a size limit.
//! `vk-cocoon policy eval --from-log LINE` replays a line against another component.
//!
//! Off by default; then a decision pays one branch. On, the line is built after the decision
//! and written under a lock (one `write` per line, so concurrent decisions never interleave).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::DecisionError;
use super::input::to_contract_json;
use super::loaded::LoadedPolicy;
use super::slots::{PolicySlot, Slot};

/// Strings in the logged facts longer than this many bytes are cut (annotation values can be
/// large: cloud-init user data, JSON blobs); the record says so.
pub const FACT_STRING_CUT: usize = 1024;
/// Default size at which the file is rotated (to `<path>.1`).
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;

/// One logged decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DecisionRecord {
    /// Unique on this node: the daemon's start time (µs, hex) and a sequence number.
    pub id: String,
    /// RFC 3339, UTC, microseconds.
    pub time: String,
    pub slot: Slot,
    /// `sha256:…` of the component that decided.
    pub component: String,
    /// Where it came from (`builtin`, `file:…`, `oci://…@sha256:…`).
    pub source: String,
    pub contract: String,
    /// The facts in the contract's JSON shape (as case tables and `policy eval` write them).
    pub facts: Value,
    /// Some fact strings were longer than [`FACT_STRING_CUT`] and were cut: a replay is of the
    /// cut facts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub facts_truncated: bool,
    /// The decision the daemon acted on (the fail-safe one when the policy failed).
    pub decision: Value,
    /// Why the fail-safe was taken (the policy's error), if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_safe: Option<FailSafe>,
    /// Wall time of the decision, retries and instantiation included.
    pub latency_us: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct FailSafe {
    /// `timeout`, `trap`, `out_of_memory`, `invalid_decision`, `instantiate`.
    pub error: String,
    pub detail: String,
}

/// Where the lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    Stderr,
    File { path: PathBuf, max_bytes: u64 },
}

/// The decision log's settings.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Policies")]
pub struct DecisionLogArgs {
    /// One JSON line per policy decision: off, stderr or a file path
    #[arg(long, env = "VK_DECISION_LOG", value_name = "TARGET", default_value = "off")]
    pub decision_log: String,
    /// The file moves to <path>.1 at this size, in bytes (at least 4096)
    #[arg(long, env = "VK_DECISION_LOG_MAX_BYTES", value_name = "BYTES", default_value_t = DEFAULT_MAX_BYTES,
          value_parser = crate::settings::parser("VK_DECISION_LOG_MAX_BYTES", "a whole number of bytes, at least 4096", |v| match v.parse::<u64>() {
              Ok(n) if n >= 4096 => Ok(n),
              _ => Err("too small or not a number".to_string()),
          }))]
    pub decision_log_max_bytes: u64,
}

impl LogTarget {
    /// `None` for `off`.
    pub fn from_args(args: &DecisionLogArgs) -> Option<LogTarget> {
        match args.decision_log.trim() {
            "" | "off" => None,
            "stderr" => Some(LogTarget::Stderr),
            path => Some(LogTarget::File {
                path: PathBuf::from(path),
                max_bytes: args.decision_log_max_bytes,
            }),
        }
    }

    /// Reads the variables through `lookup`, with the rules of the environment.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Option<LogTarget>, String> {
        Ok(Self::from_args(&crate::settings::parse_lookup::<DecisionLogArgs>(
            lookup,
        )?))
    }
}

/// The open log.
pub struct DecisionLog {
    target: LogTarget,
    file: Mutex<Option<(File, u64)>>,
    epoch: String,
    sequence: AtomicU64,
}

impl std::fmt::Debug for DecisionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionLog")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl DecisionLog {
    /// Opens (creates, appends to) the target; a file that cannot be opened is an error at
    /// startup, naming it.
    pub fn open(target: LogTarget) -> std::io::Result<DecisionLog> {
        let file = match &target {
            LogTarget::Stderr => None,
            LogTarget::File { path, .. } => Some(open_append(path)?),
        };
        let started = chrono::Utc::now().timestamp_micros();
        Ok(DecisionLog {
            target,
            file: Mutex::new(file),
            epoch: format!("{started:x}"),
            sequence: AtomicU64::new(0),
        })
    }

    pub fn target(&self) -> &LogTarget {
        &self.target
    }

    /// A fresh record id.
    pub fn next_id(&self) -> String {
        format!("{}-{}", self.epoch, self.sequence.fetch_add(1, Ordering::Relaxed))
    }

    /// Writes one record. Logging never fails a decision: errors are reported by tracing.
    pub fn write(&self, record: &DecisionRecord) {
        let mut line = serde_json::to_vec(record).expect("JSON of a decision record");
        line.push(b'\n');
        let result = match &self.target {
            LogTarget::Stderr => std::io::stderr().lock().write_all(&line),
            LogTarget::File { path, max_bytes } => {
                let mut guard = self.file.lock().unwrap_or_else(|p| p.into_inner());
                self.write_file(&mut guard, path, *max_bytes, &line)
            }
        };
        if let Err(error) = result {
            tracing::warn!(%error, target = ?self.target, "cannot write the decision log");
        }
    }

    fn write_file(&self, open: &mut Option<(File, u64)>, path: &PathBuf, max: u64, line: &[u8]) -> std::io::Result<()> {
        if open
            .as_ref()
            .is_some_and(|(_, size)| *size > 0 && size + line.len() as u64 > max)
        {
            // Rotate: the full file becomes `<path>.1` (replacing the previous one).
            *open = None;
            let mut rotated = path.clone().into_os_string();
            rotated.push(".1");
            fs::rename(path, PathBuf::from(rotated))?;
        }
        if open.is_none() {
            *open = Some(open_append(path)?);
        }
        let (file, size) = open.as_mut().expect("opened above");
        file.write_all(line)?;
        *size += line.len() as u64;
        Ok(())
    }
}

fn open_append(path: &PathBuf) -> std::io::Result<(File, u64)> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    let size = file.metadata()?.len();
    Ok((file, size))
}

impl DecisionLog {
    /// Logs one decision of `policy` (called after the daemon has its decision).
    pub(crate) fn decision<S: PolicySlot>(
        &self,
        policy: &LoadedPolicy<S>,
        facts: &S::Facts,
        decision: &S::Decision,
        failure: Option<&DecisionError>,
        elapsed: Duration,
    ) {
        let (facts, facts_truncated) = cut_long_strings(to_contract_json(facts));
        self.write(&DecisionRecord {
            id: self.next_id(),
            time: now_rfc3339(),
            slot: S::SLOT,
            component: format!("sha256:{}", policy.digest()),
            source: policy.origin().source(),
            contract: policy.version().to_string(),
            facts,
            facts_truncated,
            decision: to_contract_json(decision),
            fail_safe: failure.map(|error| FailSafe {
                error: error.metric_label().to_string(),
                detail: error.to_string(),
            }),
            latency_us: micros(elapsed),
        });
    }
}

/// `facts` with every string longer than [`FACT_STRING_CUT`] bytes cut (at a char boundary) and
/// marked; whether any was.
pub fn cut_long_strings(facts: Value) -> (Value, bool) {
    fn walk(value: &mut Value, cut: &mut bool) {
        match value {
            Value::String(text) if text.len() > FACT_STRING_CUT => {
                let mut end = FACT_STRING_CUT;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                let total = text.len();
                text.truncate(end);
                text.push_str(&format!("…[cut: {total} bytes]"));
                *cut = true;
            }
            Value::Array(items) => items.iter_mut().for_each(|v| walk(v, cut)),
            Value::Object(map) => map.values_mut().for_each(|v| walk(v, cut)),
            _ => {}
        }
    }
    let mut facts = facts;
    let mut cut = false;
    walk(&mut facts, &mut cut);
    (facts, cut)
}

/// `time` for a record: now, RFC 3339 with microseconds.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// Microseconds of `elapsed`, saturating.
pub fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(log: &DecisionLog, facts: Value) -> DecisionRecord {
        let (facts, facts_truncated) = cut_long_strings(facts);
        DecisionRecord {
            id: log.next_id(),
            time: now_rfc3339(),
            slot: Slot::BringUp,
            component: "sha256:aa".into(),
            source: "builtin".into(),
            contract: "cocoonstack:vk-policy@0.2.0".into(),
            facts,
            facts_truncated,
            decision: json!({"reason": "clone"}),
            fail_safe: None,
            latency_us: 7,
        }
    }

    #[test]
    fn the_variable_selects_off_stderr_or_a_file() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        assert_eq!(LogTarget::from_env(env(&[])).unwrap(), None);
        assert_eq!(LogTarget::from_env(env(&[("VK_DECISION_LOG", "off")])).unwrap(), None);
        assert_eq!(
            LogTarget::from_env(env(&[("VK_DECISION_LOG", "stderr")])).unwrap(),
            Some(LogTarget::Stderr)
        );
        assert_eq!(
            LogTarget::from_env(env(&[
                ("VK_DECISION_LOG", "/var/log/d.jsonl"),
                ("VK_DECISION_LOG_MAX_BYTES", "8192")
            ]))
            .unwrap(),
            Some(LogTarget::File {
                path: "/var/log/d.jsonl".into(),
                max_bytes: 8192
            })
        );
        let error = LogTarget::from_env(env(&[("VK_DECISION_LOG_MAX_BYTES", "12")])).unwrap_err();
        assert!(error.contains("VK_DECISION_LOG_MAX_BYTES=\"12\""), "{error}");
    }

    #[test]
    fn lines_parse_back_long_strings_are_cut_and_the_file_rotates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.jsonl");
        let log = DecisionLog::open(LogTarget::File {
            path: path.clone(),
            max_bytes: 4096,
        })
        .unwrap();
        let long = "é".repeat(FACT_STRING_CUT);
        let first = record(&log, json!({"annotations": [["user-data", long]], "name": "vm1"}));
        assert!(first.facts_truncated);
        let cut = first.facts["annotations"][0][1].as_str().unwrap();
        assert!(
            cut.len() < FACT_STRING_CUT + 40 && cut.ends_with(&format!("[cut: {} bytes]", 2 * FACT_STRING_CUT)),
            "{cut}"
        );
        log.write(&first);
        let text = fs::read_to_string(&path).unwrap();
        let back: DecisionRecord = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(back, first);
        // Past the size limit the file moves to .1 and a new one starts.
        for _ in 0..20 {
            log.write(&record(&log, json!({"name": "vm1"})));
        }
        let rotated = dir.path().join("decisions.jsonl.1");
        assert!(rotated.exists(), "rotated at 4 KiB");
        assert!(fs::metadata(&path).unwrap().len() <= 4096);
        let ids: Vec<String> = [rotated, path]
            .iter()
            .flat_map(|p| {
                fs::read_to_string(p)
                    .unwrap()
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .map(|l| serde_json::from_str::<DecisionRecord>(&l).unwrap().id)
            .collect();
        assert!(ids.windows(2).all(|w| w[0] != w[1]), "{ids:?}");
    }
}
