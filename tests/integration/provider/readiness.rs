//! Readiness end to end (fake apiserver + cocoon-sim + the daemon's real probes, the guests'
//! addresses on loopback): Ready only when the probe and the lifecycle agree, flips follow the
//! guest, the guest fixup runs over `vm exec` with retries and leaves a decodable hint when it is
//! exhausted, the lease wait gates Ready, and a rebound lease moves the pod IP.

use crate::provider_support;

use std::time::Duration;

use base64::Engine as _;
use cocoon_sim::ExecRule;
use provider_support::*;

const IMAGE: &str = "cocoonset.cocoonstack.io/image";
const NETWORK: &str = "cocoonset.cocoonstack.io/network";
const PROBE_PORT: &str = "vm.cocoonstack.io/probe-port";
const POST_CLONE_STATE: &str = "vm.cocoonstack.io/post-clone-state";

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts answering TCP on the guest's own (loopback) address, as the guest's service would.
async fn listen_as_guest(env: &Env, vm: &str, port: u16) -> tokio::net::TcpListener {
    let vm = vm_named(env, vm).await.expect("the guest's VM");
    let ip = vm.primary_ip().expect("the simulator gives a static address");
    tokio::net::TcpListener::bind((ip, port)).await.unwrap()
}

fn ready_is(env: &Env, name: &str, status: &str, message_has: &str) -> bool {
    ready_condition(env, name).is_some_and(|(s, m)| s == status && m.contains(message_has))
}

/// Lifecycle: L39, L40.
/// Checklist rows: probes_test/StartTriggersOnUpdateOnReadinessChange
#[tokio::test(flavor = "multi_thread")]
async fn ready_needs_both_the_probe_and_the_lifecycle_and_flips_follow_the_guest() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let port = free_port();
    // Hold the guest fixup, so the lifecycle is still `creating` for a while after the VM is up.
    env.sim.delay("vm exec", Some(1), 2_500).unwrap();
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("agent-0", "vm-tcp", &[(IMAGE, "base"), (PROBE_PORT, &port.to_string())]),
    )
    .await;

    let probe_msg = format!("tcp probe {port}");
    eventually(20, "not ready while creating, with the probe's verdict", || {
        ready_is(&env, "agent-0", "False", "lifecycle creating; probe: ")
    })
    .await;
    eventually(20, "lifecycle ready after the fixup", || {
        lifecycle(&env, "agent-0").as_deref() == Some("ready")
    })
    .await;
    eventually(20, "still not ready: nothing answers on the probe port", || {
        ready_is(&env, "agent-0", "False", &probe_msg)
    })
    .await;
    assert_eq!(phase(&env, "agent-0").as_deref(), Some("Running"));

    // The guest starts answering: the probe flips and the status follows.
    let listener = listen_as_guest(&env, "vm-tcp", port).await;
    eventually(20, "ready once the guest answers", || {
        ready_is(&env, "agent-0", "True", "tcp ok")
    })
    .await;

    // It stops answering: three failures in a row flip it back; the lifecycle stays ready.
    drop(listener);
    eventually(20, "not ready once the guest stops answering", || {
        ready_is(&env, "agent-0", "False", &probe_msg)
    })
    .await;
    assert_eq!(
        lifecycle(&env, "agent-0").as_deref(),
        Some("ready"),
        "a probe flip is not a lifecycle change"
    );
    let _listener = listen_as_guest(&env, "vm-tcp", port).await;
    eventually(20, "ready again", || ready_is(&env, "agent-0", "True", "tcp ok")).await;
    d.kill().await;
}

