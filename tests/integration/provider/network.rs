//! cocoon-net end to end: the pod IP comes from the lease file by MAC, and the VM's DHCP leases
//! are released after its removal.

use crate::provider_support;

use std::sync::Arc;

use provider_support::*;

/// Lifecycle: L37, L47.
/// Checklist rows: delete_test/ReleasesAllDHCPLeases
#[tokio::test(flavor = "multi_thread")]
async fn the_ip_comes_from_the_lease_file_and_leases_are_released_after_the_delete() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    // A DHCP guest (the simulator gives NICs of `*dhcp*` networks no static address).
    let vm = clone_direct_on(&env.runtime, "base", "vm-dhcp", Some("dhcp-net")).await;
    assert!(vm.primary_ip().is_none(), "a DHCP NIC has no static address");
    let mac = vm.primary_mac().expect("the NIC has a MAC").to_string();
    std::fs::write(
        &env.leases,
        format!(
            r#"[{{"mac":"{}","ip":"127.22.0.17","expiry":"2999-01-01T00:00:00Z"}}]"#,
            mac.to_ascii_uppercase()
        ),
    )
    .unwrap();
    create(
        &env,
        &managed(
            "dhcp-0",
            "vm-dhcp",
            &[
                ("cocoonset.cocoonstack.io/image", "base"),
                ("cocoonset.cocoonstack.io/network", "dhcp-net"),
            ],
        ),
    )
    .await;

    let releaser = Arc::new(RecordingReleaser::default());
    let d = start(
        &env,
        Options {
            releaser: Some(releaser.clone()),
            ..Default::default()
        },
    );
    eventually(60, "adopted and ready", || {
        lifecycle(&env, "dhcp-0").as_deref() == Some("ready")
    })
    .await;
    assert_eq!(
        annotation(&env, "dhcp-0", "vm.cocoonstack.io/ip").as_deref(),
        Some("127.22.0.17")
    );
    eventually(20, "pod IP published", || {
        get(&env, "dhcp-0")
            .and_then(|p| p.status)
            .and_then(|s| s.pod_ip)
            .as_deref()
            == Some("127.22.0.17")
    })
    .await;

    assert!(
        releaser.released.lock().unwrap().is_empty(),
        "nothing released while the VM lives:\n{}",
        releaser.report()
    );
    delete(&env, "dhcp-0").await;
    eventually(60, "pod finalized", || get(&env, "dhcp-0").is_none()).await;
    assert_eq!(
        releaser.released.lock().unwrap().clone(),
        vec![mac.to_ascii_lowercase()]
    );
    assert!(vm_named(&env, "vm-dhcp").await.is_none());
    d.kill().await;
}
