//! The node's `Hostname` address, which an apiserver with its default address preference
//! (`Hostname` first) dials to reach the kubelet API: by default the machine's host name, as the
//! kubelet reports it, not the node name (which rarely resolves).

use std::net::ToSocketAddrs;

use k8s_openapi::api::core::v1::Node as KubeNode;

use super::*;

/// The machine's host name as the kernel has it, lower-cased (what the kubelet reports).
fn machine_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("the kernel's host name")
        .trim()
        .to_lowercase()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_hostname_address_is_the_machines_host_name_so_kubectl_logs_reaches_the_node() {
    // No VK_NODE_HOSTNAME (empty counts as unset): the daemon picks the address itself. The
    // node name (unique, e.g. `hostaddr-…`) resolves nowhere.
    let Some(node) = node_with_pod_on("hostaddr", |_| {}, &[("VK_NODE_HOSTNAME", "")]).await else {
        return;
    };
    let hostname = machine_hostname();
    assert!(
        (node.machine.node.as_str(), 0).to_socket_addrs().is_err(),
        "the node name {} must not resolve for this test to mean anything",
        node.machine.node
    );

    // The test daemons serve the kubelet API on loopback only: the apiserver reaches it through
    // the host name where that resolves to loopback (as /etc/hosts has it on most machines).
    let resolved: Vec<std::net::IpAddr> = (hostname.as_str(), 0)
        .to_socket_addrs()
        .map(|a| a.map(|a| a.ip()).collect())
        .unwrap_or_default();
    if resolved.first().is_some_and(|ip| ip.is_loopback()) {
        node.machine
            .sim
            .append_vm_log("vm-web", "reached by host name")
            .unwrap();
        let out = node.kubectl(&["logs", "-n", &node.ns, "web-0", "--tail=1"]);
        assert!(
            out.status.success(),
            "kubectl logs through the apiserver, which dials the node's Hostname address: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("reached by host name"));
    } else {
        eprintln!(
            "the host name {hostname:?} resolves to {resolved:?}, not loopback: kubectl logs through it is not tried here"
        );
    }

    let status = Api::<KubeNode>::all(node.admin.clone())
        .get(&node.machine.node)
        .await
        .unwrap()
        .status
        .unwrap();
    let hostnames: Vec<String> = status
        .addresses
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "Hostname")
        .map(|a| a.address)
        .collect();
    assert_eq!(hostnames, [hostname], "the node's Hostname address");
}
