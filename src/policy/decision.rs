//! The decisions a policy returns, as plain Rust types the provider acts on, their conversion
//! from the WIT records, and each slot's fail-safe decision.

use serde::Serialize;

use super::bindings::{wit_admission, wit_bring_up, wit_guest_fixup, wit_snapshot, wit_translation};
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
    AdoptExisting {
        vm_name: String,
    },
    AdoptUnmanaged {
        vm_id: String,
        ip: String,
        vnc_port: u32,
    },
    RestoreFromHibernate {
        options: CloneOptions,
        derived: bool,
        fresh_nic: bool,
    },
    CloneFromDir {
        options: CloneOptions,
        dir: String,
    },
    Fork {
        options: CloneOptions,
        source_vm: String,
        fork_snapshot: String,
    },
    Clone {
        options: CloneOptions,
        local_snapshot: String,
        repository: String,
        tag: String,
        expected_backend: String,
    },
    Run {
        vm_name: String,
        image: String,
        force_pull: bool,
        network: String,
        backend: String,
        windows: bool,
        no_direct_io: bool,
    },
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
    Translated {
        cpu: CpuPolicy,
        guest: Option<GuestResources>,
    },
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

// ---- guest-fixup ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum FixupOutcome {
    /// Nothing to run in the guest.
    None,
    Run {
        fixup: GuestFixup,
    },
    /// Run nothing and fail the pod's lifecycle.
    Refuse,
}

/// Commands to run in the guest over `cocoon vm exec <vm-id> -- argv...`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct GuestFixup {
    /// Metric label (`windows`, `linux_fc`, `linux_static` for the default policy).
    pub kind: String,
    pub argv: Vec<String>,
    /// Shell text for an operator, written (base64) to the post-clone hint annotation.
    pub hint: String,
}

/// A decision of any slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum SlotDecision {
    SnapshotBeforeDestroy(Decision<SnapshotOutcome>),
    BringUp(Decision<BringUpOutcome>),
    CpuClassAdmission(Decision<Verdict>),
    ResourceTranslation(Decision<TranslationOutcome>),
    GuestFixup(Decision<FixupOutcome>),
}

impl SlotDecision {
    pub fn slot(&self) -> Slot {
        match self {
            SlotDecision::SnapshotBeforeDestroy(_) => Slot::SnapshotBeforeDestroy,
            SlotDecision::BringUp(_) => Slot::BringUp,
            SlotDecision::CpuClassAdmission(_) => Slot::CpuClassAdmission,
            SlotDecision::ResourceTranslation(_) => Slot::ResourceTranslation,
            SlotDecision::GuestFixup(_) => Slot::GuestFixup,
        }
    }

