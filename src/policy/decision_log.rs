//! The decision log (`VK_DECISION_LOG`): one JSON line per decision — id, time, slot, component
//! digest and contract version, the facts (long strings cut), the decision, whether the
//! fail-safe was taken and why, and the latency — to stderr or to a file rotated at a size limit.
//! `vk-cocoon policy eval --from-log LINE` replays a line against another component.
//!
//! Off by default; then a decision pays one branch. On, a decision only hands its facts and
//! answer (cloned) to a bounded queue; a writer thread serializes them straight into their
//! lines (`contract_json`: renamed, redacted and cut on the fly, no JSON tree) and writes them
//! in batches (one `write` per batch, so lines never interleave). A full queue never blocks a
//! decision: the record is dropped and counted (`cocoon_vk_policy_decision_log_dropped_total`).
//! Dropping the log writes what is queued; [`DecisionLog::flush`] waits for it.
//!
//! The file holds what pods carry, so it is the daemon's alone: created 0600 (an existing one is
//! narrowed to 0600), never opened through a symbolic link (a link planted at the path would
//! have the daemon append to any file it can write), and values that look like secrets are not
//! copied into it ([`looks_secret`]).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use self::contract_json::{Scratch, write_contract_json};
use super::error::DecisionError;
use super::loaded::LoadedPolicy;
use super::slots::{PolicySlot, Slot};

/// Strings in the logged facts longer than this many bytes are cut (annotation values can be
/// large: cloud-init user data, JSON blobs); the record says so.
pub const FACT_STRING_CUT: usize = 1024;
/// Default size at which the file is rotated (to `<path>.1`).
pub const DEFAULT_MAX_BYTES: u64 = 64 << 20;
/// Records that may wait for the writer thread. A decision takes microseconds and a line's
/// write a few more, so the queue only fills when the disk stalls; then records are dropped
/// rather than decisions slowed.
pub const QUEUE_CAPACITY: usize = 4096;
/// Lines written by one `write` at most.
const BATCH_LINES: usize = 256;
/// How long closing the log (or a flush) waits for the writer.
pub const FLUSH_WAIT: Duration = Duration::from_secs(5);

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
    /// Some values looked like secrets and are logged as their length and digest
    /// ([`looks_secret`]): a replay is of the redacted facts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub facts_redacted: bool,
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
    /// The file is renamed to its name plus .1 at this size, in bytes (at least 4096)
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

mod contract_json;

/// A record handed to the writer thread, which serializes it into its line.
trait Pending: Send {
    /// Appends the record's JSON (one object, no newline) to `out`; `epoch` is the log's, for
    /// the record's id. An error may leave part of it in `out`.
    fn write_json(&self, epoch: &str, out: &mut Vec<u8>, scratch: &mut Scratch) -> Result<(), serde_json::Error>;
}

/// What the writer thread is asked to do.
enum Job {
    /// Write a record (serialized off the decision path).
    Record(Box<dyn Pending>),
    /// Answer once every record queued before has been written.
    Flush(SyncSender<()>),
}

/// The open log.
pub struct DecisionLog {
    sink: Arc<Sink>,
    /// `None` only while dropping: the writer sees the queue close and ends.
    queue: Option<SyncSender<Job>>,
    writer: Option<JoinHandle<()>>,
    epoch: Arc<str>,
    sequence: AtomicU64,
    dropped: AtomicU64,
    dropped_metric: OnceLock<prometheus::IntCounter>,
}

impl std::fmt::Debug for DecisionLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionLog")
            .field("target", &self.sink.target)
            .finish_non_exhaustive()
    }
}

impl DecisionLog {
    /// Opens (creates, appends to) the target and starts its writer thread; a file that cannot
    /// be opened is an error at startup, naming it.
    pub fn open(target: LogTarget) -> std::io::Result<DecisionLog> {
        let file = match &target {
            LogTarget::Stderr => None,
            LogTarget::File { path, .. } => Some(open_append(path)?),
        };
        let sink = Arc::new(Sink {
            target,
            file: Mutex::new(file),
        });
        let (queue, jobs) = std::sync::mpsc::sync_channel(QUEUE_CAPACITY);
        let started = chrono::Utc::now().timestamp_micros();
        let epoch: Arc<str> = format!("{started:x}").into();
        let writer = std::thread::Builder::new().name("decision-log".into()).spawn({
            let (sink, epoch) = (sink.clone(), epoch.clone());
            move || write_jobs(&sink, &epoch, &jobs)
        })?;
        Ok(DecisionLog {
            sink,
            queue: Some(queue),
            writer: Some(writer),
            epoch,
            sequence: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
            dropped_metric: OnceLock::new(),
        })
    }

    pub fn target(&self) -> &LogTarget {
        &self.sink.target
    }

    /// Counts dropped records in `counter` too (the daemon's metrics).
    pub fn count_drops_in(&self, counter: prometheus::IntCounter) {
        let _ = self.dropped_metric.set(counter);
    }

    /// Records dropped because the queue was full (or the writer gone) since the log opened.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// A fresh record id.
    pub fn next_id(&self) -> String {
        record_id(&self.epoch, self.sequence.fetch_add(1, Ordering::Relaxed))
    }