/// Lifecycle: L34.
#[tokio::test(flavor = "multi_thread")]
async fn a_clone_with_a_static_nic_gets_its_network_fixed_over_vm_exec_before_ready() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(&env, &managed("agent-0", "vm-fix", &[(IMAGE, "base")])).await;
    eventually(30, "ready", || {
        ready(&env, "agent-0") && lifecycle(&env, "agent-0").as_deref() == Some("ready")
    })
    .await;

    let vm = vm_named(&env, "vm-fix").await.unwrap();
    let nic = vm.network_configs[0].clone();
    let net = nic.network.clone().expect("the simulator gives a static address");
    let execs = env.sim.exec_log().unwrap();
    assert_eq!(execs.len(), 1, "one attempt was enough: {execs:?}");
    assert_eq!(execs[0].vm_id, vm.id);
    assert_eq!(&execs[0].argv[..2], &["sh".to_string(), "-c".to_string()]);
    let script = &execs[0].argv[2];
    for line in [
        "echo 3 > /proc/sys/vm/drop_caches".to_string(),
        "echo vm-fix > /etc/hostname".to_string(),
        "rm -f /etc/systemd/network/10-*.network".to_string(),
        format!("10-{}.network", nic.mac.replace(':', "")),
        format!("Address={}/{}", net.ip, net.prefix),
        format!("Gateway={}", net.gateway),
        "systemctl restart systemd-networkd".to_string(),
    ] {
        assert!(script.contains(&line), "the fixup script has {line:?}:\n{script}");
    }
    assert!(
        !script.contains("ip link set"),
        "a cloud-hypervisor guest keeps its MACs"
    );
    assert_eq!(annotation(&env, "agent-0", POST_CLONE_STATE).as_deref(), Some("done"));
    eventually(10, "PostCloneSucceeded kind=linux_static attempts=1", || {
        events(&env, "agent-0")
            .iter()
            .any(|(r, n)| r == "PostCloneSucceeded" && n == "kind=linux_static attempts=1")
    })
    .await;
    d.kill().await;
}

/// Lifecycle: L34.
#[tokio::test(flavor = "multi_thread")]
async fn a_failing_fixup_is_retried_until_the_guest_agent_answers() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    env.sim
        .on_exec(ExecRule {
            vm: Some("vm-retry".into()),
            times: Some(2),
            exit_code: 1,
            stderr: "cocoon-agent not ready\n".into(),
            ..Default::default()
        })
        .unwrap();
    let d = start(&env, Options::default());
    create(&env, &managed("agent-0", "vm-retry", &[(IMAGE, "base")])).await;
    eventually(30, "ready", || ready(&env, "agent-0")).await;
    assert_eq!(env.sim.exec_log().unwrap().len(), 3);
    eventually(10, "one Warning per failed attempt", || {
        event_count(&env, "agent-0", "PostCloneExecAttemptFailed") == 2
    })
    .await;
    let failures: Vec<String> = events(&env, "agent-0")
        .into_iter()
        .filter(|(r, _)| r == "PostCloneExecAttemptFailed")
        .map(|(_, n)| n)
        .collect();
    assert!(
        failures
            .iter()
            .any(|n| n.starts_with("attempt 1: exit 1: cocoon-agent not ready")),
        "{failures:?}"
    );
    eventually(10, "PostCloneSucceeded after 3 attempts", || {
        events(&env, "agent-0")
            .iter()
            .any(|(r, n)| r == "PostCloneSucceeded" && n == "kind=linux_static attempts=3")
    })
    .await;
    d.kill().await;
}

/// Lifecycle: L35.
#[tokio::test(flavor = "multi_thread")]
async fn an_exhausted_fixup_leaves_the_pod_running_not_ready_with_a_decodable_hint() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    env.sim
        .on_exec(ExecRule {
            vm: Some("vm-broken".into()),
            exit_code: 7,
            stderr: "systemctl: not found\n".into(),
            ..Default::default()
        })
        .unwrap();
    let d = start(&env, Options::default());
    create(&env, &managed("agent-0", "vm-broken", &[(IMAGE, "base")])).await;
    eventually(30, "lifecycle failed", || {
        lifecycle(&env, "agent-0").as_deref() == Some("failed")
    })
    .await;

    let execs = env.sim.exec_log().unwrap();
    assert!(execs.len() >= 2, "retried within the budget: {}", execs.len());
    let hint = annotation(&env, "agent-0", "vm.cocoonstack.io/post-clone-hint").expect("hint written");
    let decoded = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(hint).unwrap()).unwrap();
    assert_eq!(decoded, execs[0].argv[2], "the hint is exactly the script that was run");
    let errors = annotation(&env, "agent-0", "vm.cocoonstack.io/post-clone-errors").unwrap();
    assert!(
        errors.starts_with("attempt 1: exit 7: systemctl: not found"),
        "{errors}"
    );
    assert_eq!(annotation(&env, "agent-0", POST_CLONE_STATE).as_deref(), Some("failed"));
    eventually(10, "PostCloneExecExhausted event", || {
        has_event(&env, "agent-0", "PostCloneExecExhausted")
    })
    .await;
    assert!(
        lifecycle_message(&env, "agent-0").contains("vm.cocoonstack.io/post-clone-hint"),
        "{}",
        lifecycle_message(&env, "agent-0")
    );
    assert_eq!(
        phase(&env, "agent-0").as_deref(),
        Some("Running"),
        "decision 1: Running, not Ready"
    );
    eventually(10, "Ready=False with the failure", || {
        ready_is(&env, "agent-0", "False", "guest fixup")
    })
    .await;
    // The VM is kept for manual repair.
    assert!(vm_named(&env, "vm-broken").await.is_some());
    let attempts = execs.len();
    // An observation window, not synchronisation: a retry would come within one fixup interval.
    tokio::time::sleep(fast_timings().fixup_interval * 4).await;
    assert_eq!(
        env.sim.exec_log().unwrap().len(),
        attempts,
        "an exhausted fixup is not retried"
    );
    d.kill().await;
}

