//! The decisions a policy returns, as plain Rust types the provider acts on, their conversion
//! from the WIT records, and each slot's fail-safe decision.

use serde::Serialize;

use super::bindings::{wit_admission, wit_bring_up, wit_snapshot, wit_translation};
use super::facts::SlotFacts;
use super::slot::Slot;

/// A decision: what to do, a machine-readable reason and a human message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct Decision<T> {
    #[serde(flatten)]
    pub outcome: T,
    pub reason: String,
    pub message: String,
    /// Set when the policy failed and the host substituted the slot's fail-safe decision;
    /// it says what failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_safe: Option<String>,
}

/// Reason of every fail-safe decision.
pub const POLICY_FAILED: &str = "policy-failed";

// ---- snapshot-before-destroy ---------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum SnapshotOutcome {
    Snapshot { target: SnapshotTarget },
    Skip,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct SnapshotTarget {
    pub repository: String,
    pub tag: String,
    pub base_image: String,
}

// ---- bring-up ------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum BringUpOutcome {
    Proceed { plan: Plan },
    Refuse,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case", rename_all_fields = "kebab-case")]
pub enum Plan {
    AdoptExisting { vm_name: String },
    AdoptUnmanaged { vm_id: String, ip: String, vnc_port: u32 },
    RestoreFromHibernate { options: CloneOptions, derived: bool, fresh_nic: bool },
    CloneFromDir { options: CloneOptions, dir: String },
    Fork { options: CloneOptions, source_vm: String, fork_snapshot: String },
    Clone { options: CloneOptions, local_snapshot: String, repository: String, tag: String, expected_backend: String },
    Run { vm_name: String, image: String, force_pull: bool, network: String, backend: String, windows: bool, no_direct_io: bool },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CloneOptions {
    pub vm_name: String,
    pub network: String,
    pub no_direct_io: bool,
    pub backend: String,
    pub restore_mode: String,
    pub drop_own_fork_snapshot: bool,
}

// ---- cpu-class-admission -------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum Verdict {
    Admit,
    Reject,
}

// ---- resource-translation ------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum TranslationOutcome {
    Translated { cpu: CpuPolicy, guest: Option<GuestResources> },
    Refuse,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct CpuPolicy {
    pub cpu_weight: u64,
    pub cpu_quota_us: Option<u64>,
    pub cpu_period_us: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct GuestResources {
    pub vcpus: Option<u32>,
    pub memory_bytes: Option<u64>,
    pub storage_bytes: Option<u64>,
}

/// A decision of any slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum SlotDecision {
    SnapshotBeforeDestroy(Decision<SnapshotOutcome>),
    BringUp(Decision<BringUpOutcome>),
    CpuClassAdmission(Decision<Verdict>),
    ResourceTranslation(Decision<TranslationOutcome>),
}

impl SlotDecision {
    pub fn slot(&self) -> Slot {
        match self {
            SlotDecision::SnapshotBeforeDestroy(_) => Slot::SnapshotBeforeDestroy,
            SlotDecision::BringUp(_) => Slot::BringUp,
            SlotDecision::CpuClassAdmission(_) => Slot::CpuClassAdmission,
            SlotDecision::ResourceTranslation(_) => Slot::ResourceTranslation,
        }
    }

