//! Default `resource-translation` policy (the kubelet's cgroup v2 conversion): the first
//! container's resources become cocoon's host cgroup flags on every path, and guest vCPU / memory /
//! storage on the run path only (a clone inherits its topology from the snapshot).
//!
//! `cpu.weight` follows the kubelet's cgroup v2 conversion as runc implements it
//! (shares = milli × 1024 / 1000 clamped to [2, 262144]; weight = 1 + (shares − 2) × 9999 / 262142),
//! so 1 CPU ⇒ 39 and a BestEffort pod ⇒ 1.

#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;

// Natively the bindings also derive serde, so the benchmark can hand this crate the host's
// facts (same JSON shape: both sides are generated from the same WIT).
#[cfg(target_arch = "wasm32")]
wit_bindgen::generate!({ world: "resource-translation-policy", path: "../../wit", additional_derives: [PartialEq] });
#[cfg(not(target_arch = "wasm32"))]
wit_bindgen::generate!({
    world: "resource-translation-policy",
    path: "../../wit",
    additional_derives: [PartialEq, serde::Serialize, serde::Deserialize],
});

use cocoonstack::vk_policy::types::{EventReason, KeyValue, Refusal, RefusalKind};
pub use exports::cocoonstack::vk_policy::resource_translation::{
    BootPath, ContainerResources, CpuPolicy, Decision, Facts, GuestResources, Outcome, Translation,
};
use vk_policy_support::quantity::{QuantityError, parse_milli, parse_units};

const MIN_SHARES: u64 = 2;
const MAX_SHARES: u64 = 262_144;
/// The kubelet's CFS period.
pub const CFS_PERIOD_US: u64 = 100_000;
/// The kubelet's smallest CFS quota.
const MIN_QUOTA_US: u64 = 1_000;

pub struct Policy;

impl exports::cocoonstack::vk_policy::resource_translation::Guest for Policy {
    fn decide(facts: Facts) -> Decision {
        decide(&facts)
    }
}

// Component exports exist only in the wasm build (export names contain `:`, which native
// linkers reject); natively the crate is a plain library for tests and benchmarks.
#[cfg(target_arch = "wasm32")]
export!(Policy);

pub fn decide(facts: &Facts) -> Decision {
    match translate(facts) {
        Ok(translation) => {
            let message = describe(&translation);
            Decision {
                outcome: Outcome::Translated(translation),
                reason: "translated".into(),
                message,
            }
        }
        // The quantities are the pod's: it must change.
        Err(message) => Decision {
            outcome: Outcome::Refuse(Refusal {
                kind: RefusalKind::Permanent,
                event: EventReason::ResourceTranslationRefused,
            }),
            reason: "invalid-quantity".into(),
            message,
        },
    }
}

fn translate(facts: &Facts) -> Result<Translation, String> {
    let empty = ContainerResources {
        requests: alloc::vec![],
        limits: alloc::vec![],
    };
    let res = facts.resources.as_ref().unwrap_or(&empty);
    let requests = Side {
        name: "requests",
        values: &res.requests,
    };
    let limits = Side {
        name: "limits",
        values: &res.limits,
    };

    let weight_milli = select(&requests, &limits, "cpu", parse_milli)?;
    let limit_milli = limits.get("cpu", parse_milli)?;
    let cpu = CpuPolicy {
        cpu_weight: cpu_weight(weight_milli),
        cpu_quota_us: (limit_milli > 0).then(|| cpu_quota_us(limit_milli)),
        cpu_period_us: (limit_milli > 0).then_some(CFS_PERIOD_US),
    };
    let guest = match facts.path {
        BootPath::Clone => None,
        BootPath::Run => {
            let vcpu_milli = select(&limits, &requests, "cpu", parse_milli)?;
            let memory = select(&requests, &limits, "memory", parse_units)?;
            let storage = match facts.spec.storage.as_str() {
                "" => 0,
                text => {
                    parse_units(text).map_err(|e| invalid("annotation cocoonset.cocoonstack.io/storage", text, e))?
                }
            };
            let vcpus = u32::try_from(vcpu_milli.div_ceil(1000))
                .map_err(|_| format!("a CPU count of {vcpu_milli}m is more than a VM can have"))?;
            Some(GuestResources {
                vcpus: (vcpus > 0).then_some(vcpus),
                memory_bytes: (memory > 0).then_some(memory),
                storage_bytes: (storage > 0).then_some(storage),
            })
        }
    };
    Ok(Translation { cpu, guest })
}

/// kubelet `MilliCPUToShares` followed by runc's shares → `cpu.weight` conversion.
pub fn cpu_weight(milli: u64) -> u64 {
    let shares = (milli.saturating_mul(1024) / 1000).clamp(MIN_SHARES, MAX_SHARES);
    1 + (shares - MIN_SHARES) * 9999 / (MAX_SHARES - MIN_SHARES)
}

/// kubelet `MilliCPUToQuota` with the 100 ms period.
pub fn cpu_quota_us(limit_milli: u64) -> u64 {
    (limit_milli.saturating_mul(CFS_PERIOD_US) / 1000).max(MIN_QUOTA_US)
}

/// One side (requests or limits) of the container's resources.
struct Side<'a> {
    name: &'static str,
    values: &'a [KeyValue],
}

impl Side<'_> {
    /// The parsed quantity of `resource`, 0 when absent.
    fn get(&self, resource: &str, parse: fn(&str) -> Result<u64, QuantityError>) -> Result<u64, String> {
        match self.values.iter().find(|kv| kv.key == resource) {
            None => Ok(0),
            Some(kv) => parse(&kv.value).map_err(|e| invalid(&format!("{}.{}", self.name, resource), &kv.value, e)),
        }
    }
}

/// `sel(primary, fallback, name)`: the primary's non-zero quantity, else the fallback's, else 0.
fn select(
    primary: &Side<'_>,
    fallback: &Side<'_>,
    resource: &str,
    parse: fn(&str) -> Result<u64, QuantityError>,
) -> Result<u64, String> {
    let first = primary.get(resource, parse)?;
    if first > 0 {
        Ok(first)
    } else {
        fallback.get(resource, parse)
    }
}

fn invalid(field: &str, value: &str, error: QuantityError) -> String {
    format!(
        "{field} \"{value}\" {}; fix the pod's resources (or the annotation) and recreate it",
        error.describe()
    )
}

fn describe(t: &Translation) -> String {
    let mut text = format!("cpu-weight {}", t.cpu.cpu_weight);
    if let (Some(quota), Some(period)) = (t.cpu.cpu_quota_us, t.cpu.cpu_period_us) {
        text.push_str(&format!(", cpu quota {quota}us per {period}us"));
    }
    if let Some(guest) = &t.guest {
        if let Some(v) = guest.vcpus {
            text.push_str(&format!(", {v} vCPU"));
        }
        if let Some(m) = guest.memory_bytes {
            text.push_str(&format!(", {m} bytes of memory"));
        }
        if let Some(s) = guest.storage_bytes {
            text.push_str(&format!(", {s} bytes of storage"));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_weight_check_values() {
        for (milli, weight) in [(500, 20), (1000, 39), (2000, 79), (5, 1), (300_000, 10_000), (0, 1)] {
            assert_eq!(cpu_weight(milli), weight, "{milli}m");
        }
    }

    #[test]
    fn quota_check_values() {
        assert_eq!(cpu_quota_us(2000), 200_000);
        assert_eq!(cpu_quota_us(1000), 100_000);
        assert_eq!(cpu_quota_us(5), 1_000);
    }
}
