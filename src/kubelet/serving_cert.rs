//! The kubelet API's serving certificate on the Node, so that an operator sees why the API
//! does not answer yet: a `KubeletServingCertificate` condition (False with reason
//! `CSRPending` while the node's CSR waits for approval, naming it and the
//! `kubectl certificate approve` to run; True once a certificate serves) and an Event on the
//! Node at each change. No approver for `kubernetes.io/kubelet-serving` runs in a cluster by
//! default, so without this the wait showed only in the daemon's log. Pure mapping here;
//! [`publish`] is the I/O loop.

use k8s_openapi::api::core::v1::{Node, NodeCondition, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::events::EventSink;
use super::reasons::{EventReason, EventType};
use super::registration::{self, NodeIdentity};

/// Where the cluster-signed serving certificate stands, for the Node (a condition and Events):
/// without an approver in the cluster a request waits for an operator, and the kubelet API
/// cannot start until one acts, so the wait must be visible where an operator looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServingCertStatus {
    /// CSR `csr` waits for approval and signing; `serving` = an earlier certificate still
    /// serves (a renewal).
    Pending { csr: String, serving: bool },
    /// A cluster-signed certificate serves: the one CSR `csr` brought, or (`None`) the one
    /// stored by an earlier run.
    Issued { csr: Option<String> },
    /// The cluster refused CSR `csr`; a new one is requested after a backoff.
    Refused {
        csr: String,
        verdict: String,
        reason: String,
        message: String,
        serving: bool,
    },
}

pub const CONDITION: &str = "KubeletServingCertificate";
// The condition's reasons are its Events' reasons: one spelling, in [`EventReason`].
pub const REASON_PENDING: &str = EventReason::CsrPending.as_str();
pub const REASON_ISSUED: &str = EventReason::CertificateIssued.as_str();
pub const REASON_REFUSED: &str = EventReason::CsrRefused.as_str();

/// What a status says: (condition status, reason, message).
fn describe(status: &ServingCertStatus) -> (&'static str, EventReason, String) {
    match status {
        ServingCertStatus::Pending { csr, serving: false } => (
            "False",
            EventReason::CsrPending,
            format!(
                "the kubelet API (logs, exec, port-forward, stats) waits for its serving certificate: CertificateSigningRequest {csr} (signer kubernetes.io/kubelet-serving) is not approved; approve it with `kubectl certificate approve {csr}`"
            ),
        ),
        ServingCertStatus::Pending { csr, serving: true } => (
            "True",
            EventReason::CsrPending,
            format!(
                "the current certificate serves until it expires; its renewal, CertificateSigningRequest {csr}, is not approved: approve it with `kubectl certificate approve {csr}`"
            ),
        ),
        ServingCertStatus::Issued { csr: Some(csr) } => (
            "True",
            EventReason::CertificateIssued,
            format!("the kubelet API serves the certificate the cluster signed for CertificateSigningRequest {csr}"),
        ),
        ServingCertStatus::Issued { csr: None } => (
            "True",
            EventReason::CertificateIssued,
            "the kubelet API serves the cluster-signed certificate stored by an earlier run".to_string(),
        ),
        ServingCertStatus::Refused {
            csr,
            verdict,
            reason,
            message,
            serving,
        } => (
            if *serving { "True" } else { "False" },
            EventReason::CsrRefused,
            format!(
                "CertificateSigningRequest {csr} was {verdict} ({reason}: {message}); a new one is requested after a while — approve that one, or set VK_TLS_CERT/VK_TLS_KEY"
            ),
        ),
    }
}

/// The condition for `status`. The transition time is kept from `previous` while the status
/// does not change.
pub fn condition(status: &ServingCertStatus, now: &Time, previous: Option<&[NodeCondition]>) -> NodeCondition {
    let (state, reason, message) = describe(status);
    let transition = previous
        .and_then(|p| p.iter().find(|c| c.type_ == CONDITION && c.status == state))
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    NodeCondition {
        type_: CONDITION.into(),
        status: state.into(),
        reason: Some(reason.as_str().into()),
        message: Some(message),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(transition),
    }
}

