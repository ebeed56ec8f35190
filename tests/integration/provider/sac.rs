//! A Windows guest's static addresses are set at its serial console — the Special
//! Administration Console, which the simulator's Windows guests serve — before the pod is
//! Ready: after a `run`, and after a clone beside the network-device reset; every NIC's, for a
//! guest with several. A console that never answers fails the pod's lifecycle with the step that
//! failed and what to do, also when a restarted daemon resumes a console pass it was cut in.
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

/// A Windows snapshot `name` whose guest has `nics` NICs (each static: the simulator's default
/// network), seeded through the real CLI.
async fn seed_windows_snapshot_with_nics(env: &Env, name: &str, nics: u32) {
    env.sim.add_image("win11", "cloudimg").unwrap();
    let seed = env
        .runtime
        .run(&vk_cocoon::runtime::RunSpec {
            name: Some(format!("seed-{name}")),
            image: "win11".into(),
            windows: true,
            nics: Some(nics),
            ..Default::default()
        })
        .await
        .unwrap();
    env.runtime.snapshot_save(name, &seed.id).await.unwrap();
    env.runtime.remove(&seed.id).await.unwrap();
}

/// A Windows guest with two static NICs: the console sets each NIC's address on its own
/// interface (the n of the NIC's place in SAC's listing, in NIC order), and the pod is Ready
/// only once both are set — whenever it is seen Ready, the console already holds both.
/// Lifecycle: L68.
/// Checklist rows: sac_test/SessionMultiNICAllStatic
#[tokio::test(flavor = "multi_thread")]
async fn a_windows_guest_with_two_static_nics_is_ready_only_once_its_console_set_both() {
    let env = env(false).await;
    let port = web_port();
    env.sim.set_settings(|s| s.guest_http_ports = vec![port]).unwrap();
    seed_windows_snapshot_with_nics(&env, "win2nic", 2).await;
    let d = start(&env, Options::default());
    create(
        &env,
        &managed(
            "win-3",
            "vm-win-2nic",
            &[
                (IMAGE, "win2nic"),
                ("cocoonset.cocoonstack.io/os", "windows"),
                (PROBE_PORT, &port.to_string()),
            ],
        ),
    )
    .await;
    let mut at_ready = serde_json::Value::Null;
    eventually(60, "win-3 ready", || {
        let up = lifecycle(&env, "win-3").as_deref() == Some("ready") && ready(&env, "win-3");
        if up {
            at_ready = console_state(&env, "vm-win-2nic");
        }
        up
    })
    .await;
    let vm = vm_named(&env, "vm-win-2nic").await.unwrap();
    assert_eq!(vm.network_configs.len(), 2, "a two-NIC clone: {vm:?}");
    let nets = at_ready.as_array().cloned().unwrap_or_default();
    assert_eq!(nets.len(), 2, "SAC lists both interfaces: {at_ready}");
    for (i, nic) in vm.network_configs.iter().enumerate() {
        let nic = nic.network.clone().unwrap();
        assert!(!nic.ip.is_empty(), "NIC {i} is static");
        assert_eq!(
            nets[i]["ip"],
            nic.ip.as_str(),
            "NIC {i}'s address was set on its interface (net {}) before Ready: {at_ready}",
            nets[i]["net"]
        );
        assert_eq!(nets[i]["mask"], "255.255.0.0", "the /{} mask", nic.prefix);
        assert_eq!(nets[i]["gateway"], nic.gateway.as_str());
    }
    assert_ne!(nets[0]["ip"], nets[1]["ip"], "each NIC has its own address");
    let m = d.provider.metrics();
    assert_eq!(
        m.postclone.with_label_values(&["sac", "ok"]).get(),
        1,
        "one console pass set both"
    );
    assert_eq!(
        annotation(&env, "win-3", "vm.cocoonstack.io/post-clone-state").as_deref(),
        Some("done")
    );
    d.kill().await;
}

