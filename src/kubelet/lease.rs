//! The node heartbeat Lease (`coordination.k8s.io/v1`, namespace `kube-node-lease`), renewed
//! every `Timings::lease_renew` with `Timings::lease_duration` — virtual-kubelet's lease controller.

use super::config::Timings;
use crate::retry::Schedule;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// The Lease spec and ownership vk-cocoon wants, applied onto `base` (a fresh or the current Lease).
pub fn desired_lease(base: Option<Lease>, node: &Node, duration: Duration, now: Timestamp) -> Lease {
    let name = node.name_any();
    let mut lease = base.unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(LEASE_NAMESPACE.into()),
            ..Default::default()
        },
        spec: None,
    });
    if let Some(uid) = node.uid() {
        // Owned by the node, so deleting the node collects its lease.
        lease.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: name.clone(),
            uid,
            ..Default::default()
        }]);
    }
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(name);
    spec.lease_duration_seconds = Some(duration.as_secs().max(1) as i32);
    spec.renew_time = Some(MicroTime(now));
    lease
}

/// Creates or renews the lease once. A conflict (someone else wrote it) is retried immediately,
/// up to 5 times, as virtual-kubelet does.
pub async fn renew_once(leases: &Api<Lease>, node: &Node, duration: Duration) -> Result<Lease, kube::Error> {
    let name = node.name_any();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = match leases.get_opt(&name).await? {
            None => {
                leases
                    .create(
                        &PostParams::default(),
                        &desired_lease(None, node, duration, Timestamp::now()),
                    )
                    .await
            }
            Some(current) => {
                let desired = desired_lease(Some(current), node, duration, Timestamp::now());
                leases.replace(&name, &PostParams::default(), &desired).await
            }
        };
        match result {
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < 5 => continue,
            other => return other,
        }
    }
}

/// Renews the lease until `shutdown`. Failures back off 100 ms doubling to 7 s, then the regular
/// cadence resumes.
pub async fn run(client: Client, node: Node, timings: Timings, shutdown: CancellationToken) {
    let leases: Api<Lease> = Api::namespaced(client, LEASE_NAMESPACE);
    let mut failures = 0u32;
    let schedule = Schedule::backoff(Duration::from_millis(100), Duration::from_secs(7));
    let mut delays = schedule.delays();
    loop {
        let wait = match renew_once(&leases, &node, timings.lease_duration).await {
            Ok(lease) => {
                if failures > 0 {
                    tracing::info!(node = %node.name_any(), "node lease renewed again after failures");
                }
                failures = 0;
                delays.reset();
                tracing::debug!(node = %node.name_any(), rv = ?lease.resource_version(), "node lease renewed");
                timings.lease_renew
            }
            Err(error) => {
                failures += 1;
                let delay = delays.next().unwrap_or(schedule.max()).min(timings.lease_renew);
                tracing::warn!(node = %node.name_any(), %error, attempt = failures, retry_in = ?delay, "renewing the node lease failed");
                delay
            }
        };
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_fields() {
        let mut node = Node::default();
        node.metadata.name = Some("vk-1".into());
        node.metadata.uid = Some("node-uid".into());
        let t = Timestamp::from_second(1000).unwrap();
        let l = desired_lease(None, &node, Duration::from_secs(40), t);
        assert_eq!(l.metadata.name.as_deref(), Some("vk-1"));
        assert_eq!(l.metadata.namespace.as_deref(), Some(LEASE_NAMESPACE));
        let spec = l.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("vk-1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert_eq!(spec.renew_time, Some(MicroTime(t)));
        assert_eq!(l.metadata.owner_references.as_ref().unwrap()[0].uid, "node-uid");
        // Renewal keeps the stored metadata (resourceVersion) and moves renewTime.
        let mut stored = l.clone();
        stored.metadata.resource_version = Some("7".into());
        let t2 = Timestamp::from_second(1010).unwrap();
        let renewed = desired_lease(Some(stored), &node, Duration::from_secs(40), t2);
        assert_eq!(renewed.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(renewed.spec.unwrap().renew_time, Some(MicroTime(t2)));
    }
}
