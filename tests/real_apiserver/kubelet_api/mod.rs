//! The kubelet API through the real apiserver: `kubectl logs` (tail, since, timestamps, and a
//! follow that receives a line written after it started), `/stats/summary` and
//! `/metrics/resource` via the nodes proxy, and the refusals (anonymous → 401, a token without
//! the right → 403, bad queries → 4xx). The serving certificate comes from a CSR that
//! `kube_support::signer` approves as a cluster operator would and the controller-manager signs
//! with the cluster CA.

mod auth;
mod certificate;
mod csr_pending;
mod hostname;
mod stats;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::Api;
use serde::Deserialize;

use crate::daemon::*;
use crate::kube_support;
use crate::kubelet_node::*;

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_logs_tails_filters_timestamps_and_follows() {
    let Some(node) = node_with_pod("logs").await else {
        return;
    };
    for i in 0..5 {
        node.machine
            .sim
            .append_vm_log("vm-web", &format!("guest line {i}"))
            .unwrap();
    }
    let all = node.logs(&[]);
    assert!(all.contains("VM vm-web booted: running"), "{all}");
    assert!(all.contains("guest line 4"), "{all}");

    let tail = node.logs(&["--tail=2"]);
    assert_eq!(tail.lines().count(), 2, "{tail}");
    assert!(tail.lines().last().unwrap().ends_with("guest line 4"), "{tail}");

    // Timestamps: RFC 3339, from each line's own (cloud-hypervisor elapsed-time) prefix.
    let stamped = node.logs(&["--timestamps", "--tail=1"]);
    let (stamp, line) = stamped.trim_end().split_once(' ').unwrap();
    let t = chrono::DateTime::parse_from_rfc3339(stamp).unwrap_or_else(|e| panic!("{stamp}: {e}"));
    let age = chrono::Utc::now().signed_duration_since(t);
    assert!(age.num_seconds().abs() < 60, "a fresh line's time: {stamped}");
    assert!(line.ends_with("guest line 4"), "{stamped}");

    // --since: the boot lines are older than the lines written from now on.
    let vm_age_start = std::time::Instant::now();
    eventually(30, "the VM is 3 s old", || async {
        vm_age_start.elapsed() > Duration::from_secs(3)
    })
    .await;
    node.machine.sim.append_vm_log("vm-web", "fresh line").unwrap();
    let recent = node.logs(&["--since=2s"]);
    assert!(recent.contains("fresh line"), "{recent}");
    assert!(!recent.contains("booted"), "older lines are left out: {recent}");

    // -f: a line written after kubectl started arrives; kubectl leaving ends the stream.
    let mut follow = Command::new("kubectl")
        .args(["--kubeconfig"])
        .arg(node.cluster.admin_kubeconfig_path())
        .args(["logs", "-f", "--tail=1", "-n", &node.ns, "web-0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = follow.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(30)).expect("the tail line");
    assert!(first.ends_with("fresh line"), "{first}");
    node.machine
        .sim
        .append_vm_log("vm-web", "written while following")
        .unwrap();
    let next = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the new line, streamed");
    assert!(next.ends_with("written while following"), "{next}");
    assert_eq!(
        node.metric("cocoon_vk_vm_kubelet_api_log_follows")
            .or(node.metric("cocoon_vk_kubelet_api_log_follows")),
        Some(1.0)
    );
    follow.kill().unwrap();
    follow.wait().unwrap();
    eventually(30, "the follow ends when the client leaves", || async {
        node.metric("cocoon_vk_kubelet_api_log_follows") == Some(0.0)
    })
    .await;

    // A follow ends when the VM goes.
    let mut follow = Command::new("kubectl")
        .args(["--kubeconfig"])
        .arg(node.cluster.admin_kubeconfig_path())
        .args(["logs", "-f", "--tail=1", "-n", &node.ns, "web-0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually(30, "the second follow is served", || async {
        node.metric("cocoon_vk_kubelet_api_log_follows") == Some(1.0)
    })
    .await;
    node.machine.sim.flip_vm("vm-web", cocoon_sim::Flip::Deleted).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = follow.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kubectl logs -f still running after the VM went"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "the stream ended cleanly: {status:?}");
}
