//! Cloud Hypervisor Windows guests hibernate without their NIC (it is dropped before the save and
//! a fresh one is attached on wake); a failed drop renews the guest's lease and keeps the VM running.

use super::*;

/// Pod `win-0`: a cloud-hypervisor Windows guest `vm-win` cloned from `winbase`, up.
async fn windows_pod_up(env: &Env) {
    let windows = [
        (IMAGE, "winbase"),
        ("cocoonset.cocoonstack.io/os", "windows"),
        ("vm.cocoonstack.io/backend", "cloud-hypervisor"),
    ];
    create(env, &managed("win-0", "vm-win", &windows)).await;
    eventually(30, "ready", || is_up(env, "win-0")).await;
}

/// Lifecycle: L53.
/// Checklist rows: restore_test/BringUpVMRestoreFromHibernate,
/// update_test/HibernateDropsNICOnCHWindows,
/// update_test/FinalizeDropNICWakeMarksReadyWhenIPArrives,
/// update_test/FinalizeDropNICWakePublishesIPBeforeReady,
/// update_test/HibernateReleasesLeaseBeforeNICDrop, update_test/WaitForFreshIPNoRenewWhenIPPresent
#[tokio::test(flavor = "multi_thread")]
async fn a_cloud_hypervisor_windows_guest_hibernates_without_its_nic_and_wakes_with_a_fresh_one() {
    let env = env_with_oci().await;
    seed_windows_snapshot(&env, "winbase").await;
    let d = start(&env, Options::default());
    windows_pod_up(&env).await;
    let first_clone = calls(&env, "vm clone")[0].join(" ");
    assert!(
        first_clone.contains("--restore-mode copy"),
        "Windows guests restore by copy: {first_clone}"
    );
    assert_eq!(
        env.sim.exec_log().unwrap()[0].argv[0],
        "powershell",
        "a fresh Windows clone gets its NIC reset"
    );
    let id = vm_named(&env, "vm-win").await.unwrap().id;

    hibernate_now(&env, "win-0").await;
    let seq: Vec<String> = env
        .sim
        .calls()
        .unwrap()
        .into_iter()
        .filter(|c| c.argv.contains(&id) && matches!(c.verb.as_str(), "vm exec" | "vm net" | "snapshot save" | "vm rm"))
        .map(|c| match c.verb.as_str() {
            "vm exec" => c.argv[c.argv.iter().position(|a| a == "--").unwrap() + 1..].join(" "),
            _ => c.argv.join(" "),
        })
        .collect();
    let pos = |needle: &str| {
        seq.iter()
            .position(|s| s.contains(needle))
            .unwrap_or_else(|| panic!("{needle} in {seq:?}"))
    };
    assert!(pos("cmd /c ipconfig /release") < pos("net --nics 0"), "{seq:?}");
    assert!(
        pos("net --nics 0") < pos("snapshot save") && pos("snapshot save") < pos("rm --force"),
        "{seq:?}"
    );
    let m = d.provider.metrics();
    assert_eq!(
        (
            m.hibernate.with_label_values(&["dhcp_release", "ok"]).get(),
            m.hibernate.with_label_values(&["netresize", "ok"]).get()
        ),
        (1, 1)
    );

    let execs_before_wake = env.sim.exec_log().unwrap().len();
    annotate(&env, "win-0", &[(HIBERNATE, None)]).await;
    eventually(30, "woken", || is_up(&env, "win-0")).await;
    let wake_clone = calls(&env, "vm clone").last().unwrap().join(" ");
    assert!(
        wake_clone.contains("--restore-mode copy") && wake_clone.contains("--nics 1"),
        "a fresh NIC is hot-added: {wake_clone}"
    );
    assert_eq!(
        env.sim.exec_log().unwrap().len(),
        execs_before_wake,
        "a restored Windows guest only waits for its lease"
    );
    d.kill().await;
}