/// The Go daemon wrote the fixup's `done` marker before its console pass, so a restart in
/// between found `done` with the static addresses still owed and ran the pass then. Here the
/// marker is `done` only once the addresses are set too (`guest.rs::run_fixup`): a daemon
/// killed after the network-device reset, while it is still at the console, leaves `running`,
/// and the restarted daemon resumes the fixup — the reset again (idempotent), then the console
/// pass. A console that still does not answer then fails the pod, naming the step.
/// Lifecycle: L68.
/// Checklist rows: resume_test/StartupDispatchResumesSACWhenDoneMarkerPredatesIt
#[tokio::test(flavor = "multi_thread")]
async fn a_console_pass_cut_by_a_restart_is_resumed_and_a_failing_one_fails_the_pod() {
    let env = env(false).await;
    let port = web_port();
    env.sim
        .set_settings(|s| {
            s.guest_http_ports = vec![port];
            s.console_silent = true;
        })
        .unwrap();
    seed_windows_snapshot(&env, "winbase").await;
    // The first daemon waits at the console long enough to be killed there.
    let patient = Options {
        timings: vk_cocoon::provider::Timings {
            sac: vk_cocoon::provider::sac::SacTimings {
                dial_budget: std::time::Duration::from_secs(120),
                ..fast_timings().sac
            },
            ..fast_timings()
        },
        ..Default::default()
    };
    let d = start(&env, patient);
    create(
        &env,
        &managed(
            "win-4",
            "vm-win-cut",
            &[
                (IMAGE, "winbase"),
                ("cocoonset.cocoonstack.io/os", "windows"),
                (PROBE_PORT, &port.to_string()),
            ],
        ),
    )
    .await;
    eventually(60, "the reset ran and the fixup is at the console", || {
        !env.sim.exec_log().unwrap().is_empty()
            && annotation(&env, "win-4", "vm.cocoonstack.io/post-clone-state").as_deref() == Some("running")
    })
    .await;
    d.kill().await;
    assert_eq!(lifecycle(&env, "win-4").as_deref(), Some("creating"));
    assert!(
        !has_event(&env, "win-4", "PostCloneSACDialFailed"),
        "the first daemon never gave up"
    );
    let resets = env.sim.exec_log().unwrap().len();

    let d = start(&env, Options::default());
    let message = wait_failed_with(&env, "win-4", "through its serial console").await;
    assert!(message.contains("did not answer with SAC>"), "{message}");
    eventually(10, "the events", || {
        events(&env, "win-4")
            .iter()
            .any(|(r, n)| r == "ResumedAfterRestart" && n == "op=post_clone")
            && has_event(&env, "win-4", "PostCloneSACDialFailed")
            && has_event(&env, "win-4", "WindowsStaticIPFailed")
    })
    .await;
    assert!(
        env.sim.exec_log().unwrap().len() > resets,
        "the resumed fixup ran the reset again before the console pass"
    );
    assert_eq!(
        d.provider
            .metrics()
            .postclone
            .with_label_values(&["sac", "failed"])
            .get(),
        1,
        "the restarted daemon ran the console pass"
    );
    assert_eq!(
        annotation(&env, "win-4", "vm.cocoonstack.io/post-clone-state").as_deref(),
        Some("failed")
    );
    assert!(!ready(&env, "win-4"), "never Ready");
    assert_eq!(calls(&env, "vm clone").len(), 1, "the VM was adopted, not cloned again");
    d.kill().await;
}

/// A pod the Go daemon left with its fixup marker `done` but its console pass not run (it wrote
/// `done` before the pass): the restarted daemon, resuming the lease wait, sets the static
/// address at the console first, and the pod is Ready. (It reported `ready` without the pass:
/// the guest had no address and the pod stayed Not Ready, with no failure said.)
/// Lifecycle: L68.
/// Checklist rows: resume_test/StartupDispatchResumesSACWhenDoneMarkerPredatesIt
#[tokio::test(flavor = "multi_thread")]
async fn a_done_marker_written_before_the_console_pass_still_gets_the_pass_after_a_restart() {
    let env = env(false).await;
    let port = web_port();
    env.sim.set_settings(|s| s.guest_http_ports = vec![port]).unwrap();
    seed_windows_snapshot(&env, "winbase").await;
    // The network-device reset hangs long enough for the daemon to die in it.
    env.sim.delay("vm exec", Some(1), 120_000).unwrap();
    let d = start(&env, Options::default());
    create(
        &env,
        &managed(
            "win-5",
            "vm-win-go",
            &[
                (IMAGE, "winbase"),
                ("cocoonset.cocoonstack.io/os", "windows"),
                (PROBE_PORT, &port.to_string()),
            ],
        ),
    )
    .await;
    // The reset's exec took the delay (not only logged its call: one killed before taking it
    // would leave the delay to the restarted daemon's exec).
    eventually(60, "the reset hanging", || {
        env.sim.armed_faults("vm exec").unwrap() == 0
    })
    .await;
    d.kill().await;
    env.sim.kill_all("vm exec").unwrap();
    // As the Go daemon left it: `done` written once the reset ran, before its console pass.
    annotate(&env, "win-5", &[("vm.cocoonstack.io/post-clone-state", Some("done"))]).await;
    assert_eq!(lifecycle(&env, "win-5").as_deref(), Some("creating"));
    assert_eq!(
        console_state(&env, "vm-win-go"),
        serde_json::Value::Null,
        "nothing set yet"
    );
    let resets = calls(&env, "vm exec").len();

    let d = start(&env, Options::default());
    eventually(60, "win-5 ready", || {
        lifecycle(&env, "win-5").as_deref() == Some("ready") && ready(&env, "win-5")
    })
    .await;
    let vm = vm_named(&env, "vm-win-go").await.unwrap();
    let ip = vm.network_configs[0].network.clone().unwrap().ip;
    assert_eq!(
        console_state(&env, "vm-win-go")[0]["ip"],
        ip.as_str(),
        "the console pass ran"
    );
    assert!(
        events(&env, "win-5")
            .iter()
            .any(|(r, n)| r == "ResumedAfterRestart" && n == "op=ready_wait")
    );
    assert_eq!(
        calls(&env, "vm exec").len(),
        resets,
        "only the console pass: the reset is not run again"
    );
    assert_eq!(
        d.provider.metrics().postclone.with_label_values(&["sac", "ok"]).get(),
        1
    );
    d.kill().await;
}