/// Checklist rows: create_test/GetPodStatusRefreshesIPFromLease,
/// update_test/WaitForFreshIPNoRenewForLinux
#[tokio::test(flavor = "multi_thread")]
async fn a_dhcp_guest_is_ready_only_with_its_lease_and_a_rebound_lease_moves_the_pod_ip() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    // The lease is handed out only after the checks below: a lease wait far longer than they
    // can take on a loaded machine (the fast 3 s one could run out first when a sim call is slow).
    let d = start(
        &env,
        Options {
            timings: vk_cocoon::provider::Timings {
                ip_wait: Duration::from_secs(60),
                ..fast_timings()
            },
            ..Default::default()
        },
    );
    create(
        &env,
        &managed("dhcp-0", "vm-dhcp", &[(IMAGE, "base"), (NETWORK, "dhcp-net")]),
    )
    .await;
    eventually(20, "vm up", || {
        annotation(&env, "dhcp-0", "vm.cocoonstack.io/id").is_some()
    })
    .await;
    // An observation window (well inside the lease wait): the wait polls every ip_poll.
    tokio::time::sleep(fast_timings().ip_poll * 10).await;
    assert_eq!(
        lifecycle(&env, "dhcp-0").as_deref(),
        Some("creating"),
        "no lease yet: the lease wait holds Ready"
    );
    assert!(
        env.sim.exec_log().unwrap().is_empty(),
        "a cloud-hypervisor guest with DHCP NICs needs no fixup"
    );

    let vm = vm_named(&env, "vm-dhcp").await.unwrap();
    let mac = vm.primary_mac().unwrap().to_string();
    write_leases(&env, &[(&mac, "127.0.0.21")]);
    eventually(20, "ready with the leased ip", || {
        ready(&env, "dhcp-0") && pod_ip(&env, "dhcp-0").as_deref() == Some("127.0.0.21")
    })
    .await;
    assert_eq!(
        annotation(&env, "dhcp-0", "vm.cocoonstack.io/ip").as_deref(),
        Some("127.0.0.21")
    );

    // cocoon-net rebinds the MAC: the status reconciler moves the annotation and the pod IP.
    write_leases(&env, &[(&mac, "127.0.0.22")]);
    eventually(20, "ip annotation follows the lease", || {
        annotation(&env, "dhcp-0", "vm.cocoonstack.io/ip").as_deref() == Some("127.0.0.22")
    })
    .await;
    eventually(20, "pod ip follows the lease", || {
        pod_ip(&env, "dhcp-0").as_deref() == Some("127.0.0.22")
    })
    .await;
    assert!(ready(&env, "dhcp-0"));
    d.kill().await;
}

/// Checklist rows: update_test/FinalizeDropNICWakeMarksFailedOnTimeout
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_that_never_comes_fails_the_boot_with_the_wait_named() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed("dhcp-0", "vm-nolease", &[(IMAGE, "base"), (NETWORK, "dhcp-net")]),
    )
    .await;
    wait_failed_with(&env, "dhcp-0", "clone vm-nolease: dhcp lease not observed within").await;
    eventually(10, "PostCloneIPWaitTimeout event", || {
        has_event(&env, "dhcp-0", "PostCloneIPWaitTimeout")
    })
    .await;
    assert!(!ready(&env, "dhcp-0"));
    d.kill().await;
}