    /// Writes one record now, on the caller's thread (tools and tests; decisions go through
    /// the queue). Logging never fails a caller: errors are reported by tracing.
    pub fn write(&self, record: &DecisionRecord) {
        let mut lines = Lines::default();
        lines.push(record);
        self.sink.write_lines(&lines);
    }

    /// Waits until every record queued so far is written, for at most [`FLUSH_WAIT`] (a stalled
    /// disk must not hold up the daemon's exit); whether they were.
    pub fn flush(&self) -> bool {
        let (done, finished) = std::sync::mpsc::sync_channel(1);
        let Some(queue) = &self.queue else { return true };
        // The queue may be full: a blocking send is bounded by the writer's progress, so it too
        // is given the deadline.
        let deadline = std::time::Instant::now() + FLUSH_WAIT;
        let mut job = Job::Flush(done);
        loop {
            match queue.try_send(job) {
                Ok(()) => break,
                Err(TrySendError::Disconnected(_)) => return false,
                Err(TrySendError::Full(back)) if std::time::Instant::now() < deadline => {
                    job = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(TrySendError::Full(_)) => return false,
            }
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        finished.recv_timeout(left).is_ok()
    }

    /// Queues a record for the writer; never blocks. A full queue drops it, counted.
    fn enqueue(&self, record: Box<dyn Pending>) {
        let Some(queue) = &self.queue else { return };
        match queue.try_send(Job::Record(record)) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if let Some(counter) = self.dropped_metric.get() {
                    counter.inc();
                }
                // Said at the 1st, 2nd, 4th, 8th… drop: a stalled disk must not flood the log.
                if dropped.is_power_of_two() {
                    tracing::warn!(dropped, capacity = QUEUE_CAPACITY, target = ?self.sink.target, "the decision log cannot keep up; records are dropped (decisions are not slowed)");
                }
            }
        }
    }
}

impl Drop for DecisionLog {
    /// Writes what is queued: closing the queue ends the writer once it has drained it. A writer
    /// stuck on its disk past [`FLUSH_WAIT`] is left behind (said once) rather than waited for.
    fn drop(&mut self) {
        let drained = self.flush();
        self.queue = None;
        match self.writer.take() {
            Some(writer) if drained => {
                let _ = writer.join();
            }
            Some(_) => {
                tracing::warn!(target = ?self.sink.target, "the decision log could not write its last records in time; they may be lost")
            }
            None => {}
        }
    }
}

/// The writer thread: takes what is queued (up to [`BATCH_LINES`] at a time), serializes the
/// lines into one buffer (kept from batch to batch) and writes them together, then answers the
/// flushes that were among them.
fn write_jobs(sink: &Sink, epoch: &str, jobs: &Receiver<Job>) {
    let mut lines = Lines::default();
    while let Ok(first) = jobs.recv() {
        lines.clear();
        let mut flushes = Vec::new();
        let mut next = Some(first);
        while let Some(job) = next {
            match job {
                Job::Record(record) => lines.push_pending(epoch, record.as_ref()),
                Job::Flush(done) => flushes.push(done),
            }
            next = if lines.len() < BATCH_LINES {
                jobs.try_recv().ok()
            } else {
                None
            };
        }
        sink.write_lines(&lines);
        for done in flushes {
            let _ = done.send(());
        }
    }
}

/// A record's id: the log's start (µs, hex) and the record's sequence number.
fn record_id(epoch: &str, sequence: u64) -> String {
    format!("{epoch}-{sequence}")
}

/// Lines serialized straight into one buffer (no per-line allocation), each line's end kept:
/// rotation happens between lines.
#[derive(Default)]
struct Lines {
    bytes: Vec<u8>,
    ends: Vec<usize>,
    /// The serializer's buffers, kept from line to line.
    scratch: Scratch,
}

impl Lines {
    /// Appends `record` as one JSON line.
    fn push(&mut self, record: &DecisionRecord) {
        serde_json::to_writer(&mut self.bytes, record).expect("JSON of a decision record");
        self.end_line();
    }

    /// Appends a queued record as one JSON line. One that cannot be serialized (a value
    /// `serde_json` would refuse too) is left out, said by tracing: logging never fails.
    fn push_pending(&mut self, epoch: &str, record: &dyn Pending) {
        let start = self.bytes.len();
        match record.write_json(epoch, &mut self.bytes, &mut self.scratch) {
            Ok(()) => self.end_line(),
            Err(error) => {
                self.bytes.truncate(start);
                tracing::warn!(%error, "a decision could not be logged: its facts do not serialize to JSON");
            }
        }
    }

    fn end_line(&mut self) {
        self.bytes.push(b'\n');
        self.ends.push(self.bytes.len());
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// Each line's byte range in `bytes`.
    fn ranges(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let line = start..end;
            start = end;
            line
        })
    }
}

/// Where the lines land: stderr, or the file and its size so far.
struct Sink {
    target: LogTarget,
    file: Mutex<Option<(File, u64)>>,
}

