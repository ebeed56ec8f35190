//! Records in cocoon's JSON shapes, plus the simulator's internal bookkeeping.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}
fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}
fn is_false(v: &bool) -> bool {
    !*v
}

/// An empty JSON object, used as the value of cocoon's set-objects (`{"<id>":{}}`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Empty {}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct VmConfig {
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub cpu: i64,
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub memory: u64,
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub storage: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_digest: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_direct_io: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub windows: bool,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub cpu_weight: i64,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub cpu_quota_us: i64,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub cpu_period_us: i64,
    pub name: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct NicNetwork {
    pub ip: String,
    pub gateway: String,
    pub prefix: u32,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Nic {
    pub tap: String,
    pub mac: String,
    pub num_queues: u32,
    pub queue_size: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub backend: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub netns_path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NicNetwork>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StorageConfig {
    pub path: String,
    pub ro: bool,
    pub serial: String,
    pub role: String,
}

/// The VM record printed by `vm inspect`, `vm list`, `vm run/clone -o json` and events.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Vm {
    pub id: String,
    pub hypervisor: String,
    pub state: String,
    pub config: VmConfig,
    pub pid: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub socket_path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub net_backend: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub netns_path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network_configs: Vec<Nic>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_configs: Vec<StorageConfig>,
    pub first_booted: bool,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub snapshot_ids: BTreeMap<String, Empty>,
    #[serde(default)]
    pub transition_generation: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_transition_reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub last_transition_at: String,
    pub created_at: String,
    pub updated_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
}

/// A VM plus simulator-only bookkeeping.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct VmEntry {
    pub vm: Vm,
    /// Recorded `running` but its VMM is "dead": printed as `stopped (stale)`.
    #[serde(default)]
    pub stale: bool,
    /// PID of the sim process that is creating this VM (for `reconcile-stale-create`).
    #[serde(default)]
    pub creator_pid: u32,
    #[serde(default)]
    pub seq: u64,
    /// Where the VM's files are (set at its first boot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<crate::vmm::VmFiles>,
}

impl VmEntry {
    /// The record as cocoon prints it: `state` reconciled.
    pub fn reconciled(&self) -> Vm {
        let mut vm = self.vm.clone();
        // cocoon checks the PID: a `running` record whose VMM died is stale.
        let dead = self.vm.pid > 0 && !crate::vmm::alive(self.vm.pid, &self.vm.id);
        if (self.stale || dead) && vm.state == "running" {
            vm.state = "stopped (stale)".into();
        }
        vm
    }
}

/// Snapshot configuration: the keys of A.4.4 (used in the record and in the `snapshot.json` envelope).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SnapshotConfig {
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub cpu: i64,
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub memory: u64,
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub storage: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_digest: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_direct_io: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub windows: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub image_blob_ids: BTreeMap<String, Empty>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hypervisor: String,
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub nics: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SnapshotRecord {
    #[serde(flatten)]
    pub config: SnapshotConfig,
    pub created_at: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SnapshotEntry {
    pub record: SnapshotRecord,
    #[serde(default)]
    pub pending: bool,
    pub data_dir: String,
    #[serde(default)]
    pub seq: u64,
}

/// `snapshot.json`: `{"version":1,"config":{...}}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    pub config: SnapshotConfig,
    pub version: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ImageRecord {
    pub id: String,
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    pub created_at: String,
}