/// Checklist rows: update_test/HibernateFailsOnNICDropGenericErr,
/// update_test/HibernateRenewsWhenNICDropFails
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_nic_drop_renews_the_guest_lease_and_keeps_the_vm_running() {
    let env = env_with_oci().await;
    seed_windows_snapshot(&env, "winbase").await;
    let d = start(&env, slow_retries());
    windows_pod_up(&env).await;
    fail_once(&env, "vm net", None, "Error: hot-unplug: device busy");
    annotate(&env, "win-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(20, "HibernateNetResizeFailed", || {
        has_event(&env, "win-0", "HibernateNetResizeFailed")
    })
    .await;
    assert_eq!(
        calls(&env, "snapshot save").len(),
        1,
        "only the seed's: nothing is saved without the NIC dropped"
    );
    eventually(10, "the guest renews its lease", || renews(&env) > 0).await;
    assert!(
        vm_named(&env, "vm-win")
            .await
            .is_some_and(|v| v.state.is_running() && !v.network_configs.is_empty())
    );
    assert!(!tag_exists(&env, "vm-win").await);
    hibernated(&env, "win-0").await;
    d.kill().await;
}

/// Checklist rows: update_test/HibernateRollbackRenews
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_remove_of_a_nic_less_guest_gives_the_nic_back_and_publishes_its_fresh_address() {
    let env = env_with_oci().await;
    seed_windows_snapshot(&env, "winbase").await;
    let d = start(&env, slow_retries());
    windows_pod_up(&env).await;
    let vm = vm_named(&env, "vm-win").await.unwrap();
    fail_once(&env, "vm rm", Some(&vm.id), "Error: vm busy: stop timed out");
    annotate(&env, "win-0", &[(HIBERNATE, Some("true"))]).await;
    wait_failed_with(&env, "win-0", "the hibernate tag was withdrawn").await;
    assert!(!tag_exists(&env, "vm-win").await, "the running VM holds the state");

    // The undos ran after the failed remove: the NIC came back (`vm net --nics 1`) and the pod
    // shows the VM's id and the address the guest has now.
    let verbs: Vec<String> = env
        .sim
        .calls()
        .unwrap()
        .into_iter()
        .filter(|c| matches!(c.verb.as_str(), "vm net" | "vm rm"))
        .map(|c| c.argv.join(" "))
        .collect();
    let failed_rm = verbs.iter().position(|c| c.contains("rm --force")).expect("a vm rm");
    assert!(
        verbs[failed_rm..].iter().any(|c| c.contains("--nics 1")),
        "the NIC is given back after the failed remove: {verbs:?}"
    );
    let current = vm_named(&env, "vm-win").await.unwrap();
    assert!(current.state.is_running() && !current.network_configs.is_empty());
    eventually(10, "the guest's current address on the pod", || {
        annotation(&env, "win-0", "vm.cocoonstack.io/ip") == Some(d.provider.resolve_ip(&current))
    })
    .await;
    assert_eq!(annotation(&env, "win-0", ID).as_deref(), Some(vm.id.as_str()));

    hibernated(&env, "win-0").await;
    assert!(tag_exists(&env, "vm-win").await, "the retry re-published the tag");
    assert!(vm_named(&env, "vm-win").await.is_none());
    d.kill().await;
}

/// On an IPv6-only guest network a Windows guest's lease is a DHCPv6 one: the release before the
/// NIC drop and the renew after a failed drop use `/release6` and `/renew6`, never the DHCPv4 verbs
/// (which would leave the lease held, and ask for an address the network does not hand out).
///
/// Checklist rows: update_test/IPv6OnlyWindowsUsesDHCPv6LifecycleCommands
#[tokio::test(flavor = "multi_thread")]
async fn on_an_ipv6_only_network_a_windows_guest_releases_and_renews_its_dhcpv6_lease() {
    let env = env_with_oci().await;
    seed_windows_snapshot(&env, "winbase").await;
    let d = start(
        &env,
        Options {
            network_mode: vk_cocoon::provider::plan::NetworkMode::Ipv6Only,
            ..slow_retries()
        },
    );
    windows_pod_up(&env).await;
    fail_once(&env, "vm net", None, "Error: hot-unplug: device busy");
    annotate(&env, "win-0", &[(HIBERNATE, Some("true"))]).await;
    let ipconfig_verbs = || -> Vec<String> {
        env.sim
            .exec_log()
            .unwrap()
            .into_iter()
            .filter(|e| e.argv.get(2).is_some_and(|a| a == "ipconfig"))
            .map(|e| e.argv[3..].join(" "))
            .collect()
    };
    eventually(20, "the guest renews its DHCPv6 lease after the failed drop", || {
        ipconfig_verbs().iter().any(|v| v == "/renew6")
    })
    .await;
    assert!(has_event(&env, "win-0", "HibernateNetResizeFailed"));
    // The hibernate is retried (a second release may follow): only DHCPv6 verbs, release first.
    let verbs = ipconfig_verbs();
    assert_eq!(verbs.first().map(String::as_str), Some("/release6"), "{verbs:?}");
    assert!(verbs.iter().all(|v| v == "/release6" || v == "/renew6"), "{verbs:?}");
    d.kill().await;
}