impl Sink {
    /// Writes `lines` in as few `write`s as rotation allows; errors are reported by tracing.
    fn write_lines(&self, lines: &Lines) {
        if lines.is_empty() {
            return;
        }
        let result = match &self.target {
            LogTarget::Stderr => std::io::stderr().lock().write_all(&lines.bytes),
            LogTarget::File { path, max_bytes } => {
                let mut open = self.file.lock().unwrap_or_else(|p| p.into_inner());
                write_file(&mut open, path, *max_bytes, lines)
            }
        };
        if let Err(error) = result {
            tracing::warn!(%error, target = ?self.target, "cannot write the decision log");
        }
    }
}

/// Appends `lines` to the file, moving a full file to `<path>.1` (replacing the previous one)
/// before the line that would take it past `max`.
fn write_file(open: &mut Option<(File, u64)>, path: &PathBuf, max: u64, lines: &Lines) -> std::io::Result<()> {
    // The lines not yet written: a run of whole lines in `lines.bytes`.
    let mut pending = 0..0;
    for line in lines.ranges() {
        if open.is_none() {
            *open = Some(open_append(path)?);
        }
        let size = open.as_ref().map_or(0, |(_, size)| *size);
        let filled = size + pending.len() as u64;
        if filled > 0 && filled + line.len() as u64 > max {
            append(open, &lines.bytes[pending])?;
            pending = line.start..line.start;
            *open = None;
            let mut rotated = path.clone().into_os_string();
            rotated.push(".1");
            fs::rename(path, PathBuf::from(rotated))?;
            *open = Some(open_append(path)?);
        }
        pending.end = line.end;
    }
    append(open, &lines.bytes[pending])
}

/// Writes `bytes` to the open file in one `write_all`.
fn append(open: &mut Option<(File, u64)>, bytes: &[u8]) -> std::io::Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    let (file, size) = open
        .as_mut()
        .expect("the file is opened before lines are queued for it");
    file.write_all(bytes)?;
    *size += bytes.len() as u64;
    Ok(())
}

/// Opens the log for appending: created 0600, an existing file narrowed to 0600, a symbolic
/// link or anything but a regular file refused.
fn open_append(path: &PathBuf) -> std::io::Result<(File, u64)> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir)?;
    }
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                std::io::Error::new(
                    e.kind(),
                    format!(
                        "{} is a symbolic link; the decision log is never written through one: point VK_DECISION_LOG at the file itself",
                        path.display()
                    ),
                )
            } else {
                e
            }
        })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::other(format!(
            "{} is not a regular file; VK_DECISION_LOG must name a file",
            path.display()
        )));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
    }
    Ok((file, meta.len()))
}

impl DecisionLog {
    /// Logs one decision of `policy` (called after the daemon has its decision). The decision
    /// path only takes a sequence number and the time and clones the facts and the decision
    /// (the caller keeps its own); the writer thread makes the line.
    pub(crate) fn decision<S: PolicySlot>(
        &self,
        policy: &Arc<LoadedPolicy<S>>,
        facts: &S::Facts,
        decision: &S::Decision,
        failure: Option<&DecisionError>,
        elapsed: Duration,
    ) {
        self.enqueue(Box::new(Decided::<S> {
            sequence: self.sequence.fetch_add(1, Ordering::Relaxed),
            time: chrono::Utc::now(),
            policy: policy.clone(),
            facts: facts.clone(),
            decision: decision.clone(),
            fail_safe: failure.map(|error| FailSafe {
                error: error.metric_label().to_string(),
                detail: error.to_string(),
            }),
            elapsed,
        }));
    }
}

/// One decision on its way to the log.
struct Decided<S: PolicySlot> {
    sequence: u64,
    time: chrono::DateTime<chrono::Utc>,
    policy: Arc<LoadedPolicy<S>>,
    facts: S::Facts,
    decision: S::Decision,
    fail_safe: Option<FailSafe>,
    elapsed: Duration,
}