/// Checklist rows: update_test/WaitForFreshIPRenewNudgeWhenLeaseMissing
#[tokio::test(flavor = "multi_thread")]
async fn a_windows_guest_without_a_lease_gets_one_renew_nudge() {
    let env = env(false).await;
    seed_windows_snapshot(&env, "winbase").await;
    // Room after the nudge (at 1.5 s) for the test to hand out the lease, however loaded the
    // machine: the wait ends with the lease, not with its length.
    let d = windows_dhcp_pod_waiting(&env, Duration::from_secs(60)).await;
    eventually(20, "one renew nudge after the guest stays without a lease", || {
        renews(&env) == 1
    })
    .await;
    assert_eq!(
        env.sim.exec_log().unwrap()[0].argv[0],
        "powershell",
        "the Windows fixup ran first"
    );
    assert_eq!(lifecycle(&env, "win-0").as_deref(), Some("creating"));
    let mac = vm_named(&env, "vm-win")
        .await
        .unwrap()
        .primary_mac()
        .unwrap()
        .to_string();
    write_leases(&env, &[(&mac, "127.0.0.41")]);
    eventually(20, "ready with the lease", || {
        ready(&env, "win-0") && pod_ip(&env, "win-0").as_deref() == Some("127.0.0.41")
    })
    .await;
    assert_eq!(renews(&env), 1, "exactly one nudge");
    assert_eq!(
        d.provider.metrics().wake_renew_nudge.with_label_values(&["ok"]).get(),
        1
    );
    d.kill().await;
}

/// What reached "the network" beneath the loopback guard (and answers every probe).
#[derive(Default)]
struct NetworkRecorder(std::sync::Mutex<Vec<std::net::IpAddr>>);

#[async_trait::async_trait]
impl vk_cocoon::provider::probe::Prober for NetworkRecorder {
    async fn tcp(&self, addr: std::net::SocketAddr, _: Duration) -> Result<(), vk_cocoon::provider::probe::ProbeError> {
        self.0.lock().unwrap().push(addr.ip());
        Ok(())
    }
    async fn ping(&self, ip: std::net::Ipv4Addr, _: Duration) -> Result<(), vk_cocoon::provider::probe::ProbeError> {
        self.0.lock().unwrap().push(ip.into());
        Ok(())
    }
    async fn banner(
        &self,
        addr: std::net::SocketAddr,
        _: &str,
        _: Duration,
    ) -> Result<(), vk_cocoon::provider::probe::ProbeError> {
        self.0.lock().unwrap().push(addr.ip());
        Ok(())
    }
}

/// A daemon whose lease wait lasts `ip_wait`, and pod `win-0`: a Windows guest `vm-win` on a
/// DHCP network, created (its lease is the test's to hand out).
async fn windows_dhcp_pod_waiting(env: &Env, ip_wait: Duration) -> Daemon {
    let d = start(
        env,
        Options {
            timings: vk_cocoon::provider::Timings {
                ip_wait,
                ..fast_timings()
            },
            ..Default::default()
        },
    );
    let pod = managed(
        "win-0",
        "vm-win",
        &[
            (IMAGE, "winbase"),
            (NETWORK, "dhcp-net"),
            ("cocoonset.cocoonstack.io/os", "windows"),
        ],
    );
    create(env, &pod).await;
    d
}

fn preassigned(name: &str, ip: &str, probe_port: &str) -> k8s_openapi::api::core::v1::Pod {
    // Each its own external VM: an id another pod's VM has would be refused as that pod's.
    let id = format!("ext-{name}");
    let mut a = vec![
        ("vm.cocoonstack.io/name", name),
        ("vm.cocoonstack.io/id", id.as_str()),
        ("vm.cocoonstack.io/ip", ip),
    ];
    if !probe_port.is_empty() {
        a.push((PROBE_PORT, probe_port));
    }
    agent_pod(name, &a)
}

/// The suite's loopback guard (tests/support/src/provider_support/loopback.rs): a probe at a private
/// address is refused before it reaches the network, the pod shows the refusal, and the test
/// that let the daemon try fails with a message naming the address.
#[tokio::test(flavor = "multi_thread")]
async fn the_loopback_guard_refuses_private_addresses_and_fails_the_test_naming_them() {
    let env = env(false).await;
    let network = std::sync::Arc::new(NetworkRecorder::default());
    let d = start(
        &env,
        Options {
            prober: Some(network.clone()),
            // The daemon's own scope lets every address through: the guard is the only line.
            guest_networks: Some(guest_networks("0.0.0.0/0,::/0")),
            ..Default::default()
        },
    );
    create(&env, &preassigned("lan-icmp", "10.1.2.3", "")).await;
    create(&env, &preassigned("lan-tcp", "192.168.7.7", "6379")).await;
    create(&env, &preassigned("local", "127.1.2.3", "")).await;

    eventually(30, "the loopback guest is probed and ready", || ready(&env, "local")).await;
    eventually(
        30,
        "both private addresses refused, with the reason on the pods",
        || {
            ready_is(&env, "lan-icmp", "False", "refused to ping 10.1.2.3")
                && ready_is(
                    &env,
                    "lan-tcp",
                    "False",
                    "refused to TCP-probe port 6379 of 192.168.7.7",
                )
        },
    )
    .await;
    let reached = network.0.lock().unwrap().clone();
    assert!(
        reached.iter().all(|ip| ip.is_loopback()) && !reached.is_empty(),
        "only loopback reached the network: {reached:?}"
    );
    d.kill().await;

    let refused = env.refused.list();
    let failure = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(env)))
        .expect_err("a test whose daemon tried a private address fails");
    let message = failure
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_else(|| format!("{refused:?}"));
    assert!(
        message.contains("10.1.2.3") && message.contains("192.168.7.7") && !message.contains("127.1.2.3"),
        "the failure names the refused addresses: {message}"
    );
}

