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
    eventually(10, "the guest renews its lease", || {
        env.sim
            .exec_log()
            .unwrap()
            .iter()
            .any(|e| e.argv.join(" ") == "cmd /c ipconfig /renew")
    })
    .await;
    assert!(
        vm_named(&env, "vm-win")
            .await
            .is_some_and(|v| v.state.is_running() && !v.network_configs.is_empty())
    );
    assert!(!tag_exists(&env, "vm-win").await);
    hibernated(&env, "win-0").await;
    d.kill().await;
}

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
            network_mode: vk_cocoon::provider::cocoon_net::NetworkMode::Ipv6Only,
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
