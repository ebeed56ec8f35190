//! Adapting components built against older contracts (`policies/README.md`, "Contract versions",
//! states these rules for operators).
//!
//! 0.2.0 has the current records without the 0.3.0 additions, so a value crosses by its JSON
//! form ([`down`], [`up`]): the facts lose the fields 0.2.0 does not have, and a 0.2.0 decision
//! is a current one as it is. What a 0.2.0 bring-up component could not see (who holds the VM
//! names it touches) is ruled on by its slot's adapter.
//!
//! 0.1.0:
//!
//! - **Facts down.** A 0.1.0 component gets the facts it was built for: `phase` in the API
//!   server's spelling, the VM spec's closed domains (mode, os, snapshot policy, backend) and the
//!   probe port as the raw annotation text (0.1.0 decoded nothing), booleans as decoded (the
//!   same exact-`"true"` rule); the 0.2.0 additions (`hibernate`, `keep-snapshot-on-delete`)
//!   are dropped. Typed host facts (evidence source, restore mode, hypervisors) become the
//!   strings 0.1.0 documented.
//! - **Decisions up.** Strings for closed domains are decoded with the 0.2.0 rules (an unknown
//!   backend is then an invalid decision, as the 0.1.0 host could not boot it either; an unknown
//!   restore mode omits the flag, as before). A refusal gets the kind and Event reason the 0.1.0
//!   host derived from its reason token (the tables in each slot's module, and
//!   [`bring_up_refusal`]): that is the one place a reason token still means something, and
//!   only for 0.1.0 components.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::super::contract::types::{self as now, Backend, PodFacts, RefusalKind, VmSpec};
use super::super::contract::v0_1::types as old;
use crate::model::annotations as key;
use crate::model::pod::phase_name;
use crate::model::vm_spec;

fn pairs(list: &[now::KeyValue]) -> Vec<old::KeyValue> {
    list.iter()
        .map(|kv| old::KeyValue {
            key: kv.key.clone(),
            value: kv.value.clone(),
        })
        .collect()
}

pub(super) fn pod(pod: &PodFacts) -> old::PodFacts {
    old::PodFacts {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        phase: phase_name(pod.phase).into(),
        annotations: pairs(&pod.annotations),
        labels: pairs(&pod.labels),
        node_selector: pairs(&pod.node_selector),
        owner_references: pod
            .owner_references
            .iter()
            .map(|o| old::OwnerReference {
                api_version: o.api_version.clone(),
                kind: o.kind.clone(),
                name: o.name.clone(),
                uid: o.uid.clone(),
                controller: o.controller,
            })
            .collect(),
    }
}

/// The 0.1.0 VM spec: closed domains as the raw annotation text.
pub(super) fn spec(pod: &PodFacts, spec: &VmSpec) -> old::VmSpec {
    let raw = |k: &str| {
        pod.annotations
            .iter()
            .find(|kv| kv.key == k)
            .map(|kv| kv.value.clone())
            .unwrap_or_default()
    };
    old::VmSpec {
        vm_name: spec.vm_name.clone(),
        image: spec.image.clone(),
        mode: raw(key::MODE),
        os: raw(key::OS),
        storage: spec.storage.clone(),
        network: spec.network.clone(),
        snapshot_policy: raw(key::SNAPSHOT_POLICY),
        fork_from: spec.fork_from.clone(),
        clone_from_dir: spec.clone_from_dir.clone(),
        managed: spec.managed,
        force_pull: spec.force_pull,
        no_direct_io: spec.no_direct_io,
        conn_type: spec.conn_type.clone(),
        backend: raw(key::BACKEND),
        probe_port: raw(key::PROBE_PORT),
        restore_from_hibernate: spec.restore_from_hibernate,
    }
}

/// A hypervisor as 0.1.0 spelled it ("" when unspecified).
pub(super) fn backend_text(backend: &Backend) -> String {
    match backend {
        Backend::Unspecified => String::new(),
        Backend::CloudHypervisor => "cloud-hypervisor".into(),
        Backend::Firecracker => "firecracker".into(),
        Backend::Unknown(raw) => raw.clone(),
    }
}

/// A 0.1.0 backend string, by the 0.2.0 rule.
pub(super) fn backend(text: &str) -> Backend {
    vm_spec::backend(text)
}

/// The refusal the 0.1.0 host made of a bring-up refusal's reason token: the four tokens a
/// retry can clear were retried, everything else was final; the Event reason came from the
/// same token.
pub(super) fn bring_up_refusal(reason: &str) -> now::Refusal {
    use now::EventReason as E;
    let kind = match reason {
        "hibernate-evidence-unavailable"
        | "hibernate-evidence-not-checked"
        | "policy-failed"
        | "snapshot-unavailable" => RefusalKind::RetryLater,
        _ => RefusalKind::Permanent,
    };
    let event = match reason {
        "hibernate-evidence-unavailable" | "hibernate-evidence-not-checked" => E::HibernateEvidenceUnavailable,
        "image-conflict" => E::HibernateImageConflict,
        "source-conflict" => E::HibernateSourceConflict,
        "hibernate-snapshot-missing" => E::HibernateSnapshotMissing,
        "policy-failed" => E::BringUpPolicyFailed,
        "backend-mismatch" => E::SnapshotBackendMismatch,
        _ => E::CreateBringUpFailed,
    };
    now::Refusal { kind, event }
}

/// The kind the 0.1.0 host gave the other slots' refusals: retried only when the component
/// itself answered `policy-failed`.
pub(super) fn kind_of(reason: &str) -> RefusalKind {
    if reason == super::POLICY_FAILED {
        RefusalKind::RetryLater
    } else {
        RefusalKind::Permanent
    }
}

/// Current facts as the 0.2.0 records (serde skips the fields 0.2.0 lacks).
pub(super) fn down<Now: Serialize, Old: DeserializeOwned>(facts: &Now) -> wasmtime::Result<Old> {
    let value = serde_json::to_value(facts).map_err(wasmtime::Error::msg)?;
    serde_json::from_value(value).map_err(|e| wasmtime::format_err!("adapting the facts to contract 0.2.0: {e}"))
}

/// A 0.2.0 decision as the current record (every 0.2.0 value is a current value).
pub(super) fn up<Old: Serialize, Now: DeserializeOwned>(decision: &Old) -> Result<Now, String> {
    serde_json::to_value(decision)
        .and_then(serde_json::from_value)
        .map_err(|e| format!("a contract 0.2.0 decision has no current meaning: {e}"))
}
