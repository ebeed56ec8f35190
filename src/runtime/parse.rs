//! Pure parsing of cocoon's JSON output (old and new shapes) and of the error texts on its stderr.

use super::errors::RuntimeError;
use crate::hypervisor::Hypervisor;
use serde::{Deserialize, Deserializer, Serialize};
use std::collections::BTreeMap;

/// Accepts `null` (old Go layouts print nil slices/maps) as the default value.
fn null_default<'de, D: Deserializer<'de>, T: Default + Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A VM's `state`. `stopped (stale)` (running on record, VMM dead) and unknown values are tolerated.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum VmState {
    Creating,
    Created,
    Running,
    Stopped,
    Error,
    StoppedStale,
    #[default]
    Unknown,
    Other(String),
}

impl From<String> for VmState {
    fn from(s: String) -> Self {
        match s.as_str() {
            "creating" => Self::Creating,
            "created" => Self::Created,
            "running" => Self::Running,
            "stopped" => Self::Stopped,
            "error" => Self::Error,
            "stopped (stale)" => Self::StoppedStale,
            "" => Self::Unknown,
            _ => Self::Other(s),
        }
    }
}

impl From<VmState> for String {
    fn from(s: VmState) -> String {
        s.as_str().to_string()
    }
}

impl VmState {
    pub fn as_str(&self) -> &str {
        match self {
            Self::Creating => "creating",
            Self::Created => "created",
            Self::Running => "running",
            Self::Stopped => "stopped",
            Self::Error => "error",
            Self::StoppedStale => "stopped (stale)",
            Self::Unknown => "",
            Self::Other(s) => s,
        }
    }
    pub fn is_running(&self) -> bool {
        *self == Self::Running
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VmConfig {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub cpu: i64,
    #[serde(default)]
    pub memory: u64,
    #[serde(default)]
    pub storage: u64,
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub image_digest: String,
    #[serde(default)]
    pub image_type: String,
    #[serde(default)]
    pub network: String,
    #[serde(default)]
    pub windows: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NicNetwork {
    #[serde(default)]
    pub ip: String,
    #[serde(default)]
    pub gateway: String,
    #[serde(default)]
    pub prefix: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Nic {
    #[serde(default)]
    pub tap: String,
    #[serde(default)]
    pub mac: String,
    #[serde(default)]
    pub netns_path: String,
    /// Absent for DHCP NICs (the IP then comes from cocoon-net's lease file).
    #[serde(default)]
    pub network: Option<NicNetwork>,
}

/// The VM record (`vm inspect`, `vm list`, `vm run/clone -o json`, events).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VmRecord {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub hypervisor: Hypervisor,
    #[serde(default)]
    pub state: VmState,
    #[serde(default, deserialize_with = "null_default")]
    pub config: VmConfig,
    #[serde(default)]
    pub pid: i64,
    /// Very old layouts carried the name at the top level; current ones only under `config.name`.
    #[serde(default, rename = "name", skip_serializing_if = "Option::is_none")]
    pub legacy_name: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub network_configs: Vec<Nic>,
    #[serde(default, deserialize_with = "null_default")]
    pub snapshot_ids: BTreeMap<String, serde_json::Value>,
    /// `vm clone -o json` (newer cocoon): guest commands to run after the clone.
    #[serde(default, deserialize_with = "null_default")]
    pub hints: Vec<String>,
    #[serde(default)]
    pub first_booted: bool,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub updated_at: Option<String>,
}

impl VmRecord {
    /// `config.name`, falling back to an old top-level `name`.
    pub fn name(&self) -> &str {
        if !self.config.name.is_empty() {
            &self.config.name
        } else {
            self.legacy_name.as_deref().unwrap_or("")
        }
    }
    /// MAC of NIC 0.
    pub fn primary_mac(&self) -> Option<&str> {
        self.network_configs
            .first()
            .map(|n| n.mac.as_str())
            .filter(|m| !m.is_empty())
    }
    /// Static IP of NIC 0 (`None` for DHCP NICs).
    pub fn primary_ip(&self) -> Option<&str> {
        self.network_configs
            .first()
            .and_then(|n| n.network.as_ref())
            .map(|n| n.ip.as_str())
            .filter(|ip| !ip.is_empty())
    }
}

/// `snapshot inspect` / `snapshot list` record (A.4.4).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub image_digest: String,
    #[serde(default)]
    pub image_type: String,
    #[serde(default, deserialize_with = "null_default")]
    pub image_blob_ids: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub hypervisor: Hypervisor,
    #[serde(default)]
    pub cpu: i64,
    #[serde(default)]
    pub memory: u64,
    #[serde(default)]
    pub storage: u64,
    #[serde(default)]
    pub nics: i64,
    #[serde(default)]
    pub network: String,
    #[serde(default)]
    pub created_at: Option<String>,
}

/// `image inspect` record.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageRecord {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub created_at: Option<String>,
}

/// `vm reconcile-stale-create -o json` outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StaleCreateOutcome {
    Collected,
    Busy,
    NotCreating,
    NotFound,
    Other(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum EventKind {
    Added,
    Modified,
    Deleted,
}

/// One line of `vm status --event --format json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmEvent {
    #[serde(rename = "event")]
    pub kind: EventKind,
    pub vm: VmRecord,
}

fn head(s: &str) -> String {
    s.chars().take(200).collect()
}

fn decode<T: for<'de> Deserialize<'de>>(verb: &str, stdout: &str) -> Result<T, RuntimeError> {
    serde_json::from_str(stdout).map_err(|e| RuntimeError::Decode {
        verb: verb.into(),
        detail: e.to_string(),
        head: head(stdout),
    })
}

/// One VM record; an empty `id` is an error (`empty VM record in JSON payload`).
pub fn parse_vm(verb: &str, stdout: &str) -> Result<VmRecord, RuntimeError> {
    let vm: VmRecord = decode(verb, stdout.trim())?;
    if vm.id.is_empty() {
        return Err(RuntimeError::EmptyRecord { verb: verb.into() });
    }
    Ok(vm)
}

/// `vm list -o json`: an array, `[]`, empty output or the old text `No VMs found.`. Records without an id are skipped.
pub fn parse_vm_list(stdout: &str) -> Result<Vec<VmRecord>, RuntimeError> {
    let t = stdout.trim();
    if t.is_empty() || t.starts_with("No VMs found") {
        return Ok(Vec::new());
    }
    let vms: Option<Vec<VmRecord>> = decode("vm list", t)?;
    Ok(vms
        .unwrap_or_default()
        .into_iter()
        .filter(|v| !v.id.is_empty())
        .collect())
}

/// `snapshot list -o json`: an array, `[]`, or the text `No snapshots found.` / `No snapshots found for VM.`.
pub fn parse_snapshot_list(stdout: &str) -> Result<Vec<SnapshotRecord>, RuntimeError> {
    let t = stdout.trim();
    if t.is_empty() || t.starts_with("No snapshots found") {
        return Ok(Vec::new());
    }
    let snaps: Option<Vec<SnapshotRecord>> = decode("snapshot list", t)?;
    Ok(snaps.unwrap_or_default())
}

pub fn parse_snapshot(stdout: &str) -> Result<SnapshotRecord, RuntimeError> {
    decode("snapshot inspect", stdout.trim())
}

pub fn parse_image(stdout: &str) -> Result<ImageRecord, RuntimeError> {
    decode("image inspect", stdout.trim())
}

pub fn parse_stale_create(stdout: &str) -> Result<StaleCreateOutcome, RuntimeError> {
    #[derive(Deserialize)]
    struct Raw {
        #[serde(default)]
        outcome: String,
    }
    let raw: Raw = decode("vm reconcile-stale-create", stdout.trim())?;
    Ok(match raw.outcome.as_str() {
        "collected" => StaleCreateOutcome::Collected,
        "busy" => StaleCreateOutcome::Busy,
        "not-creating" => StaleCreateOutcome::NotCreating,
        "not-found" => StaleCreateOutcome::NotFound,
        "" => {
            return Err(RuntimeError::Decode {
                verb: "vm reconcile-stale-create".into(),
                detail: "empty outcome".into(),
                head: head(stdout),
            });
        }
        other => StaleCreateOutcome::Other(other.to_string()),
    })
}

/// Decodes one event line. Blank, undecodable lines and records with neither id nor name give `None`.
pub fn decode_event_line(line: &[u8]) -> Option<VmEvent> {
    let line = line.trim_ascii();
    if line.is_empty() {
        return None;
    }
    let ev: VmEvent = serde_json::from_slice(line).ok()?;
    if ev.vm.id.is_empty() && ev.vm.name().is_empty() {
        return None;
    }
    Some(ev)
}

fn contains_ci(hay: &str, needle: &str) -> bool {
    hay.to_ascii_lowercase().contains(needle)
}

/// The holder of a taken name: the token after `already in use by ` or `held by ` (first field, `)` trimmed).
pub fn extract_holder(stderr: &str) -> Option<String> {
    let lower = stderr.to_ascii_lowercase();
    for marker in ["already in use by ", "held by "] {
        if let Some(pos) = lower.find(marker) {
            let rest = &stderr[pos + marker.len()..];
            let token = rest.split_whitespace().next().unwrap_or("");
            let token = token.trim_end_matches([')', ',', ';', '.', ':']).trim_matches('"');
            if !token.is_empty() {
                return Some(token.to_string());
            }
        }
    }
    None
}

/// Classifies a failed invocation from its stderr as the Go client does (case-insensitive).
/// Anything unrecognised is [`RuntimeError::Command`] (inconclusive), never "not found".
pub fn classify_failure(verb: &str, reference: &str, code: Option<i32>, stderr: &str) -> RuntimeError {
    let stderr = stderr.trim().to_string();
    let (verb, reference) = (verb.to_string(), reference.to_string());
    if contains_ci(&stderr, "vm not found") || contains_ci(&stderr, "no such vm") {
        RuntimeError::VmNotFound {
            verb,
            reference,
            stderr,
        }
    } else if contains_ci(&stderr, "snapshot not found") || contains_ci(&stderr, "no such snapshot") {
        RuntimeError::SnapshotNotFound {
            verb,
            reference,
            stderr,
        }
    } else if contains_ci(&stderr, "not found in any backend") {
        RuntimeError::ImageNotFound {
            verb,
            reference,
            stderr,
        }
    } else if contains_ci(&stderr, "is invalid: must match") || contains_ci(&stderr, "invalid snapshot name") {
        RuntimeError::InvalidName {
            verb,
            name: reference,
            stderr,
        }
    } else if contains_ci(&stderr, "is in use by an active") {
        RuntimeError::SnapshotInUse {
            verb,
            reference,
            stderr,
        }
    } else if contains_ci(&stderr, "already exists")
        || contains_ci(&stderr, "already in use by")
        || contains_ci(&stderr, "held by ")
    {
        let holder = extract_holder(&stderr);
        RuntimeError::NameTaken {
            verb,
            name: reference,
            holder,
            stderr,
        }
    } else {
        RuntimeError::Command { verb, code, stderr }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEW: &str = r#"{"id":"K7Q2M4XZ3TBV6N5RWJ2HC4DLPA","hypervisor":"cloud-hypervisor","state":"running",
      "config":{"cpu":2,"memory":4294967296,"image":"ghcr.io/x/ubuntu:24.04","cpu_weight":79,"name":"vk-default-demo-0"},
      "pid":48211,"network_configs":[{"tap":"tapK7Q2M4XZ-0","mac":"02:4f:1a:9c:33:e1","num_queues":4,
      "network":{"ip":"10.88.0.12","gateway":"10.88.0.1","prefix":16}}],"snapshot_ids":{"Q3ZC":{}},
      "created_at":"2026-08-12T10:01:02.123456789+08:00","hints":["echo 1 > /sys/bus/pci/rescan"],"unknown_future_key":[1,2]}"#;

    #[test]
    fn new_vm_record() {
        let vm = parse_vm("vm inspect", NEW).unwrap();
        assert_eq!(vm.name(), "vk-default-demo-0");
        assert_eq!(vm.state, VmState::Running);
        assert_eq!(vm.pid, 48211);
        assert_eq!(vm.primary_mac(), Some("02:4f:1a:9c:33:e1"));
        assert_eq!(vm.primary_ip(), Some("10.88.0.12"));
        assert_eq!(vm.hints, vec!["echo 1 > /sys/bus/pci/rescan"]);
        assert!(vm.snapshot_ids.contains_key("Q3ZC"));
    }

    #[test]
    fn old_vm_record_shapes() {
        let old = r#"{"id":"0123456789abcdef","state":"stopped (stale)","name":"legacy","config":{"cpu":1,"memory":0,"storage":0,"image":""},
                      "network_configs":null,"snapshot_ids":null,"pid":0}"#;
        let vm = parse_vm("vm inspect", old).unwrap();
        assert_eq!(vm.name(), "legacy");
        assert_eq!(vm.state, VmState::StoppedStale);
        assert!(!vm.state.is_running());
        assert!(vm.network_configs.is_empty());
        assert_eq!(vm.primary_ip(), None);
        let dhcp =
            r#"{"id":"A","state":"weird","config":{"name":"n"},"network_configs":[{"mac":"02:00:00:00:00:01"}]}"#;
        let vm = parse_vm("x", dhcp).unwrap();
        assert_eq!(vm.state, VmState::Other("weird".into()));
        assert_eq!(vm.primary_ip(), None);
        assert_eq!(vm.primary_mac(), Some("02:00:00:00:00:01"));
    }