/// The guest's own `ipconfig /release` failing is no reason to keep the guest up: the NIC is
/// dropped and the hibernate finishes (the lease expires in cocoon-net instead).
/// Checklist rows: update_test/HibernateReleaseFailureDoesNotBlock
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_lease_release_in_the_guest_does_not_stop_the_hibernate() {
    let env = env_with_oci().await;
    seed_windows_snapshot(&env, "winbase").await;
    let d = start(&env, Options::default());
    windows_pod_up(&env).await;
    env.sim
        .on_exec(cocoon_sim::ExecRule {
            vm: Some("vm-win".into()),
            argv_prefix: ["cmd", "/c", "ipconfig", "/release"].map(String::from).to_vec(),
            times: Some(1),
            exit_code: 1,
            stderr: "An error occurred while releasing interface Ethernet".into(),
            ..Default::default()
        })
        .unwrap();
    hibernate_now(&env, "win-0").await;
    let m = d.provider.metrics();
    assert_eq!(
        (
            m.hibernate.with_label_values(&["dhcp_release", "failed"]).get(),
            m.hibernate.with_label_values(&["netresize", "ok"]).get()
        ),
        (1, 1),
        "the release failed and the NIC was dropped anyway"
    );
    assert!(tag_exists(&env, "vm-win").await && vm_named(&env, "vm-win").await.is_none());
    d.kill().await;
}

/// When cocoon cannot say whether the guest released its lease (the `vm exec` itself failed)
/// and the NIC drop then fails, the guest is still told to renew: the NIC stays, so its lease
/// must too.
/// Checklist rows: update_test/HibernateRenewsEvenWhenReleaseVerdictUnknown
#[tokio::test(flavor = "multi_thread")]
async fn a_release_of_unknown_outcome_is_still_followed_by_a_renew_when_the_nic_drop_fails() {
    let env = env_with_oci().await;
    seed_windows_snapshot(&env, "winbase").await;
    let d = start(&env, slow_retries());
    windows_pod_up(&env).await;
    let id = vm_named(&env, "vm-win").await.unwrap().id;
    fail_once(&env, "vm exec", Some(&id), "Error: agent: connection reset by peer");
    fail_once(&env, "vm net", None, "Error: hot-unplug: device busy");
    annotate(&env, "win-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(20, "HibernateNetResizeFailed", || {
        has_event(&env, "win-0", "HibernateNetResizeFailed")
    })
    .await;
    eventually(10, "the guest renews its lease", || renews(&env) > 0).await;
    assert!(
        !env.sim
            .exec_log()
            .unwrap()
            .iter()
            .any(|e| e.argv.join(" ") == "cmd /c ipconfig /release"),
        "the release never reached the guest (its outcome is unknown to the daemon)"
    );
    assert_eq!(
        d.provider
            .metrics()
            .hibernate
            .with_label_values(&["dhcp_release", "failed"])
            .get(),
        1
    );
    assert!(vm_named(&env, "vm-win").await.is_some_and(|v| v.state.is_running()));
    hibernated(&env, "win-0").await;
    d.kill().await;
}

