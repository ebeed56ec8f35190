//! The node's policies on its Node object, so `kubectl describe node` tells an operator what a
//! node runs: an annotation per slot with the serving component's digest and one with its source,
//! a `PolicyReady` condition (False, naming the slot and the reason, while a slot's latest reload
//! was refused), and an Event on the Node for every accepted or refused load. Pure mapping here;
//! [`publish`] is the I/O loop.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeCondition, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

use super::events::EventSink;
use super::reasons::{EventReason, EventType};
use super::registration::{self, NodeIdentity};
use crate::policy::status::{PolicyStatus, ReloadOutcome, ReloadResult, StatusBoard};

/// Annotation prefix: `policy.cocoonstack.io/<slot>` = `sha256:…`, `…/<slot>.source` = where it
/// came from (`builtin`, `file:PATH`, `oci://…@sha256:…`), `…/<slot>.contract` = its version.
pub const ANNOTATION_PREFIX: &str = "policy.cocoonstack.io/";
pub const CONDITION: &str = "PolicyReady";
pub const REASON_LOADED: &str = "PoliciesLoaded";
pub const REASON_REFUSED: &str = "PolicyReloadRefused";

/// The annotations naming each slot's serving component.
pub fn annotations(status: &PolicyStatus) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (slot, active) in &status.active {
        out.insert(format!("{ANNOTATION_PREFIX}{slot}"), active.digest.clone());
        out.insert(format!("{ANNOTATION_PREFIX}{slot}.source"), active.source.clone());
        out.insert(format!("{ANNOTATION_PREFIX}{slot}.contract"), active.contract.clone());
    }
    out
}

/// `PolicyReady`: True when every slot's latest load was accepted; else False naming each
/// refused slot, why, and the digest that keeps serving. The transition time is kept from
/// `previous` while the status does not change.
pub fn condition(status: &PolicyStatus, now: &Time, previous: Option<&[NodeCondition]>) -> NodeCondition {
    let (ready, reason, message) = if status.refused.is_empty() {
        let slots = status.active.len();
        let custom = status.active.values().filter(|a| a.source != "builtin").count();
        (
            "True",
            REASON_LOADED,
            format!("{slots} policy slots serving ({custom} operator components, the rest built-in)"),
        )
    } else {
        let refused: Vec<String> = status
            .refused
            .values()
            .map(|o| match &o.result {
                ReloadResult::Refused { reason, message, kept } => {
                    format!(
                        "slot {}: {} refused ({reason}): {message}; {kept} keeps serving",
                        o.slot, o.source
                    )
                }
                ReloadResult::Accepted { .. } => String::new(),
            })
            .collect();
        ("False", REASON_REFUSED, refused.join("; "))
    };
    let transition = previous
        .and_then(|p| p.iter().find(|c| c.type_ == CONDITION && c.status == ready))
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    NodeCondition {
        type_: CONDITION.into(),
        status: ready.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(transition),
    }
}

/// The Event for one load: (warning, reason, note).
pub fn event(outcome: &ReloadOutcome) -> (EventType, EventReason, String) {
    match &outcome.result {
        ReloadResult::Accepted { digest, contract } => (
            EventType::Normal,
            EventReason::PolicyLoaded,
            format!(
                "slot {} now runs {digest} from {} ({contract})",
                outcome.slot, outcome.source
            ),
        ),
        ReloadResult::Refused { reason, message, kept } => (
            EventType::Warning,
            EventReason::PolicyRefused,
            format!(
                "slot {}: new version from {} refused ({reason}): {message}; {kept} keeps serving",
                outcome.slot, outcome.source
            ),
        ),
    }
}