impl<S: PolicySlot> Pending for Decided<S> {
    /// The line [`DecisionRecord`] serializes to — its fields, names and order — with the facts
    /// in the contract's shape, secrets redacted and long strings cut, written as it is made.
    fn write_json(&self, epoch: &str, out: &mut Vec<u8>, scratch: &mut Scratch) -> Result<(), serde_json::Error> {
        let policy = &self.policy;
        out.extend_from_slice(br#"{"id":"#);
        serde_json::to_writer(&mut *out, &format_args!("{epoch}-{}", self.sequence))?;
        out.extend_from_slice(br#","time":"#);
        serde_json::to_writer(&mut *out, &rfc3339(self.time))?;
        out.extend_from_slice(br#","slot":"#);
        serde_json::to_writer(&mut *out, &S::SLOT)?;
        out.extend_from_slice(br#","component":"#);
        serde_json::to_writer(&mut *out, &format_args!("sha256:{}", policy.digest()))?;
        out.extend_from_slice(br#","source":"#);
        serde_json::to_writer(&mut *out, &policy.origin().source())?;
        out.extend_from_slice(br#","contract":"#);
        serde_json::to_writer(&mut *out, &format_args!("{}", policy.version()))?;
        out.extend_from_slice(br#","facts":"#);
        let shaped = write_contract_json(out, scratch, &self.facts, true)?;
        if shaped.cut {
            out.extend_from_slice(br#","facts-truncated":true"#);
        }
        if shaped.redacted {
            out.extend_from_slice(br#","facts-redacted":true"#);
        }
        out.extend_from_slice(br#","decision":"#);
        write_contract_json(out, scratch, &self.decision, false)?;
        if let Some(fail_safe) = &self.fail_safe {
            out.extend_from_slice(br#","fail-safe":"#);
            serde_json::to_writer(&mut *out, fail_safe)?;
        }
        out.extend_from_slice(br#","latency-us":"#);
        serde_json::to_writer(&mut *out, &micros(self.elapsed))?;
        out.push(b'}');
        Ok(())
    }
}

/// Words of a key that mark its value as a secret: cloud-init user data, passwords, tokens,
/// keys, credentials. A key (an annotation's, a label's, or a field's name) is split into words
/// at every character that is not a letter or a digit; it names a secret when a word ends with
/// one of these (`db-password`, `apiKey`, `ssh-authorized-keys`, `vm.cocoonstack.io/user-data`).
const SECRET_WORDS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "secrets",
    "token",
    "tokens",
    "key",
    "keys",
    "credential",
    "credentials",
    "userdata",
    "cloudinit",
];

/// Word pairs that name a secret when they follow each other (`user-data`, `cloud-init`).
const SECRET_PAIRS: &[(&str, &str)] = &[("user", "data"), ("cloud", "init")];

/// How many hex digits of a redacted value's SHA-256 the log keeps (enough to tell two values
/// apart, far too few to look one up).
const REDACTED_DIGEST_HEX: usize = 12;

/// Whether a key names a secret (see `SECRET_WORDS`). Compares in place, without allocating:
/// it runs on every field name of every logged decision's facts.
pub fn looks_secret(key: &str) -> bool {
    // Words are ASCII letters and digits only, so any byte offset in one is a char boundary.
    let ends_with = |word: &str, tail: &str| {
        word.len() >= tail.len() && word.as_bytes()[word.len() - tail.len()..].eq_ignore_ascii_case(tail.as_bytes())
    };
    let mut previous: Option<&str> = None;
    for word in key
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if SECRET_WORDS.iter().any(|s| ends_with(word, s)) {
            return true;
        }
        if let Some(previous) = previous
            && SECRET_PAIRS
                .iter()
                .any(|(a, b)| previous.eq_ignore_ascii_case(a) && word.eq_ignore_ascii_case(b))
        {
            return true;
        }
        previous = Some(word);
    }
    false
}

/// What the log keeps of a secret: its length and the start of its SHA-256.
///
/// The rule ([`contract_json`] applies it): a string is redacted when the key of its object
/// looks secret ([`looks_secret`]), except in the contract's `{key, value}` records (an
/// annotation, a label, a node selector: an object of exactly those two strings), where the
/// `value` is redacted when the record's `key` looks secret — and the key itself is kept.
fn redacted(value: &str) -> String {
    let digest = crate::policy::cache::sha256_hex(value.as_bytes());
    format!(
        "[redacted: {} bytes, sha256:{}]",
        value.len(),
        &digest[..REDACTED_DIGEST_HEX]
    )
}

/// What the log keeps of a fact string longer than [`FACT_STRING_CUT`] bytes: its start, cut at
/// a char boundary, marked with its whole length (`None`: it is kept whole).
fn cut_fact(text: &str) -> Option<String> {
    if text.len() <= FACT_STRING_CUT {
        return None;
    }
    let mut end = FACT_STRING_CUT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Some(format!("{}…[cut: {} bytes]", &text[..end], text.len()))
}

/// `time` for a record: now, RFC 3339 with microseconds.
pub fn now_rfc3339() -> String {
    rfc3339(chrono::Utc::now())
}

fn rfc3339(time: chrono::DateTime<chrono::Utc>) -> String {
    time.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
}

/// Microseconds of `elapsed`, saturating.
pub fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The facts pipeline the lines were made with before [`contract_json`] (a `Value` tree,
    /// renamed, redacted, then cut), kept as the reference the streaming lines are compared
    /// with.
    mod tree {
        use super::super::*;
        use crate::policy::input::to_contract_json;

        /// The record of one decision, as that pipeline built it.
        pub fn record_of<S: PolicySlot>(
            id: String,
            time: chrono::DateTime<chrono::Utc>,
            policy: &LoadedPolicy<S>,
            facts: &S::Facts,
            decision: &S::Decision,
            fail_safe: Option<FailSafe>,
            elapsed: Duration,
        ) -> DecisionRecord {
            let (facts, facts_redacted) = redact_secrets(to_contract_json(facts));
            let (facts, facts_truncated) = cut_long_strings(facts);
            DecisionRecord {
                id,
                time: rfc3339(time),
                slot: S::SLOT,
                component: format!("sha256:{}", policy.digest()),
                source: policy.origin().source(),
                contract: policy.version().to_string(),
                facts,
                facts_truncated,
                facts_redacted,
                decision: to_contract_json(decision),
                fail_safe,
                latency_us: micros(elapsed),
            }
        }

        /// `facts` with every string longer than [`FACT_STRING_CUT`] bytes cut (at a char
        /// boundary) and marked; whether any was.
        pub fn cut_long_strings(facts: Value) -> (Value, bool) {
            fn walk(value: &mut Value, cut: &mut bool) {
                match value {
                    Value::String(text) => {
                        if let Some(kept) = cut_fact(text) {
                            *text = kept;
                            *cut = true;
                        }
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

        /// `facts` with the value of every secret-looking key replaced by `redacted`, and whether any
        /// was. A key is an annotation's, label's or node selector's (the contract's `{key, value}`
        /// records) or an object field's name ([`looks_secret`]).
        pub fn redact_secrets(facts: Value) -> (Value, bool) {
            fn walk(value: &mut Value, redacted_any: &mut bool) {
                match value {
                    Value::Object(map) => {
                        let pair = map.len() == 2 && map.get("value").is_some_and(Value::is_string);
                        if let Some(key) = map.get("key").and_then(Value::as_str).filter(|_| pair) {
                            if looks_secret(key)
                                && let Some(Value::String(text)) = map.get_mut("value")
                            {
                                *text = redacted(text);
                                *redacted_any = true;
                            }
                            return;
                        }
                        for (field, inner) in map.iter_mut() {
                            match inner {
                                Value::String(text) if looks_secret(field) => {
                                    *text = redacted(text);
                                    *redacted_any = true;
                                }
                                other => walk(other, redacted_any),
                            }
                        }
                    }
                    Value::Array(items) => items.iter_mut().for_each(|v| walk(v, redacted_any)),
                    _ => {}
                }
            }
            let mut facts = facts;
            let mut any = false;
            walk(&mut facts, &mut any);
            (facts, any)
        }
    }
    use tree::{cut_long_strings, record_of, redact_secrets};

    /// A ready record queued as it is (the tests' records are not decisions).
    impl Pending for DecisionRecord {
        fn write_json(&self, _epoch: &str, out: &mut Vec<u8>, _scratch: &mut Scratch) -> Result<(), serde_json::Error> {
            serde_json::to_writer(out, self)
        }
    }

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
            facts_redacted: false,
            decision: json!({"reason": "clone"}),
            fail_safe: None,
            latency_us: 7,
        }
    }

    /// A log writing to `decisions.jsonl` in a fresh directory, rotated at `max_bytes`.
    /// Queues `n` records through the writer thread; their ids, in the order queued.
    fn enqueue_records(log: &DecisionLog, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                let record = record(log, json!({"name": "vm1"}));
                let id = record.id.clone();
                log.enqueue(Box::new(record));
                id
            })
            .collect()
    }

    fn file_log(max_bytes: u64) -> (tempfile::TempDir, PathBuf, DecisionLog) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("decisions.jsonl");
        let log = DecisionLog::open(LogTarget::File {
            path: path.clone(),
            max_bytes,
        })
        .unwrap();
        (dir, path, log)
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
        let (dir, path, log) = file_log(4096);
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

    #[test]
    fn a_stalled_disk_drops_records_and_counts_them_but_never_blocks_a_decision() {
        let (_dir, path, log) = file_log(1 << 30);
        let counter = prometheus::IntCounter::new("dropped", "dropped").unwrap();
        log.count_drops_in(counter.clone());
        // The disk "stalls": the writer cannot get at the file while the test holds it.
        let stalled = log.sink.file.lock().unwrap();
        let offered = QUEUE_CAPACITY + BATCH_LINES + 50;
        for _ in 0..offered {
            let record = record(&log, json!({"name": "vm1"}));
            log.enqueue(Box::new(record));
        }
        let dropped = log.dropped();
        assert!(dropped >= 50, "the queue holds {QUEUE_CAPACITY}: {dropped} dropped");
        assert_eq!(counter.get(), dropped, "every drop is counted in the metric");
        drop(stalled);
        log.flush();
        let written = fs::read_to_string(&path).unwrap().lines().count() as u64;
        assert_eq!(written + dropped, offered as u64, "every record is written or counted");
    }

    #[test]
    fn queued_records_are_written_in_order_when_the_log_closes() {
        let (_dir, path, log) = file_log(1 << 30);
        let ids = enqueue_records(&log, 1000);
        drop(log);
        let logged: Vec<String> = fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<DecisionRecord>(l).unwrap().id)
            .collect();
        assert_eq!(logged, ids);
    }

    /// The line's format is a user interface (`policy eval --from-log` and whatever else reads
    /// the file): every field, its name, its place and its JSON shape, pinned byte for byte.
    #[test]
    fn a_record_with_every_field_is_this_exact_line() {
        let (_dir, path, log) = file_log(1 << 20);
        let record = DecisionRecord {
            id: "18a2b3c4d5e6f-42".into(),
            time: "2026-12-06T05:00:00.123456Z".into(),
            slot: Slot::BringUp,
            component: "sha256:abc".into(),
            source: "file:/etc/p.wasm".into(),
            contract: "cocoonstack:vk-policy@0.2.0".into(),
            facts: json!({
                "pod": {"name": "vm1", "annotations": [{"key": "db-password", "value": "[redacted: 7 bytes, sha256:0123456789ab]"}]},
                "cut": "xx…[cut: 2000 bytes]",
            }),
            facts_truncated: true,
            facts_redacted: true,
            decision: json!({"Refuse": {"reason": "x", "retry": null}}),
            fail_safe: Some(FailSafe {
                error: "timeout".into(),
                detail: "took 10 ms".into(),
            }),
            latency_us: 17,
        };
        log.write(&record);
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            concat!(
                r#"{"id":"18a2b3c4d5e6f-42","time":"2026-12-06T05:00:00.123456Z","slot":"bring-up","#,
                r#""component":"sha256:abc","source":"file:/etc/p.wasm","contract":"cocoonstack:vk-policy@0.2.0","#,
                r#""facts":{"cut":"xx…[cut: 2000 bytes]","pod":{"annotations":[{"key":"db-password","#,
                r#""value":"[redacted: 7 bytes, sha256:0123456789ab]"}],"name":"vm1"}},"#,
                r#""facts-truncated":true,"facts-redacted":true,"decision":{"Refuse":{"reason":"x","retry":null}},"#,
                r#""fail-safe":{"error":"timeout","detail":"took 10 ms"},"latency-us":17}"#,
                "\n"
            )
        );
    }

    /// A decision's line, serialized straight from its facts and decision, is byte for byte the
    /// line of the record the tree pipeline builds (the contract's JSON: every key renamed
    /// `_` → `-`, keys in order, secrets redacted, long strings cut), on a real decision.
    #[test]
    fn a_decisions_line_is_the_tree_pipelines_line() {
        use crate::policy::input::{DecisionInput, facts_for};
        use crate::policy::slots::BringUp;
        use crate::policy::{PolicyEngine, SandboxLimits};

        fn renamed(value: Value) -> Value {
            match value {
                Value::Object(map) => Value::Object(
                    map.into_iter()
                        .map(|(k, v)| (k.replace('_', "-"), renamed(v)))
                        .collect(),
                ),
                Value::Array(items) => Value::Array(items.into_iter().map(renamed).collect()),
                other => other,
            }
        }
        let engine = PolicyEngine::new(SandboxLimits::default()).unwrap();
        let policy = Arc::new(LoadedPolicy::<BringUp>::builtin(&engine, None).unwrap());
        let long = "x".repeat(FACT_STRING_CUT + 10);
        let input: DecisionInput = serde_yaml_ng::from_str(&format!(
            "{{pod: {{metadata: {{namespace: ns, name: p, annotations: {{vm.cocoonstack.io/name: vm1, cocoonset.cocoonstack.io/managed: 'true', cocoonset.cocoonstack.io/image: 'snap:v1', example.com/api-token: hunter2, example.com/blob: {long}}}}}}}, host: {{registry-configured: true}}}}"
        ))
        .unwrap();
        let facts = facts_for::<BringUp>(&input).unwrap();
        let decision = policy.decide(&engine, &facts).unwrap();
        let time = chrono::DateTime::parse_from_rfc3339("2026-12-06T05:00:00.123456Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let fail_safe = FailSafe {
            error: "timeout".into(),
            detail: "took \"10\" ms".into(),
        };
        let record = record_of(
            "e-1".into(),
            time,
            &policy,
            &facts,
            &decision,
            Some(fail_safe.clone()),
            Duration::from_micros(5),
        );
        let (expected, redacted_any) = redact_secrets(renamed(serde_json::to_value(&facts).unwrap()));
        let (expected, cut_any) = cut_long_strings(expected);
        assert!(redacted_any && cut_any);
        assert_eq!(record.facts, expected);
        assert!(record.facts_redacted && record.facts_truncated);
        assert_eq!(record.decision, renamed(serde_json::to_value(&decision).unwrap()));

        let decided = Decided::<BringUp> {
            sequence: 1,
            time,
            policy: policy.clone(),
            facts,
            decision,
            fail_safe: Some(fail_safe),
            elapsed: Duration::from_micros(5),
        };
        let mut lines = Lines::default();
        lines.push_pending("e", &decided);
        let line = String::from_utf8(lines.bytes.clone()).unwrap();
        assert_eq!(line, format!("{}\n", serde_json::to_string(&record).unwrap()));
        assert!(line.contains("registry-configured") && !line.contains('_'), "{line}");
        assert!(!line.contains("hunter2"), "{line}");
        // The buffers are reused: a second line is the same line again.
        lines.push_pending("e", &decided);
        assert_eq!(String::from_utf8(lines.bytes).unwrap(), line.repeat(2));
    }

    /// Every kind of value serde can hand the log, through the streaming serializer and through
    /// the tree pipeline: the same JSON, byte for byte, and the same cut / redacted flags — keys
    /// whose order changes with the renaming, secret-looking fields, `{key, value}` records in
    /// either field order (and objects that only look like one), unit variants under secret
    /// keys, variants of every shape, maps, duplicate keys, long strings (in arrays too, cut at a
    /// char boundary), a long secret, escapes.
    #[test]
    fn every_kind_of_value_is_shaped_as_the_tree_pipeline_shapes_it() {
        use crate::policy::input::to_contract_json;
        use serde::ser::SerializeMap;
        use std::collections::BTreeMap;

        #[derive(Serialize)]
        struct Pair {
            key: String,
            value: String,
        }
        #[derive(Serialize)]
        struct ValueFirst {
            value: String,
            key: String,
        }
        #[derive(Serialize)]
        struct Triple {
            key: String,
            value: String,
            extra: u8,
        }
        #[derive(Serialize)]
        struct PairNumber {
            key: String,
            value: u32,
        }
        #[derive(Serialize)]
        enum Choice {
            Plain,
            Found {
                recorded_image: String,
                source_kind: Option<String>,
            },
            Token(String),
            Both(u8, String),
            Nested(Box<Choice>),
        }
        /// A map that names one key twice (the last value wins, as in a JSON map).
        struct Duplicates;
        impl Serialize for Duplicates {
            fn serialize<Ser: serde::Serializer>(&self, serializer: Ser) -> Result<Ser::Ok, Ser::Error> {
                let mut map = serializer.serialize_map(None)?;
                map.serialize_entry("same_key", "first")?;
                map.serialize_entry("other", &1)?;
                map.serialize_entry("same-key", "second")?;
                map.end()
            }
        }
        #[derive(Serialize)]
        struct Every {
            zeta_last: u32,
            // `a-b` sorts before `aB`, `a_b` after it: the order is the renamed keys'.
            a_b: &'static str,
            #[serde(rename = "aB")]
            a_upper: bool,
            api_token: String,
            user_data: Option<String>,
            key: String,
            key_kind: Choice,
            annotations: Vec<Pair>,
            value_first: Vec<ValueFirst>,
            triple: Triple,
            pair_number: PairNumber,
            long_list: Vec<String>,
            db_password: String,
            map: BTreeMap<String, u32>,
            found: Choice,
            token: Vec<Choice>,
            both: Choice,
            nested: Choice,
            duplicates: Duplicates,
            unit: (),
            none: Option<u8>,
            negative: i64,
            big: u64,
            letter: char,
            escaped: String,
            tuple: (u8, String, bool),
            empty_list: Vec<u8>,
            empty_map: BTreeMap<String, u8>,
            deep: Vec<Vec<Pair>>,
        }
        let long = "y".repeat(FACT_STRING_CUT + 1);
        let long_multibyte = format!("{}é{}", "z".repeat(FACT_STRING_CUT - 1), "w".repeat(20));
        let pair = |key: &str, value: &str| Pair {
            key: key.into(),
            value: value.into(),
        };
        let every = Every {
            zeta_last: 7,
            a_b: "dash",
            a_upper: true,
            api_token: "t0k3n".into(),
            user_data: Some("#cloud-config".into()),
            key: "lone key".into(),
            key_kind: Choice::Plain,
            annotations: vec![
                pair("example.com/db-password", "hunter2"),
                pair("vm.cocoonstack.io/name", &long),
                pair(&long, "a long key is cut, not redacted"),
                pair("cloud-init", &long),
            ],
            value_first: vec![ValueFirst {
                value: "hunter3".into(),
                key: "api-key".into(),
            }],
            triple: Triple {
                key: "password".into(),
                value: "kept".into(),
                extra: 1,
            },
            pair_number: PairNumber {
                key: "password".into(),
                value: 5,
            },
            long_list: vec![long.clone(), long_multibyte, "short".into()],
            db_password: long.clone(),
            map: BTreeMap::from([
                ("b_x".into(), 1),
                ("b-a".into(), 2),
                ("bZ".into(), 3),
                ("secret_key".into(), 4),
            ]),
            found: Choice::Found {
                recorded_image: "img".into(),
                source_kind: None,
            },
            token: vec![Choice::Token("s3cret".into()), Choice::Plain],
            both: Choice::Both(1, long.clone()),
            nested: Choice::Nested(Box::new(Choice::Found {
                recorded_image: long.clone(),
                source_kind: Some("registry".into()),
            })),
            duplicates: Duplicates,
            unit: (),
            none: None,
            negative: -5,
            big: u64::MAX,
            letter: 'é',
            escaped: "quote\" backslash\\ newline\n tab\t nul\u{0} ☃".into(),
            tuple: (1, "two".into(), false),
            empty_list: vec![],
            empty_map: BTreeMap::new(),
            deep: vec![vec![pair("token", "deep secret"), pair("name", "x")], vec![]],
        };
        let (tree, redacted_any) = redact_secrets(to_contract_json(&every));
        let (tree, cut_any) = cut_long_strings(tree);
        let mut out = b"prefix:".to_vec();
        let mut scratch = Scratch::default();
        let shaped = write_contract_json(&mut out, &mut scratch, &every, true).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            format!("prefix:{}", serde_json::to_string(&tree).unwrap())
        );
        assert_eq!((shaped.cut, shaped.redacted), (cut_any, redacted_any));
        assert!(cut_any && redacted_any);
        // Without the facts' rules (a decision's JSON): renamed and ordered only.
        let mut out = Vec::new();
        let shaped = write_contract_json(&mut out, &mut scratch, &every, false).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            serde_json::to_string(&to_contract_json(&every)).unwrap()
        );
        assert_eq!((shaped.cut, shaped.redacted), (false, false));
        // Nothing is left behind in the buffers between values.
        assert!(scratch.is_empty());
    }

    /// Rotation inside one batch of the writer thread: every line lands whole, in order, and the
    /// files stay under the limit.
    #[test]
    fn a_batch_rotates_between_whole_lines() {
        let (dir, path, log) = file_log(4096);
        let ids = enqueue_records(&log, 200);
        drop(log);
        let rotated = dir.path().join("decisions.jsonl.1");
        let mut logged = Vec::new();
        for file in [&rotated, &path] {
            let text = fs::read_to_string(file).unwrap();
            assert!(
                text.len() <= 4096 && text.ends_with('\n'),
                "{} holds {} bytes",
                file.display(),
                text.len()
            );
            logged.extend(
                text.lines()
                    .map(|l| serde_json::from_str::<DecisionRecord>(l).unwrap().id),
            );
        }
        assert_eq!(logged, ids[ids.len() - logged.len()..], "the newest lines, in order");
        assert!(logged.len() > 20, "two files of whole lines: {}", logged.len());
    }

    #[test]
    fn the_secret_rule() {
        for secret in [
            "vm.cocoonstack.io/user-data",
            "cloud-init",
            "userData",
            "example.com/db-password",
            "api-token",
            "apiKey",
            "ssh-authorized-keys",
            "AWS_SECRET_ACCESS_KEY",
            "registry-credentials",
        ] {
            assert!(looks_secret(secret), "{secret}");
        }
        for plain in [
            "vm.cocoonstack.io/keep-snapshot-on-delete",
            "cocoonset.cocoonstack.io/image",
            "vm.cocoonstack.io/name",
            "key",
            "app.kubernetes.io/name",
            "user",
        ] {
            assert_eq!(looks_secret(plain), plain == "key", "{plain}");
        }
        let (facts, redacted_any) = redact_secrets(json!({
            "annotations": [{"key": "db-password", "value": "hunter2"}, {"key": "name", "value": "vm1"}],
            "api-token": "t0k3n",
        }));
        assert!(redacted_any);
        assert_eq!(facts["annotations"][1]["value"], "vm1");
        assert_eq!(
            facts["annotations"][0]["value"],
            format!(
                "[redacted: 7 bytes, sha256:{}]",
                &crate::policy::cache::sha256_hex(b"hunter2")[..12]
            )
        );
        assert!(facts["api-token"].as_str().unwrap().starts_with("[redacted: 5 bytes"));
        assert_eq!(redact_secrets(json!({"name": "vm1"})), (json!({"name": "vm1"}), false));
    }

    #[test]
    fn the_log_file_is_created_private() {
        use std::os::unix::fs::PermissionsExt;
        let (_dir, path, log) = file_log(1 << 20);
        log.write(&record(&log, json!({"name": "vm1"})));
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the decision log is created {mode:o}");
    }

    #[test]
    fn a_symlink_at_the_log_path_is_refused() {
        // A link planted where the log goes: the daemon must not write through it.
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious\n").unwrap();
        let planted = dir.path().join("planted.jsonl");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        let opened = DecisionLog::open(LogTarget::File {
            path: planted,
            max_bytes: 1 << 20,
        });
        if let Ok(log) = &opened {
            log.write(&record(log, json!({"name": "vm1"})));
        }
        assert_eq!(
            fs::read_to_string(&victim).unwrap(),
            "precious\n",
            "written through the link"
        );
        let error = opened.expect_err("a symlink is refused").to_string();
        assert!(error.contains("symbolic link"), "{error}");
    }

    #[test]
    fn secret_looking_annotations_are_not_logged() {
        use crate::policy::input::{DecisionInput, facts_for};
        use crate::policy::slots::BringUp;
        use crate::policy::{Policies, PolicyEngine, PolicyMetrics, SandboxLimits};

        let (_dir, path, log) = file_log(1 << 20);
        let engine = PolicyEngine::new(SandboxLimits::default()).unwrap();
        let policies = Policies::with_defaults(engine, None, PolicyMetrics::unregistered())
            .unwrap()
            .with_decision_log(Some(log));
        let input: DecisionInput = serde_yaml_ng::from_str(
            "pod: {metadata: {namespace: ns, name: p, annotations: {vm.cocoonstack.io/name: vm1, cocoonset.cocoonstack.io/managed: 'true', cocoonset.cocoonstack.io/image: 'snap:v1', vm.cocoonstack.io/user-data: '#cloud-config\\npassword: hunter2-user-data', example.com/db-password: hunter2-password, example.com/api-token: hunter2-token}}}",
        )
        .unwrap();
        let facts = facts_for::<BringUp>(&input).unwrap();
        assert_eq!(policies.decide::<BringUp>(&facts).reason, "clone");
        policies.flush_decision_log();
        let text = fs::read_to_string(&path).unwrap();
        assert!(!text.contains("hunter2"), "a secret reached the decision log: {text}");
        assert!(text.contains("snap:v1"), "other annotations are kept: {text}");
    }
}
