//! Where a peer listens: the `InternalIP` of its Node object (no InternalIP: the wake skips the
//! peer).

use std::net::IpAddr;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;

/// Looks up a node's InternalIP.
#[async_trait]
pub trait NodeAddresses: Send + Sync {
    /// `Ok(None)` when the node does not exist or has no parseable InternalIP.
    async fn internal_ip(&self, node: &str) -> Result<Option<IpAddr>, String>;
}

/// The Node objects in the API (`get nodes`, granted by deploy/rbac.yaml).
pub struct KubeNodes(kube::Api<Node>);

impl KubeNodes {
    pub fn new(client: kube::Client) -> Self {
        Self(kube::Api::all(client))
    }
}

#[async_trait]
impl NodeAddresses for KubeNodes {
    async fn internal_ip(&self, node: &str) -> Result<Option<IpAddr>, String> {
        let found = self
            .0
            .get_opt(node)
            .await
            .map_err(|e| format!("get node {node}: {e}"))?;
        Ok(found.as_ref().and_then(internal_ip))
    }
}

/// The first parseable `InternalIP` address of `node`.
pub fn internal_ip(node: &Node) -> Option<IpAddr> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};

    use super::*;

    #[test]
    fn the_first_parseable_internal_ip_is_the_peer_address() {
        let node = |addrs: &[(&str, &str)]| Node {
            status: Some(NodeStatus {
                addresses: Some(
                    addrs
                        .iter()
                        .map(|(t, a)| NodeAddress {
                            type_: t.to_string(),
                            address: a.to_string(),
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            internal_ip(&node(&[
                ("Hostname", "a"),
                ("InternalIP", "nope"),
                ("InternalIP", "127.0.0.9")
            ])),
            Some("127.0.0.9".parse().unwrap())
        );
        assert_eq!(internal_ip(&node(&[("Hostname", "127.0.0.1")])), None);
        assert_eq!(internal_ip(&Node::default()), None);
    }
}