/// Until `shutdown`: patches the Node's status whenever the policy status changes, and records
/// an Event on the Node for each load outcome.
pub async fn publish(
    nodes: Api<Node>,
    identity: NodeIdentity,
    node: ObjectReference,
    board: Arc<StatusBoard>,
    events: EventSink,
    shutdown: CancellationToken,
) {
    let mut changes = board.subscribe();
    let mut outcomes = board.take_outcomes();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                changes.mark_unchanged();
                // The stored conditions, so their transition times survive this write.
                let previous = nodes.get(&identity.config.node_name).await.ok();
                if let Err(error) = registration::patch_status(&nodes, &identity, previous.as_ref()).await {
                    tracing::warn!(%error, "publishing the policy status on the Node failed; the next status refresh retries");
                }
            }
            Some(outcome) = async { match outcomes.as_mut() { Some(rx) => rx.recv().await, None => None } } => {
                let (type_, reason, note) = event(&outcome);
                events.record_on(node.clone(), type_, reason, "PolicyReload", note);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Slot;
    use crate::policy::status::ActivePolicy;
    use k8s_openapi::jiff::Timestamp;
    use std::time::SystemTime;

    fn status() -> PolicyStatus {
        let mut status = PolicyStatus::default();
        status.active.insert(
            Slot::BringUp,
            ActivePolicy {
                digest: "sha256:aa".into(),
                source: "oci://127.0.0.1:5000/p@sha256:bb".into(),
                contract: "cocoonstack:vk-policy@0.2.0".into(),
            },
        );
        status.active.insert(
            Slot::GuestFixup,
            ActivePolicy {
                digest: "sha256:cc".into(),
                source: "builtin".into(),
                contract: "cocoonstack:vk-policy@0.2.0".into(),
            },
        );
        status
    }

    #[test]
    fn each_slot_has_its_digest_source_and_contract() {
        let a = annotations(&status());
        assert_eq!(a["policy.cocoonstack.io/bring-up"], "sha256:aa");
        assert_eq!(
            a["policy.cocoonstack.io/bring-up.source"],
            "oci://127.0.0.1:5000/p@sha256:bb"
        );
        assert_eq!(
            a["policy.cocoonstack.io/guest-fixup.contract"],
            "cocoonstack:vk-policy@0.2.0"
        );
        assert_eq!(a.len(), 6);
    }

    #[test]
    fn a_refused_reload_makes_the_condition_false_until_the_slot_loads() {
        let t0 = Time(Timestamp::UNIX_EPOCH);
        let t1 = Time(Timestamp::from_second(60).unwrap());
        let ok = condition(&status(), &t0, None);
        assert_eq!(
            (ok.status.as_str(), ok.reason.as_deref()),
            ("True", Some(REASON_LOADED))
        );
        assert!(
            ok.message
                .as_deref()
                .unwrap()
                .contains("2 policy slots serving (1 operator")
        );
        let mut refused = status();
        refused.refused.insert(
            Slot::BringUp,
            ReloadOutcome {
                slot: Slot::BringUp,
                source: "oci://127.0.0.1:5000/p@sha256:dd".into(),
                at: SystemTime::UNIX_EPOCH,
                result: ReloadResult::Refused {
                    reason: "fetch",
                    message: "digest mismatch".into(),
                    kept: "sha256:aa".into(),
                },
            },
        );
        let bad = condition(&refused, &t1, Some(std::slice::from_ref(&ok)));
        assert_eq!(
            (bad.status.as_str(), bad.reason.as_deref()),
            ("False", Some(REASON_REFUSED))
        );
        let message = bad.message.as_deref().unwrap();
        assert!(
            message.contains("slot bring-up")
                && message.contains("digest mismatch")
                && message.contains("sha256:aa keeps serving"),
            "{message}"
        );
        assert_eq!(
            bad.last_transition_time,
            Some(t1.clone()),
            "a change of status is a transition"
        );
        let again = condition(
            &refused,
            &Time(Timestamp::from_second(90).unwrap()),
            Some(std::slice::from_ref(&bad)),
        );
        assert_eq!(again.last_transition_time, Some(t1), "a heartbeat is not");
        let (type_, reason, note) = event(&refused.refused[&Slot::BringUp]);
        assert!(
            type_ == EventType::Warning && reason.as_str() == "PolicyRefused" && note.contains("refused (fetch)"),
            "{note}"
        );
    }
}