/// A Linux DHCP guest hibernates with its NIC (no guest-side release, no NIC drop); its lease is
/// released in cocoon-net only after the VM is removed, and a hibernate rolled back after a
/// failed remove releases nothing (the witness checks at every release that no VM holds the MAC).
/// Lifecycle: L56. Checklist rows: update_test/HibernateSkipsReleaseOnNonDropNIC
/// Checklist rows: update_test/HibernateSkipsNICDropOnNonCHWindows
#[tokio::test(flavor = "multi_thread")]
async fn a_linux_dhcp_guest_keeps_its_nic_and_its_lease_is_released_only_after_the_remove() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let vm = clone_direct_on(&env.runtime, "base", "vm-lx", Some("dhcp-net")).await;
    let mac = vm.primary_mac().unwrap().to_ascii_lowercase();
    write_leases(&env, &[(&mac, "127.22.0.18")]);
    let witness = LeaseWitness::new(&env);
    create(
        &env,
        &managed(
            "lx-0",
            "vm-lx",
            &[(IMAGE, "base"), ("cocoonset.cocoonstack.io/network", "dhcp-net")],
        ),
    )
    .await;
    // Started once the pod exists: its startup reconcile adopts the VM, not destroys an orphan.
    let d = start(
        &env,
        Options {
            releaser: Some(witness.clone()),
            ..slow_retries()
        },
    );
    eventually(30, "ready", || is_up(&env, "lx-0")).await;
    fail_once(&env, "vm rm", Some(&vm.id), "Error: vm busy: stop timed out");
    annotate(&env, "lx-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(20, "HibernateRemoveFailed event", || {
        has_event(&env, "lx-0", "HibernateRemoveFailed")
    })
    .await;
    hibernated(&env, "lx-0").await;
    witness.assert_no_breach();
    assert_eq!(
        witness.released(),
        vec![mac],
        "released once, after the remove that worked"
    );
    assert!(
        env.sim.exec_log().unwrap().iter().all(|e| e.vm_id != vm.id),
        "no guest-side release for a guest that keeps its NIC"
    );
    assert!(calls(&env, "vm net").is_empty(), "no NIC drop");
    d.kill().await;
}

/// A hibernate asked for again while a woken Windows guest still waits for its fresh lease:
/// the wait writes no lifecycle over the pending hibernate (no `WakeIPWaitTimeout` failure),
/// and the hibernate goes ahead. (The hibernate stops the wake's guest work when it starts;
/// the wait's own check of the hibernate request is a second line this flow does not reach.)
/// Checklist rows: update_test/FinalizeDropNICWakeSkipsLifecycleWhenHibernateRequested
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_wait_that_runs_out_after_a_new_hibernate_request_writes_no_lifecycle() {
    let env = env_with_oci().await;
    seed_windows_snapshot(&env, "winbase").await;
    // The hibernate's first attempt fails, and its retry comes only after the lease wait (3 s).
    let d = start(
        &env,
        Options {
            timings: Timings {
                op_retry_min: Duration::from_secs(5),
                op_retry_max: Duration::from_secs(6),
                ..fast_timings()
            },
            ..Default::default()
        },
    );
    // A DHCP guest: its address comes only with a lease.
    let windows = [
        (IMAGE, "winbase"),
        ("cocoonset.cocoonstack.io/os", "windows"),
        ("vm.cocoonstack.io/backend", "cloud-hypervisor"),
        ("cocoonset.cocoonstack.io/network", "dhcp-net"),
    ];
    create(&env, &managed("win-0", "vm-win", &windows)).await;
    eventually(30, "VM up", || annotation(&env, "win-0", ID).is_some()).await;
    let mac = vm_named(&env, "vm-win")
        .await
        .unwrap()
        .primary_mac()
        .unwrap()
        .to_string();
    write_leases(&env, &[(&mac, "127.0.0.51")]);
    eventually(30, "ready", || is_up(&env, "win-0")).await;
    hibernate_now(&env, "win-0").await;
    let woken_at = calls(&env, "vm clone").len();
    annotate(&env, "win-0", &[(HIBERNATE, None)]).await;
    // The woken guest gets a fresh NIC (a new MAC) whose lease never comes.
    eventually(30, "woken VM up", || calls(&env, "vm clone").len() > woken_at).await;
    fail_once(&env, "vm net", None, "Error: hot-unplug: device busy");
    annotate(&env, "win-0", &[(HIBERNATE, Some("true"))]).await;
    hibernated(&env, "win-0").await;
    let m = d.provider.metrics();
    assert_eq!(m.wake_ip_wait.with_label_values(&["timeout"]).get(), 0);
    assert!(
        !has_event(&env, "win-0", "WakeIPWaitTimeout"),
        "the lease wait failed a pod that asked to hibernate"
    );
    d.kill().await;
}