    pub fn reason(&self) -> &str {
        match self {
            SlotDecision::SnapshotBeforeDestroy(d) => &d.reason,
            SlotDecision::BringUp(d) => &d.reason,
            SlotDecision::CpuClassAdmission(d) => &d.reason,
            SlotDecision::ResourceTranslation(d) => &d.reason,
            SlotDecision::GuestFixup(d) => &d.reason,
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("decisions serialize to JSON")
    }

    /// The decision the host takes when the policy for `facts`' slot failed with `error`.
    /// It is never permissive: admission rejects, bring-up and translation refuse,
    /// snapshot-before-destroy preserves state, and guest-fixup refuses (nothing runs in the
    /// guest and the pod never becomes Ready).
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
            SlotFacts::BringUp(_) => SlotDecision::BringUp(Decision {
                outcome: BringUpOutcome::Refuse,
                reason,
                message,
                fail_safe,
            }),
            SlotFacts::CpuClassAdmission(_) => SlotDecision::CpuClassAdmission(Decision {
                outcome: Verdict::Reject,
                reason,
                message,
                fail_safe,
            }),
            SlotFacts::ResourceTranslation(_) => SlotDecision::ResourceTranslation(Decision {
                outcome: TranslationOutcome::Refuse,
                reason,
                message,
                fail_safe,
            }),
            SlotFacts::GuestFixup(_) => SlotDecision::GuestFixup(Decision {
                outcome: FixupOutcome::Refuse,
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
/// Most bytes a guest fixup's argv may hold in all, and its hint (an annotation value).
const MAX_ARGV_BYTES: usize = 64 << 10;
const MAX_HINT_BYTES: usize = 64 << 10;

/// A non-empty token of at most [`MAX_REASON_LEN`] bytes: lower-case ASCII letters, digits, `-`
/// and any of `extra`.
fn is_token(text: &str, extra: &[u8]) -> bool {
    !text.is_empty()
        && text.len() <= MAX_REASON_LEN
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || extra.contains(&b))
}

/// A fixup the host can exec and label: the argv becomes `cocoon vm exec` arguments (a NUL
/// cannot pass through exec), the kind a metric label, the hint an annotation.
fn validate_fixup(fixup: &GuestFixup) -> Result<(), String> {
    if !is_token(&fixup.kind, b"_") {
        return Err(format!(
            "fixup kind {:?} is not a token of [a-z0-9_-] of at most {MAX_REASON_LEN} bytes",
            fixup.kind
        ));
    }
    if fixup.argv.is_empty() {
        return Err("a run fixup needs a non-empty argv".into());
    }
    if let Some(i) = fixup.argv.iter().position(|arg| arg.contains('\0')) {
        return Err(format!("fixup argv[{i}] contains a NUL byte"));
    }
    let argv_bytes: usize = fixup.argv.iter().map(String::len).sum();
    if argv_bytes > MAX_ARGV_BYTES {
        return Err(format!("fixup argv is {argv_bytes} bytes, more than {MAX_ARGV_BYTES}"));
    }
    if fixup.hint.len() > MAX_HINT_BYTES {
        return Err(format!(
            "fixup hint is {} bytes, more than {MAX_HINT_BYTES}",
            fixup.hint.len()
        ));
    }
    Ok(())
}

impl SlotDecision {
    /// Checks the parts of an answer the host relies on; a policy that breaks them gets the
    /// fail-safe decision instead.
    pub fn validate(&self) -> Result<(), String> {
        let reason = self.reason();
        if !is_token(reason, b"") {
            return Err(format!(
                "reason {reason:?} is not a lower-kebab-case token of at most {MAX_REASON_LEN} bytes"
            ));
        }
        let message = match self {
            SlotDecision::SnapshotBeforeDestroy(d) => &d.message,
            SlotDecision::BringUp(d) => &d.message,
            SlotDecision::CpuClassAdmission(d) => &d.message,
            SlotDecision::ResourceTranslation(d) => &d.message,
            SlotDecision::GuestFixup(d) => &d.message,
        };
        if message.len() > MAX_MESSAGE_LEN {
            return Err(format!(
                "message is {} bytes, more than {MAX_MESSAGE_LEN}",
                message.len()
            ));
        }
        match self {
            SlotDecision::SnapshotBeforeDestroy(Decision {
                outcome: SnapshotOutcome::Snapshot { target },
                ..
            }) if target.repository.is_empty() || target.tag.is_empty() => {
                Err("a snapshot decision needs a repository and a tag".into())
            }
            SlotDecision::ResourceTranslation(Decision {
                outcome: TranslationOutcome::Translated { cpu, .. },
                ..
            }) => {
                if !(1..=10_000).contains(&cpu.cpu_weight) {
                    return Err(format!(
                        "cpu-weight {} is outside cgroup v2's 1..=10000",
                        cpu.cpu_weight
                    ));
                }
                match (cpu.cpu_quota_us, cpu.cpu_period_us) {
                    (None, None) => Ok(()),
                    (Some(quota), Some(period)) if quota >= 1_000 && (1_000..=1_000_000).contains(&period) => Ok(()),
                    (quota, period) => Err(format!(
                        "cpu quota {quota:?} / period {period:?} must be set together, quota ≥ 1000 µs, period 1000..=1000000 µs"
                    )),
                }
            }
            SlotDecision::GuestFixup(Decision {
                outcome: FixupOutcome::Run { fixup },
                ..
            }) => validate_fixup(fixup),
            _ => Ok(()),
        }
    }
}

// ---- conversion from the WIT records -------------------------------------------------------

fn decided<T>(outcome: T, reason: String, message: String) -> Decision<T> {
    Decision {
        outcome,
        reason,
        message,
        fail_safe: None,
    }
}

impl From<wit_snapshot::Decision> for SlotDecision {
    fn from(d: wit_snapshot::Decision) -> Self {
        let outcome = match d.outcome {
            wit_snapshot::Outcome::Snapshot(t) => SnapshotOutcome::Snapshot {
                target: SnapshotTarget {
                    repository: t.repository,
                    tag: t.tag,
                    base_image: t.base_image,
                },
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
                    W::AdoptUnmanaged(a) => Plan::AdoptUnmanaged {
                        vm_id: a.vm_id,
                        ip: a.ip,
                        vnc_port: a.vnc_port,
                    },
                    W::RestoreFromHibernate(r) => Plan::RestoreFromHibernate {
                        options: clone_options(r.options),
                        derived: r.derived,
                        fresh_nic: r.fresh_nic,
                    },
                    W::CloneFromDir(c) => Plan::CloneFromDir {
                        options: clone_options(c.options),
                        dir: c.dir,
                    },
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

impl From<wit_guest_fixup::Decision> for SlotDecision {
    fn from(d: wit_guest_fixup::Decision) -> Self {
        let outcome = match d.outcome {
            wit_guest_fixup::Outcome::None => FixupOutcome::None,
            wit_guest_fixup::Outcome::Run(f) => FixupOutcome::Run {
                fixup: GuestFixup {
                    kind: f.kind,
                    argv: f.argv,
                    hint: f.hint,
                },
            },
            wit_guest_fixup::Outcome::Refuse => FixupOutcome::Refuse,
        };
        SlotDecision::GuestFixup(decided(outcome, d.reason, d.message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PodFacts, VmSpec};
    use crate::policy::facts::{BootOrigin, GuestFixupFacts};

    fn fixup_facts() -> SlotFacts {
        SlotFacts::GuestFixup(GuestFixupFacts {
            pod: PodFacts::default(),
            spec: VmSpec::default(),
            vm_id: "id-1".into(),
            hypervisor: "cloud-hypervisor".into(),
            nics: vec![],
            origin: BootOrigin::Clone,
            source_image: String::new(),
            cloudimg_overlay: false,
        })
    }

    fn run(kind: &str, argv: &[&str], hint: &str) -> SlotDecision {
        let fixup = GuestFixup {
            kind: kind.into(),
            argv: argv.iter().map(|a| a.to_string()).collect(),
            hint: hint.into(),
        };
        SlotDecision::GuestFixup(decided(FixupOutcome::Run { fixup }, "linux-static".into(), "m".into()))
    }

    #[test]
    fn a_failed_guest_fixup_policy_runs_nothing_and_says_why() {
        let SlotDecision::GuestFixup(d) =
            SlotDecision::fail_safe(&fixup_facts(), "policy guest-fixup trapped: unreachable")
        else {
            panic!("the fail-safe answers for its own slot")
        };
        assert_eq!(d.outcome, FixupOutcome::Refuse);
        assert_eq!(d.reason, POLICY_FAILED);
        assert!(d.message.contains("never publish Ready"), "{}", d.message);
        assert_eq!(d.fail_safe.as_deref(), Some("policy guest-fixup trapped: unreachable"));
    }

    #[test]
    fn fixups_serialise_like_the_other_outcomes() {
        let json = run("linux_static", &["sh", "-c", "true"], "true").to_json();
        assert_eq!(
            json,
            serde_json::json!({"outcome": "run", "fixup": {"kind": "linux_static", "argv": ["sh", "-c", "true"], "hint": "true"}, "reason": "linux-static", "message": "m"})
        );
        let none = SlotDecision::GuestFixup(decided(FixupOutcome::None, "not-needed".into(), String::new()));
        assert_eq!(none.to_json()["outcome"], "none");
    }

    #[test]
    fn fixups_the_host_cannot_exec_or_label_are_invalid() {
        assert_eq!(run("linux_fc", &["sh", "-c", "true"], "").validate(), Ok(()));
        let big = "x".repeat((64 << 10) + 1);
        let half = "x".repeat(32 << 10);
        let bad = [
            (run("", &["sh"], ""), "fixup kind"),
            (run("Linux", &["sh"], ""), "fixup kind"),
            (run("linux static", &["sh"], ""), "fixup kind"),
            (run(&"k".repeat(65), &["sh"], ""), "fixup kind"),
            (run("linux_fc", &[], ""), "non-empty argv"),
            (run("linux_fc", &["sh", "-c", "a\0b"], ""), "argv[2] contains a NUL"),
            (run("linux_fc", &["sh", &half, &half], ""), "more than 65536"),
            (run("linux_fc", &["sh"], &big), "hint is 65537 bytes"),
        ];
        for (decision, expected) in bad {
            let error = decision.validate().unwrap_err();
            assert!(error.contains(expected), "{error} should mention {expected:?}");
        }
        let mut bad_reason = run("linux_fc", &["sh"], "");
        if let SlotDecision::GuestFixup(d) = &mut bad_reason {
            d.reason = "linux_fc".into();
        }
        assert!(bad_reason.validate().unwrap_err().contains("lower-kebab-case"));
    }
}
