//! A macOS guest through the real server: `vk-cocoon run` under the
//! `deploy/rbac.yaml` identity drives the cocoon-macos simulator (a real "qemu" process, its VNC
//! display and the guest's sshd on loopback). The pod goes Running → waiting for its lease →
//! Ready on the guest's SSH banner; `kubectl annotate` asking for hibernate is refused with an
//! Event and stops nothing; `kubectl delete` removes the VM and frees its VNC port for the next
//! pod. (Real server: the id / ip / vnc-port writes go through real RBAC and the pod status
//! strategy; the delete is the apiserver's graceful one.)

use std::path::Path;

use crate::daemon::*;
use crate::kube_support;
use crate::runtime_support;

const OS: &str = "cocoonset.cocoonstack.io/os";
const IP: &str = "vm.cocoonstack.io/ip";
const VNC_PORT: &str = "vm.cocoonstack.io/vnc-port";
const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";
const TAHOE: &str = "ghcr.io/cocoonstack/cocoon-macos/tahoe:26";

/// cocoon-net's lease file handing `mac` the address `ip` (written whole, then renamed, as
/// cocoon-net does).
fn write_lease(leases: &Path, mac: &str, ip: &str) {
    let tmp = leases.with_extension("tmp");
    std::fs::write(
        &tmp,
        format!(r#"[{{"mac":"{mac}","ip":"{ip}","expiry":"2999-01-01T00:00:00Z"}}]"#),
    )
    .unwrap();
    std::fs::rename(&tmp, leases).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_macos_pod_comes_up_refuses_hibernate_and_is_deleted_through_kubectl() {
    let Some(cluster) = kube_support::shared().await else {
        return;
    };
    let admin = cluster.admin_client().await;
    let ns = cluster.namespace("macos").await;
    let mut machine = Machine::new("vk-macos");
    let mac = machine.sim.macos().unwrap();
    let (mac_key, mac_dir) = mac.macos_env();
    machine.daemon_env.extend([
        (
            "VK_COCOON_MACOS_BIN".to_string(),
            runtime_support::macos_sim_bin().display().to_string(),
        ),
        (mac_key, mac_dir),
        ("COCOON_MACOS_VNC_PASSWORD".to_string(), "s3cret".to_string()),
        ("VK_COCOON_MACOS_VNC_PORTS".to_string(), "5900-5900".to_string()),
    ]);
    let mut daemon = machine.start_daemon(cluster);
    machine.wait_registered(cluster).await;
    let node = machine.node.clone();
    let mac_pod = |name: &str, vm: &str| managed_pod(&ns, &node, name, vm, &[(OS, "macos"), (IMAGE, TAHOE)]);

    create_pod(&admin, &mac_pod("mac-0", "vm-mac")).await;
    let waiting = wait_pod(
        &admin,
        &ns,
        "mac-0",
        60,
        "Running, waiting for the guest's lease",
        |p| {
            p.and_then(ready_condition)
                .is_some_and(|(s, m)| s == "False" && m.contains("waiting for guest dhcp lease"))
        },
    )
    .await
    .unwrap();
    assert_eq!(
        waiting.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
    assert_eq!(annotation(&waiting, VM_ID), Some("qemu-vm-mac"));
    assert_eq!(annotation(&waiting, VNC_PORT), Some("5900"));
    assert_eq!(annotation(&waiting, IP), None, "no lease yet");
    assert!(mac.macos_running("vm-mac").unwrap());
    assert!(machine.vms().await.is_empty(), "cocoon itself booted nothing");

    let (guest_mac, guest_ip) = mac.macos_guest("vm-mac").unwrap().unwrap();
    write_lease(&machine.leases, &guest_mac, &guest_ip);
    let up = wait_up(&admin, &ns, "mac-0").await;
    assert_eq!(
        up.status.as_ref().and_then(|s| s.pod_ip.as_deref()),
        Some(guest_ip.as_str())
    );
    wait_pod(&admin, &ns, "mac-0", 30, "the ip annotation follows the lease", |p| {
        p.is_some_and(|p| annotation(p, IP) == Some(guest_ip.as_str()))
    })
    .await;

    // Only one VNC port: a second guest waits for it, with the reason on the pod.
    create_pod(&admin, &mac_pod("mac-1", "vm-mac-1")).await;
    eventually(60, "a VNC-ports-exhausted Event on mac-1", || {
        let admin = admin.clone();
        let ns = ns.clone();
        async move {
            events_about(&admin, &ns, "mac-1")
                .await
                .iter()
                .any(|(_, reason, _)| reason == "MacOSVNCPortsExhausted")
        }
    })
    .await;
    assert!(mac.macos_vm("vm-mac-1").unwrap().is_none(), "no VM without a port");

    cluster
        .kubectl_checked(&["annotate", "pod", "mac-0", "-n", &ns, &format!("{HIBERNATE}=true")])
        .unwrap();
    eventually(60, "a HibernateUnsupported Event on mac-0", || {
        let admin = admin.clone();
        let ns = ns.clone();
        async move {
            events_about(&admin, &ns, "mac-0")
                .await
                .iter()
                .any(|(kind, reason, note)| {
                    kind == "Warning" && reason == "HibernateUnsupported" && note.contains("does not support hibernate")
                })
        }
    })
    .await;
    assert!(mac.macos_running("vm-mac").unwrap(), "the refusal stopped nothing");

    // As an operator deletes: kubectl waits until the object is gone.
    cluster
        .kubectl_checked(&["delete", "pod", "mac-0", "-n", &ns, "--timeout=120s"])
        .unwrap_or_else(|e| panic!("{e}\n{}", daemon.log()));
    assert!(mac.macos_vm("vm-mac").unwrap().is_none(), "vm rm removed the VM");
    let removed = mac.calls().unwrap();
    assert_eq!(
        removed
            .iter()
            .filter(|c| c.verb == "vm rm" && c.argv.iter().any(|a| a == "vm-mac"))
            .count(),
        1
    );
    // The freed port goes to the waiting guest.
    let second = wait_up_after_lease(&admin, &ns, &machine, &mac, "mac-1", "vm-mac-1").await;
    assert_eq!(annotation(&second, VNC_PORT), Some("5900"));

    assert!(daemon.probe_refusals().is_empty(), "{:?}", daemon.probe_refusals());
    // The VNC password went to cocoon-macos in every launch, and nowhere else.
    assert!(
        mac.calls()
            .unwrap()
            .iter()
            .any(|c| c.verb == "vm run" && c.argv.iter().any(|a| a == "s3cret"))
    );
    assert!(
        !daemon.log().contains("s3cret"),
        "the VNC password is in the daemon's log"
    );
    for (_, _, note) in events_about(&admin, &ns, "mac-0").await {
        assert!(!note.contains("s3cret"), "the VNC password is in an Event: {note}");
    }
    daemon.terminate().await;
}

/// Waits until `vm` runs, hands its guest a lease, and waits until the pod is up.
async fn wait_up_after_lease(
    admin: &kube::Client,
    ns: &str,
    machine: &Machine,
    mac: &cocoon_sim::Sim,
    pod: &str,
    vm: &str,
) -> k8s_openapi::api::core::v1::Pod {
    eventually(90, "the VM runs", || async { mac.macos_running(vm).unwrap() }).await;
    let (guest_mac, guest_ip) = mac.macos_guest(vm).unwrap().unwrap();
    write_lease(&machine.leases, &guest_mac, &guest_ip);
    wait_up(admin, ns, pod).await
}