    pub fn reason(&self) -> &str {
        match self {
            SlotDecision::SnapshotBeforeDestroy(d) => &d.reason,
            SlotDecision::BringUp(d) => &d.reason,
            SlotDecision::CpuClassAdmission(d) => &d.reason,
            SlotDecision::ResourceTranslation(d) => &d.reason,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("decisions serialize to JSON")
    }

    /// The decision the host takes when the policy for `facts`' slot failed with `error`.
    /// It is never permissive: admission rejects, bring-up and translation refuse, and
    /// snapshot-before-destroy preserves state.
    pub fn fail_safe(facts: &SlotFacts, error: &str) -> SlotDecision {
        let slot = facts.slot();
        let reason = POLICY_FAILED.to_string();
        let message = format!("policy {slot} failed ({error}); fail-safe: {}", slot.fail_safe_rule());
        let fail_safe = Some(error.to_string());
        match facts {
            SlotFacts::SnapshotBeforeDestroy(f) => SlotDecision::SnapshotBeforeDestroy(Decision {
                outcome: SnapshotOutcome::Snapshot {
                    target: SnapshotTarget {
                        repository: f.spec.vm_name.clone(),
                        tag: "latest".into(),
                        base_image: f.spec.image.clone(),
                    },
                },
                reason,
                message,
                fail_safe,
            }),
            SlotFacts::BringUp(_) => {
                SlotDecision::BringUp(Decision { outcome: BringUpOutcome::Refuse, reason, message, fail_safe })
            }
            SlotFacts::CpuClassAdmission(_) => {
                SlotDecision::CpuClassAdmission(Decision { outcome: Verdict::Reject, reason, message, fail_safe })
            }
            SlotFacts::ResourceTranslation(_) => SlotDecision::ResourceTranslation(Decision {
                outcome: TranslationOutcome::Refuse,
                reason,
                message,
                fail_safe,
            }),
        }
    }
}

// ---- validation of what a policy answered --------------------------------------------------

/// Longest reason token accepted (it becomes a metric label and an Event reason).
const MAX_REASON_LEN: usize = 64;
/// Longest message accepted (the lifecycle message annotation holds at most 4096 bytes).
const MAX_MESSAGE_LEN: usize = 4096;

impl SlotDecision {
    /// Checks the parts of an answer the host relies on; a policy that breaks them gets the
    /// fail-safe decision instead.
    pub fn validate(&self) -> Result<(), String> {
        let reason = self.reason();
        let token = !reason.is_empty()
            && reason.len() <= MAX_REASON_LEN
            && reason.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !token {
            return Err(format!("reason {reason:?} is not a lower-kebab-case token of at most {MAX_REASON_LEN} bytes"));
        }
        let message = match self {
            SlotDecision::SnapshotBeforeDestroy(d) => &d.message,
            SlotDecision::BringUp(d) => &d.message,
            SlotDecision::CpuClassAdmission(d) => &d.message,
            SlotDecision::ResourceTranslation(d) => &d.message,
        };
        if message.len() > MAX_MESSAGE_LEN {
            return Err(format!("message is {} bytes, more than {MAX_MESSAGE_LEN}", message.len()));
        }
        match self {
            SlotDecision::SnapshotBeforeDestroy(Decision { outcome: SnapshotOutcome::Snapshot { target }, .. })
                if target.repository.is_empty() || target.tag.is_empty() =>
            {
                Err("a snapshot decision needs a repository and a tag".into())
            }
            SlotDecision::ResourceTranslation(Decision { outcome: TranslationOutcome::Translated { cpu, .. }, .. }) => {
                if !(1..=10_000).contains(&cpu.cpu_weight) {
                    return Err(format!("cpu-weight {} is outside cgroup v2's 1..=10000", cpu.cpu_weight));
                }
                match (cpu.cpu_quota_us, cpu.cpu_period_us) {
                    (None, None) => Ok(()),
                    (Some(quota), Some(period)) if quota >= 1_000 && (1_000..=1_000_000).contains(&period) => Ok(()),
                    (quota, period) => Err(format!(
                        "cpu quota {quota:?} / period {period:?} must be set together, quota ≥ 1000 µs, period 1000..=1000000 µs"
                    )),
                }
            }
            _ => Ok(()),
        }
    }
}

// ---- conversion from the WIT records -------------------------------------------------------

fn decided<T>(outcome: T, reason: String, message: String) -> Decision<T> {
    Decision { outcome, reason, message, fail_safe: None }
}

impl From<wit_snapshot::Decision> for SlotDecision {
    fn from(d: wit_snapshot::Decision) -> Self {
        let outcome = match d.outcome {
            wit_snapshot::Outcome::Snapshot(t) => SnapshotOutcome::Snapshot {
                target: SnapshotTarget { repository: t.repository, tag: t.tag, base_image: t.base_image },
            },
            wit_snapshot::Outcome::Skip => SnapshotOutcome::Skip,
        };
        SlotDecision::SnapshotBeforeDestroy(decided(outcome, d.reason, d.message))
    }
}

fn clone_options(o: wit_bring_up::CloneOptions) -> CloneOptions {
    CloneOptions {
        vm_name: o.vm_name,
        network: o.network,
        no_direct_io: o.no_direct_io,
        backend: o.backend,
        restore_mode: o.restore_mode,
        drop_own_fork_snapshot: o.drop_own_fork_snapshot,
    }
}

impl From<wit_bring_up::Decision> for SlotDecision {
    fn from(d: wit_bring_up::Decision) -> Self {
        use wit_bring_up::Plan as W;
        let outcome = match d.outcome {
            wit_bring_up::Outcome::Refuse => BringUpOutcome::Refuse,
            wit_bring_up::Outcome::Proceed(plan) => BringUpOutcome::Proceed {
                plan: match plan {
                    W::AdoptExisting(vm_name) => Plan::AdoptExisting { vm_name },
                    W::AdoptUnmanaged(a) => Plan::AdoptUnmanaged { vm_id: a.vm_id, ip: a.ip, vnc_port: a.vnc_port },
                    W::RestoreFromHibernate(r) => Plan::RestoreFromHibernate {
                        options: clone_options(r.options),
                        derived: r.derived,
                        fresh_nic: r.fresh_nic,
                    },
                    W::CloneFromDir(c) => Plan::CloneFromDir { options: clone_options(c.options), dir: c.dir },
                    W::Fork(f) => Plan::Fork {
                        options: clone_options(f.options),
                        source_vm: f.source_vm,
                        fork_snapshot: f.fork_snapshot,
                    },
                    W::Clone(c) => Plan::Clone {
                        options: clone_options(c.options),
                        local_snapshot: c.local_snapshot,
                        repository: c.repository,
                        tag: c.tag,
                        expected_backend: c.expected_backend,
                    },
                    W::Run(r) => Plan::Run {
                        vm_name: r.vm_name,
                        image: r.image,
                        force_pull: r.force_pull,
                        network: r.network,
                        backend: r.backend,
                        windows: r.windows,
                        no_direct_io: r.no_direct_io,
                    },
                },
            },
        };
        SlotDecision::BringUp(decided(outcome, d.reason, d.message))
    }
}

impl From<wit_admission::Decision> for SlotDecision {
    fn from(d: wit_admission::Decision) -> Self {
        let verdict = match d.verdict {
            wit_admission::Verdict::Admit => Verdict::Admit,
            wit_admission::Verdict::Reject => Verdict::Reject,
        };
        SlotDecision::CpuClassAdmission(decided(verdict, d.reason, d.message))
    }
}

impl From<wit_translation::Decision> for SlotDecision {
    fn from(d: wit_translation::Decision) -> Self {
        let outcome = match d.outcome {
            wit_translation::Outcome::Refuse => TranslationOutcome::Refuse,
            wit_translation::Outcome::Translated(t) => TranslationOutcome::Translated {
                cpu: CpuPolicy {
                    cpu_weight: t.cpu.cpu_weight,
                    cpu_quota_us: t.cpu.cpu_quota_us,
                    cpu_period_us: t.cpu.cpu_period_us,
                },
                guest: t.guest.map(|g| GuestResources {
                    vcpus: g.vcpus,
                    memory_bytes: g.memory_bytes,
                    storage_bytes: g.storage_bytes,
                }),
            },
        };
        SlotDecision::ResourceTranslation(decided(outcome, d.reason, d.message))
    }
}