/// The Event for a change to `status`: (warning, reason, note). A reused stored certificate
/// is no news (`None`).
pub fn event(status: &ServingCertStatus) -> Option<(EventType, EventReason, String)> {
    let (_, reason, note) = describe(status);
    match status {
        ServingCertStatus::Issued { csr: None } => None,
        ServingCertStatus::Issued { .. } => Some((EventType::Normal, reason, note)),
        ServingCertStatus::Pending { .. } | ServingCertStatus::Refused { .. } => {
            Some((EventType::Warning, reason, note))
        }
    }
}

/// Until `shutdown`: patches the Node's status (which carries the condition) whenever the
/// certificate's status changes, and records an Event on the Node for the change.
pub async fn publish(
    nodes: Api<Node>,
    identity: NodeIdentity,
    node: ObjectReference,
    mut changes: watch::Receiver<Option<ServingCertStatus>>,
    events: EventSink,
    shutdown: CancellationToken,
) {
    // What was there before the node registered is published too.
    changes.mark_changed();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                let Some(status) = changes.borrow_and_update().clone() else { continue };
                // The stored conditions, so their transition times survive this write.
                let previous = nodes.get(&identity.config.node_name).await.ok();
                if let Err(error) = registration::patch_status(&nodes, &identity, previous.as_ref()).await {
                    tracing::warn!(%error, "publishing the serving certificate's status on the Node failed; the next status refresh retries");
                }
                if let Some((type_, reason, note)) = event(&status) {
                    events.record_on(node.clone(), type_, reason, "ServingCertificate", note);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn a_pending_request_names_itself_and_the_command_and_clears_when_issued() {
        let t0 = Time(Timestamp::UNIX_EPOCH);
        let t1 = Time(Timestamp::from_second(60).unwrap());
        let pending = ServingCertStatus::Pending {
            csr: "csr-abc12".into(),
            serving: false,
        };
        let c = condition(&pending, &t0, None);
        assert_eq!(
            (c.status.as_str(), c.reason.as_deref()),
            ("False", Some(REASON_PENDING))
        );
        assert!(
            c.message
                .as_deref()
                .unwrap()
                .contains("`kubectl certificate approve csr-abc12`")
        );
        let (type_, reason, note) = event(&pending).unwrap();
        assert!(
            type_ == EventType::Warning
                && reason.as_str() == "CSRPending"
                && note.contains("kubectl certificate approve csr-abc12")
        );

        // The same status later keeps its transition time; the issued one starts a new one.
        let again = condition(&pending, &t1, Some(std::slice::from_ref(&c)));
        assert_eq!(again.last_transition_time, Some(t0.clone()));
        let issued = ServingCertStatus::Issued {
            csr: Some("csr-abc12".into()),
        };
        let done = condition(&issued, &t1, Some(&[again]));
        assert_eq!(
            (done.status.as_str(), done.reason.as_deref()),
            ("True", Some(REASON_ISSUED))
        );
        assert_eq!(done.last_transition_time, Some(t1));
        assert_eq!(
            event(&issued).map(|e| (e.0, e.1.as_str())),
            Some((EventType::Normal, "CertificateIssued"))
        );
        assert_eq!(event(&ServingCertStatus::Issued { csr: None }), None);
    }

    #[test]
    fn a_pending_renewal_is_no_outage() {
        let c = condition(
            &ServingCertStatus::Pending {
                csr: "csr-r".into(),
                serving: true,
            },
            &Time(Timestamp::UNIX_EPOCH),
            None,
        );
        assert_eq!(c.status, "True", "the current certificate still serves");
        assert!(c.message.unwrap().contains("kubectl certificate approve csr-r"));
    }
}