    #[test]
    fn empty_record_is_an_error() {
        assert!(matches!(
            parse_vm("vm clone", r#"{"id":"","state":"running"}"#),
            Err(RuntimeError::EmptyRecord { .. })
        ));
        assert!(matches!(
            parse_vm("vm clone", "not json"),
            Err(RuntimeError::Decode { .. })
        ));
    }

    #[test]
    fn vm_lists() {
        assert!(parse_vm_list("No VMs found.\n").unwrap().is_empty());
        assert!(parse_vm_list("").unwrap().is_empty());
        assert!(parse_vm_list("[]\n").unwrap().is_empty());
        assert!(parse_vm_list("null").unwrap().is_empty());
        let two = format!("[{NEW}, {{\"id\":\"\",\"config\":{{\"name\":\"skipped\"}}}}]");
        let l = parse_vm_list(&two).unwrap();
        assert_eq!(l.len(), 1);
        assert!(parse_vm_list("garbage").is_err());
    }

    #[test]
    fn snapshot_lists_and_records() {
        assert!(parse_snapshot_list("No snapshots found.\n").unwrap().is_empty());
        assert!(parse_snapshot_list("No snapshots found for VM.\n").unwrap().is_empty());
        let s = parse_snapshot(
            r#"{"id":"Q3","name":"a:b","image_blob_ids":{"3f1c":{}},"hypervisor":"firecracker","created_at":"x"}"#,
        )
        .unwrap();
        assert_eq!(s.name, "a:b");
        assert!(s.image_blob_ids.contains_key("3f1c"));
        let l = parse_snapshot_list(r#"[{"id":"1","name":"x"},{"id":"2","name":"y"}]"#).unwrap();
        assert_eq!(l.len(), 2);
    }

    #[test]
    fn stale_create_outcomes() {
        assert_eq!(
            parse_stale_create(r#"{"id":"K","outcome":"collected"}"#).unwrap(),
            StaleCreateOutcome::Collected
        );
        assert_eq!(
            parse_stale_create(r#"{"outcome":"not-found"}"#).unwrap(),
            StaleCreateOutcome::NotFound
        );
        assert_eq!(
            parse_stale_create(r#"{"outcome":"busy"}"#).unwrap(),
            StaleCreateOutcome::Busy
        );
        assert!(parse_stale_create(r#"{"id":"K"}"#).is_err());
    }

    #[test]
    fn event_lines() {
        let line = br#"{"event":"MODIFIED","vm":{"id":"K","state":"stopped (stale)","config":{"name":"n"}}}"#;
        let ev = decode_event_line(line).unwrap();
        assert_eq!(ev.kind, EventKind::Modified);
        assert_eq!(ev.vm.state, VmState::StoppedStale);
        assert!(decode_event_line(b"   ").is_none());
        assert!(decode_event_line(b"{not json").is_none());
        assert!(decode_event_line(br#"{"event":"BOGUS","vm":{"id":"K"}}"#).is_none());
        assert!(
            decode_event_line(br#"{"event":"ADDED","vm":{"state":"running"}}"#).is_none(),
            "no id and no name"
        );
        assert!(decode_event_line(br#"{"event":"DELETED","vm":{"config":{"name":"only-name"}}}"#).is_some());
    }

    #[test]
    fn stderr_classification() {
        let c = |s: &str| classify_failure("verb", "ref", Some(1), s);
        assert!(c("Error: inspect: vm abc: VM not found").is_vm_not_found());
        assert!(c("error: NO SUCH VM").is_vm_not_found());
        assert!(c("Error: rm: resolve \"x\": snapshot not found").is_snapshot_not_found());
        assert!(c("no such snapshot").is_snapshot_not_found());
        assert!(matches!(
            c("Error: image \"x\": not found in any backend"),
            RuntimeError::ImageNotFound { .. }
        ));
        assert!(matches!(
            c("Error: rm: snapshot K is in use by an active export"),
            RuntimeError::SnapshotInUse { .. }
        ));
        match c("Error: snapshot name \"n\" already in use by Q3ZC6R2N4HVL5TJ7WMXK2D9BSA") {
            RuntimeError::NameTaken { holder, .. } => assert_eq!(holder.as_deref(), Some("Q3ZC6R2N4HVL5TJ7WMXK2D9BSA")),
            other => panic!("{other:?}"),
        }
        match c("Error: snapshot name \"n\" already exists") {
            RuntimeError::NameTaken { holder, name, .. } => {
                assert_eq!(holder, None);
                assert_eq!(name, "ref");
            }
            other => panic!("{other:?}"),
        }
        match c("Error: vm name \"x\" already exists (held by ABCDEF)") {
            RuntimeError::NameTaken { holder, .. } => assert_eq!(holder.as_deref(), Some("ABCDEF")),
            other => panic!("{other:?}"),
        }
        // cocoon's own name rule: never worth a retry.
        let invalid = c(
            r#"Error: vm name "vk-$(touch x)" is invalid: must match ^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$ (max 63 chars)"#,
        );
        assert!(
            matches!(invalid, RuntimeError::InvalidName { .. }) && invalid.is_permanent(),
            "{invalid:?}"
        );
        assert!(c("Error: invalid snapshot name \"a b\"").is_permanent());
        let other = c("Error: dial unix /run/x.sock: connection refused");
        assert!(other.is_inconclusive() && !other.is_not_found() && !other.is_permanent());
        assert!(!c("").is_not_found());
    }
}
