//! Node registration and status refresh (I/O): create the Node or merge our fields into the
//! existing one, then patch its status; refresh the status (heartbeat) periodically.

use super::config::KubeletConfig;
use super::node::{NodeResources, build_node, merge_into_existing, node_status};
use crate::retry::Schedule;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What the node publishes about itself.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    pub config: KubeletConfig,
    pub node_ip: IpAddr,
    pub resources: NodeResources,
    /// The node's policies, published as annotations and the `PolicyReady` condition.
    pub policies: Option<Arc<crate::policy::status::StatusBoard>>,
    /// The kubelet API's serving certificate, published as `KubeletServingCertificate`.
    pub serving_cert: Option<super::ServingCertWatch>,
}

/// Our labels/taint/providerID on the Node: create it, or replace it with our fields merged in
/// (retrying on a resourceVersion conflict).
async fn ensure_object(nodes: &Api<Node>, id: &NodeIdentity) -> Result<Node, kube::Error> {
    let name = &id.config.node_name;
    for _ in 0..5 {
        match nodes.get_opt(name).await? {
            None => {
                let node = build_node(&id.config, id.node_ip, &id.resources, &Time(Timestamp::now()));
                match nodes.create(&PostParams::default(), &node).await {
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    other => return other,
                }
            }
            Some(existing) => match merge_into_existing(&existing, &id.config) {
                None => return Ok(existing),
                Some(merged) => match nodes.replace(name, &PostParams::default(), &merged).await {
                    Err(kube::Error::Api(s)) if s.code == 409 => continue,
                    other => return other,
                },
            },
        }
    }
    Err(kube::Error::Service(
        format!("node {name}: gave up after 5 write conflicts; another writer keeps changing it").into(),
    ))
}

/// Patches the node's status subresource (capacity, allocatable, conditions, addresses,
/// daemonEndpoints, nodeInfo) — a JSON merge patch, so our lists replace the stored ones.
pub async fn patch_status(nodes: &Api<Node>, id: &NodeIdentity, previous: Option<&Node>) -> Result<Node, kube::Error> {
    let now = Time(Timestamp::now());
    let previous_status = previous.and_then(|n| n.status.as_ref());
    let mut status = node_status(&id.config, id.node_ip, &id.resources, &now, previous_status);
    let mut body = json!({});
    if let Some(board) = &id.policies {
        let policies = board.current();
        let previous_conditions = previous_status.and_then(|s| s.conditions.as_deref());
        let condition = super::policy_status::condition(&policies, &now, previous_conditions);
        status.conditions.get_or_insert_with(Vec::new).push(condition);
        // Metadata in a status write is kept by the apiserver: one request carries both.
        body["metadata"] = json!({"annotations": super::policy_status::annotations(&policies)});
    }
    let serving_cert = id.serving_cert.as_ref().and_then(|w| w.borrow().clone());
    if let Some(cert) = serving_cert {
        let previous_conditions = previous_status.and_then(|s| s.conditions.as_deref());
        let condition = super::serving_cert::condition(&cert, &now, previous_conditions);
        status.conditions.get_or_insert_with(Vec::new).push(condition);
    }
    body["status"] = serde_json::to_value(&status).expect("JSON of a NodeStatus");
    nodes
        .patch_status(&id.config.node_name, &PatchParams::default(), &Patch::Merge(body))
        .await
}

/// Registers the node once: object, then status.
pub async fn register(nodes: &Api<Node>, id: &NodeIdentity) -> Result<Node, kube::Error> {
    let node = ensure_object(nodes, id).await?;
    patch_status(nodes, id, Some(&node)).await
}

/// Registers, retrying with backoff until it succeeds or `shutdown` fires (then `None`).
pub async fn register_with_retry(
    nodes: &Api<Node>,
    id: &NodeIdentity,
    base: Duration,
    max: Duration,
    shutdown: &CancellationToken,
) -> Option<Node> {
    let mut failures = 0;
    let mut delays = Schedule::backoff(base, max).delays();
    loop {
        match register(nodes, id).await {
            Ok(node) => {
                tracing::info!(node = %id.config.node_name, "node registered");
                return Some(node);
            }
            Err(error) => {
                failures += 1;
                let delay = delays.next().unwrap_or(max);
                tracing::warn!(node = %id.config.node_name, %error, attempt = failures, retry_in = ?delay, "registering the node failed");
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Every `interval`: re-assert our labels/taint (someone may have removed them) and refresh the
/// status heartbeat.
pub async fn run_status_loop(nodes: Api<Node>, id: NodeIdentity, interval: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        match register(&nodes, &id).await {
            Ok(_) => tracing::debug!(node = %id.config.node_name, "node status refreshed"),
            Err(error) => {
                tracing::warn!(node = %id.config.node_name, %error, "refreshing the node status failed; retrying next interval")
            }
        }
    }
}
