//! A Windows guest's static addresses are set at its serial console — the Special
//! Administration Console, which the simulator's Windows guests serve — before the pod is
//! Ready: after a `run`, and after a clone beside the network-device reset. A console that never
//! answers fails the pod's lifecycle with the step that failed and what to do.
//! Checklist rows: the SAC static-IP pass (lifecycle L68), guest/sac_test.

use crate::provider_support::*;

const IMAGE: &str = "cocoonset.cocoonstack.io/image";
const PROBE_PORT: &str = "vm.cocoonstack.io/probe-port";

/// A free loopback port for the guests' web server (their readiness probe's target).
fn web_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn windows_run(name: &str, vm: &str, port: u16) -> k8s_openapi::api::core::v1::Pod {
    managed(
        name,
        vm,
        &[
            (IMAGE, "win11"),
            ("cocoonset.cocoonstack.io/mode", "run"),
            ("cocoonset.cocoonstack.io/os", "windows"),
            (PROBE_PORT, &port.to_string()),
        ],
    )
}

/// What the guest's console set (`sac.json` in the VM's run directory).
fn console_state(env: &Env, vm: &str) -> serde_json::Value {
    let (files, _) = env.sim.vm_files_of(vm).unwrap();
    let text = std::fs::read(files.run_dir.join("sac.json")).unwrap_or_default();
    serde_json::from_slice(&text).unwrap_or(serde_json::Value::Null)
}

/// Lifecycle: L68.
/// Checklist rows: sac_test/DialAndQuery, sac_test/SessionSetAndVerify
#[tokio::test(flavor = "multi_thread")]
async fn a_windows_guest_run_with_a_static_nic_is_ready_once_its_console_set_the_address() {
    let env = env(false).await;
    let port = web_port();
    env.sim.set_settings(|s| s.guest_http_ports = vec![port]).unwrap();
    env.sim.add_image("win11", "cloudimg").unwrap();
    let d = start(&env, Options::default());
    create(&env, &windows_run("win-0", "vm-win-run", port)).await;
    eventually(60, "win-0 ready", || {
        lifecycle(&env, "win-0").as_deref() == Some("ready") && ready(&env, "win-0")
    })
    .await;
    let vm = vm_named(&env, "vm-win-run").await.unwrap();
    let nic = vm.network_configs[0].network.clone().unwrap();
    let state = console_state(&env, "vm-win-run");
    assert_eq!(
        state[0]["ip"],
        nic.ip.as_str(),
        "the console set the NIC's address: {state}"
    );
    assert_eq!(state[0]["mask"], "255.255.0.0", "the /{} mask", nic.prefix);
    assert_eq!(state[0]["gateway"], nic.gateway.as_str());
    assert!(env.sim.exec_log().unwrap().is_empty(), "nothing exec'd after a run");
    let m = d.provider.metrics();
    assert_eq!(m.postclone.with_label_values(&["sac", "ok"]).get(), 1);
    assert_eq!(
        annotation(&env, "win-0", "vm.cocoonstack.io/post-clone-state").as_deref(),
        Some("done")
    );
    d.kill().await;
}

/// Lifecycle: L68.
/// Checklist rows: sac_test/SessionSetAndVerify
#[tokio::test(flavor = "multi_thread")]
async fn a_windows_clone_resets_its_network_devices_then_sets_its_static_address_at_the_console() {
    let env = env(false).await;
    let port = web_port();
    env.sim.set_settings(|s| s.guest_http_ports = vec![port]).unwrap();
    seed_windows_snapshot(&env, "winbase").await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed(
            "win-1",
            "vm-win-clone",
            &[
                (IMAGE, "winbase"),
                ("cocoonset.cocoonstack.io/os", "windows"),
                (PROBE_PORT, &port.to_string()),
            ],
        ),
    )
    .await;
    eventually(60, "win-1 ready", || {
        lifecycle(&env, "win-1").as_deref() == Some("ready") && ready(&env, "win-1")
    })
    .await;
    assert_eq!(
        env.sim.exec_log().unwrap()[0].argv[0],
        "powershell",
        "the reset ran first"
    );
    let vm = vm_named(&env, "vm-win-clone").await.unwrap();
    let ip = vm.network_configs[0].network.clone().unwrap().ip;
    assert_eq!(console_state(&env, "vm-win-clone")[0]["ip"], ip.as_str());
    let m = d.provider.metrics();
    assert_eq!(m.postclone.with_label_values(&["windows", "ok"]).get(), 1);
    assert_eq!(m.postclone.with_label_values(&["sac", "ok"]).get(), 1);
    d.kill().await;
}

/// Checklist rows: sac_test/DialTimeout
#[tokio::test(flavor = "multi_thread")]
async fn a_console_that_never_answers_fails_the_lifecycle_naming_the_step() {
    let env = env(false).await;
    let port = web_port();
    env.sim
        .set_settings(|s| {
            s.guest_http_ports = vec![port];
            s.console_silent = true;
        })
        .unwrap();
    env.sim.add_image("win11", "cloudimg").unwrap();
    let d = start(&env, Options::default());
    create(&env, &windows_run("win-2", "vm-win-hung", port)).await;
    let message = wait_failed_with(&env, "win-2", "through its serial console").await;
    assert!(message.contains("did not answer with SAC>"), "{message}");
    assert!(message.contains("kubectl attach"), "what to do: {message}");
    eventually(10, "the events", || {
        has_event(&env, "win-2", "PostCloneSACDialFailed") && has_event(&env, "win-2", "WindowsStaticIPFailed")
    })
    .await;
    assert!(!ready(&env, "win-2"), "never Ready");
    assert_eq!(
        d.provider
            .metrics()
            .postclone
            .with_label_values(&["sac", "failed"])
            .get(),
        1
    );
    assert_eq!(
        annotation(&env, "win-2", "vm.cocoonstack.io/post-clone-state").as_deref(),
        Some("failed")
    );
    d.kill().await;
}