/// `win-0` as the apiserver has it, asking to be hibernated: handed to the provider's
/// UpdatePod directly, so the test can abandon the call the way a cancelled request would.
fn hibernate_request(env: &Env) -> std::sync::Arc<k8s_openapi::api::core::v1::Pod> {
    let mut pod = get(env, "win-0").unwrap();
    pod.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(HIBERNATE.into(), "true".into());
    std::sync::Arc::new(pod)
}

/// Asks the provider to hibernate `win-0` directly, slows the first `verb` call naming `arg` by
/// 1.5 s, and drops the request while that call runs. The pod controller never cancels a hook;
/// this pins that the step runs detached from its caller.
async fn hibernate_dropped_during(env: &Env, d: &Daemon, verb: &str, arg: &str) {
    use vk_cocoon::kubelet::Provider as _;
    env.sim
        .add_fault(Fault {
            verb: verb.into(),
            match_arg: Some(arg.into()),
            times: Some(1),
            action: FaultAction::Delay { ms: 1_500 },
        })
        .unwrap();
    let provider = d.provider.clone();
    let pod = hibernate_request(env);
    let call = tokio::spawn(async move { provider.update_pod(&pod).await });
    eventually(30, &format!("the {verb} {arg} under way"), || {
        calls(env, verb).iter().any(|a| a.iter().any(|x| x == arg))
    })
    .await;
    call.abort();
    let _ = call.await;
}

/// The lease renew after a failed NIC drop does not depend on the request that asked for the
/// hibernate: the caller gone while the renew is under way, the guest still renews.
/// Checklist rows: update_test/HibernateRenewSurvivesCancelledContext
#[tokio::test(flavor = "multi_thread")]
async fn the_renew_after_a_failed_nic_drop_outlives_its_cancelled_caller() {
    let env = env_with_oci().await;
    seed_windows_snapshot(&env, "winbase").await;
    let d = start(&env, Options::default());
    windows_pod_up(&env).await;
    fail_once(&env, "vm net", None, "Error: hot-unplug: device busy");
    hibernate_dropped_during(&env, &d, "vm exec", "/renew").await;
    eventually(20, "the guest renewed its lease", || renews(&env) > 0).await;
    d.kill().await;
}

/// Giving the NIC back after a failed remove does not depend on the request either: the caller
/// gone while the NIC is being re-attached, the guest gets its NIC and renews its lease.
/// Checklist rows: update_test/HibernateRollbackSurvivesCancelledContext
#[tokio::test(flavor = "multi_thread")]
async fn giving_the_nic_back_outlives_its_cancelled_caller() {
    let env = env_with_oci().await;
    seed_windows_snapshot(&env, "winbase").await;
    let d = start(&env, Options::default());
    windows_pod_up(&env).await;
    let vm = vm_named(&env, "vm-win").await.unwrap();
    fail_once(&env, "vm rm", Some(&vm.id), "Error: vm busy: stop timed out");
    // `vm net <id> --nics 1`: the re-attach is the step the request is dropped in.
    hibernate_dropped_during(&env, &d, "vm net", "1").await;
    eventually(20, "the NIC back and the lease renewed", || renews(&env) > 0).await;
    assert!(
        vm_named(&env, "vm-win")
            .await
            .is_some_and(|v| v.state.is_running() && !v.network_configs.is_empty()),
        "the guest has its NIC again"
    );
    d.kill().await;
}