/// A lease that lands while the renew nudge is still running wins over the wait's deadline:
/// the nudge outlasts the wait (its reply never comes in time), yet the guest is Ready with
/// the lease that arrived meanwhile, not failed.
/// Checklist rows: update_test/WaitForFreshIPLeaseLandingDuringNudgeWins
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_landing_during_the_renew_nudge_wins_over_the_deadline() {
    let env = env(false).await;
    seed_windows_snapshot(&env, "winbase").await;
    // The nudge at 1.5 s is held past the 6 s wait: the lease written meanwhile decides.
    env.sim
        .add_fault(cocoon_sim::Fault {
            verb: "vm exec".into(),
            match_arg: Some("/renew".into()),
            times: Some(1),
            action: cocoon_sim::FaultAction::Delay { ms: 8_000 },
        })
        .unwrap();
    let d = windows_dhcp_pod_waiting(&env, Duration::from_secs(6)).await;
    eventually(20, "the renew nudge under way", || {
        calls(&env, "vm exec").iter().any(|a| a.iter().any(|x| x == "/renew"))
    })
    .await;
    let mac = vm_named(&env, "vm-win")
        .await
        .unwrap()
        .primary_mac()
        .unwrap()
        .to_string();
    write_leases(&env, &[(&mac, "127.0.0.42")]);
    eventually(30, "ready with the lease", || {
        ready(&env, "win-0") && pod_ip(&env, "win-0").as_deref() == Some("127.0.0.42")
    })
    .await;
    // The Ready status is published before the lifecycle annotation's patch lands.
    eventually(30, "lifecycle ready", || {
        lifecycle(&env, "win-0").as_deref() == Some("ready")
    })
    .await;
    assert!(!has_event(&env, "win-0", "PostCloneIPWaitTimeout"));
    d.kill().await;
}

/// A guest's lease wait stops when the pod's VM goes from under it: here the VM vanishes and
/// its eviction cannot reach the apiserver (so nothing else stops the guest work), and the wait
/// running out later writes no lease-timeout failure over the pod. The wake's wait is the same
/// code with the same check.
/// Checklist rows: update_test/WaitForFreshIPBailsWhenVMSwapped,
/// update_test/FinalizeDropNICWakeSkipsLifecycleWhenVMForgotten
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_wait_whose_vm_went_away_writes_no_lifecycle() {
    let env = env(false).await;
    seed_windows_snapshot(&env, "winbase").await;
    let d = windows_dhcp_pod_waiting(&env, Duration::from_secs(4)).await;
    eventually(20, "the lease wait under way (its renew nudge)", || renews(&env) > 0).await;
    let id = vm_named(&env, "vm-win").await.unwrap().id;
    eventually(20, "the event stream sees the VM", || {
        env.sim.stream_reports(&id, "running").unwrap()
    })
    .await;
    env.server
        .inject_fault(Some(axum::http::Method::DELETE), "/pods/win-0", 500, 1000);
    env.sim.flip_vm("vm-win", cocoon_sim::Flip::Deleted).unwrap();
    let failures = &d.provider.metrics().pod_evict_failure;
    eventually(20, "the VM let go and its eviction failing", || failures.get() >= 1).await;
    // Absence is shown by waiting: past the 4 s lease wait, nothing was written.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        !has_event(&env, "win-0", "PostCloneIPWaitTimeout"),
        "{:?}",
        events(&env, "win-0")
    );
    assert_ne!(lifecycle(&env, "win-0").as_deref(), Some("ready"));
    assert!(
        !lifecycle_message(&env, "win-0").contains("dhcp lease not observed"),
        "{}",
        lifecycle_message(&env, "win-0")
    );
    d.kill().await;
}
