//! macOS guests end to end (the newer cocoon-macos flags: `src/provider/DECISIONS.md` row 7): the
//! daemon on the fake apiserver drives the cocoon-macos simulator (a real "qemu" process per
//! running VM, its VNC display and the guest's sshd on loopback), and the daemon's real probes read
//! the guest's `SSH-` banner. Create (run new / start dead / adopt live), registration, readiness,
//! delete with lease release, VNC ports, hibernate refused, restart re-registration, bad input.

use crate::provider_support;

use std::sync::Arc;

use provider_support::*;
use vk_cocoon::provider::macos::MacosSettings;
use vk_cocoon::runtime::macos::{MacRunSpec, MacosRuntime, Vnc};

const OS: &str = "cocoonset.cocoonstack.io/os";
const IMAGE: &str = "cocoonset.cocoonstack.io/image";
const STORAGE: &str = "cocoonset.cocoonstack.io/storage";
const PROBE_PORT: &str = "vm.cocoonstack.io/probe-port";
const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";
const VM_ID: &str = "vm.cocoonstack.io/id";
const IP: &str = "vm.cocoonstack.io/ip";
const VNC_PORT: &str = "vm.cocoonstack.io/vnc-port";
const TAHOE: &str = "ghcr.io/cocoonstack/cocoon-macos/tahoe:26";

fn mac_pod(name: &str, vm: &str, extra: &[(&str, &str)]) -> k8s_openapi::api::core::v1::Pod {
    let mut a: Vec<(&str, &str)> = vec![(OS, "macos"), (IMAGE, TAHOE)];
    a.extend_from_slice(extra);
    managed(name, vm, &a)
}

fn with_vnc(password: &str, ports: std::ops::RangeInclusive<u16>) -> Options {
    Options {
        macos: MacosSettings {
            vnc_password: Ok(Some(password.into())),
            vnc_ports: ports,
        },
        ..Default::default()
    }
}

/// The argv of every `cocoon-macos` invocation of `verb` so far.
fn mac_calls(env: &Env, verb: &str) -> Vec<Vec<String>> {
    calls_of(&env.mac, verb)
}

fn mac_calls_for(env: &Env, verb: &str, vm: &str) -> usize {
    mac_calls(env, verb)
        .iter()
        .filter(|argv| argv.iter().any(|a| a == vm))
        .count()
}

fn flag<'a>(argv: &'a [String], name: &str) -> Option<&'a str> {
    argv.iter()
        .position(|a| a == name)
        .and_then(|i| argv.get(i + 1))
        .map(String::as_str)
}

/// cocoon-net hands each named guest its address (the simulator's guest IP for its MAC).
fn lease(env: &Env, vms: &[&str]) {
    let pairs: Vec<(String, String)> = vms
        .iter()
        .map(|vm| env.mac.macos_guest(vm).unwrap().expect("the guest of a created vm"))
        .collect();
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(m, i)| (m.as_str(), i.as_str())).collect();
    write_leases(env, &refs);
}

fn ready_is(env: &Env, name: &str, status: &str, message_has: &str) -> bool {
    ready_condition(env, name).is_some_and(|(s, m)| s == status && m.contains(message_has))
}

fn event_message(env: &Env, name: &str, reason: &str) -> Option<String> {
    events(env, name).into_iter().find(|(r, _)| r == reason).map(|(_, m)| m)
}

/// Reads the first bytes a TCP service sends.
async fn greeting(host: &str, port: u16) -> String {
    use tokio::io::AsyncReadExt;
    let mut s = tokio::net::TcpStream::connect((host, port)).await.unwrap();
    let mut buf = [0u8; 12];
    s.read_exact(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf).into_owned()
}

/// Lifecycle: L7, L43, L65.
#[tokio::test(flavor = "multi_thread")]
async fn a_macos_pod_runs_waits_for_its_lease_turns_ready_on_the_ssh_banner_and_is_deleted() {
    let env = env(false).await;
    let releaser = Arc::new(RecordingReleaser::default());
    let d = start(
        &env,
        Options {
            releaser: Some(releaser.clone()),
            ..with_vnc("s3cret", 5900..=5999)
        },
    );
    create(&env, &mac_pod("mac-0", "vm-mac", &[])).await;

    eventually(30, "the VM runs and the pod waits for the guest's lease", || {
        env.mac.macos_running("vm-mac").unwrap() && ready_is(&env, "mac-0", "False", "waiting for guest dhcp lease")
    })
    .await;
    assert_eq!(phase(&env, "mac-0").as_deref(), Some("Running"));
    // Pulled once (it was not in the store), then run with the macOS path's flags.
    assert_eq!(mac_calls(&env, "image pull").len(), 1);
    let run = mac_calls(&env, "vm run");
    assert_eq!(run.len(), 1, "{run:?}");
    let argv = &run[0];
    assert_eq!(flag(argv, "--name"), Some("vm-mac"));
    assert_eq!(flag(argv, "--cpus"), Some("4"), "the macOS default");
    assert_eq!(flag(argv, "--memory"), Some("8192"), "the macOS default, MiB");
    assert_eq!(flag(argv, "--vnc"), Some("0"));
    assert_eq!(flag(argv, "--vnc-password"), Some("s3cret"));
    assert_eq!(flag(argv, "--net"), Some("cni"));
    assert!(argv.iter().any(|a| a == "--exit-on-reboot") && argv.iter().any(|a| a == "--random-smbios"));
    assert!(
        !argv.iter().any(|a| a == "--storage"),
        "no storage asked: the image's size"
    );
    assert_eq!(argv.last().map(String::as_str), Some(TAHOE));
    assert_eq!(annotation(&env, "mac-0", VM_ID).as_deref(), Some("qemu-vm-mac"));
    assert_eq!(annotation(&env, "mac-0", VNC_PORT).as_deref(), Some("5900"));
    assert_eq!(annotation(&env, "mac-0", IP), None, "no lease yet");
    // The display the annotation names is served (the simulator's qemu, on its loopback host).
    assert_eq!(
        greeting(&env.mac.macos_vnc_host().unwrap(), 5900).await,
        "RFB 003.008\n"
    );

    let (mac, ip) = env.mac.macos_guest("vm-mac").unwrap().unwrap();
    lease(&env, &["vm-mac"]);
    eventually(30, "Ready on the guest's SSH banner", || {
        ready_is(&env, "mac-0", "True", "")
    })
    .await;
    assert_eq!(pod_ip(&env, "mac-0").as_deref(), Some(ip.as_str()));
    eventually(10, "the ip annotation follows the lease", || {
        annotation(&env, "mac-0", IP).as_deref() == Some(ip.as_str())
    })
    .await;
    assert_eq!(lifecycle(&env, "mac-0").as_deref(), Some("ready"));

    delete(&env, "mac-0").await;
    eventually(30, "the pod is gone", || get(&env, "mac-0").is_none()).await;
    assert!(env.mac.macos_vm("vm-mac").unwrap().is_none(), "vm rm removed it");
    assert_eq!(mac_calls_for(&env, "vm rm", "vm-mac"), 1);
    assert_eq!(
        releaser.released.lock().unwrap().clone(),
        vec![mac.to_ascii_lowercase()],
        "{}",
        releaser.report()
    );
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_guest_without_a_mac_yet_is_inspected_again_at_the_set_pace_until_one_appears() {
    let env = env(false).await;
    env.mac.macos_add_image(TAHOE).unwrap();
    env.mac.set_settings(|s| s.macos_mac_pending = true).unwrap();
    let d = start(&env, Options::default());
    create(&env, &mac_pod("nomac-0", "vm-nomac", &[])).await;
    eventually(30, "the pod waits for the guest's network interface", || {
        ready_is(&env, "nomac-0", "False", "no MAC")
    })
    .await;
    // The probe asks every 200 ms here; the inspections keep to one per 500 ms
    // (fast_timings' mac_reinspect), one more allowed for the interval already begun.
    let (since, before) = (std::time::Instant::now(), mac_calls_for(&env, "vm inspect", "vm-nomac"));
    eventually(30, "inspected again", || {
        mac_calls_for(&env, "vm inspect", "vm-nomac") >= before + 3
    })
    .await;
    let again = (mac_calls_for(&env, "vm inspect", "vm-nomac") - before) as u128;
    let bound = since.elapsed().as_millis() / 500 + 1;
    assert!(again <= bound, "{again} inspections in {:?}", since.elapsed());

    let (_, ip) = env.mac.macos_guest("vm-nomac").unwrap().unwrap();
    lease(&env, &["vm-nomac"]);
    env.mac.set_settings(|s| s.macos_mac_pending = false).unwrap();
    eventually(30, "Ready once the MAC shows and its lease is found", || {
        ready_is(&env, "nomac-0", "True", "")
    })
    .await;
    assert_eq!(pod_ip(&env, "nomac-0").as_deref(), Some(ip.as_str()));
    d.kill().await;
}

/// Lifecycle: L64.
#[tokio::test(flavor = "multi_thread")]
async fn run_flags_round_vcpus_to_even_and_never_shrink_the_disk() {
    let env = env(false).await;
    env.mac.macos_add_image(TAHOE).unwrap();
    let d = start(&env, Options::default());
    let pod = with_resources(
        mac_pod("mac-0", "vm-sized", &[(STORAGE, "20Gi")]),
        &[("cpu", "2"), ("memory", "4Gi")],
        &[("cpu", "3"), ("memory", "6Gi")],
    );
    create(&env, &pod).await;
    eventually(30, "the VM runs", || env.mac.macos_running("vm-sized").unwrap()).await;
    let run = mac_calls(&env, "vm run");
    let argv = &run[0];
    assert_eq!(flag(argv, "--cpus"), Some("4"), "3 vCPUs round up to an even 4");
    assert_eq!(
        flag(argv, "--memory"),
        Some("4096"),
        "memory is the request's 4Gi (the limit only when no request: spec §4d)"
    );
    let virtual_size = env.mac.settings().unwrap().macos_image_virtual_size;
    assert_eq!(
        flag(argv, "--storage"),
        Some(virtual_size.to_string().as_str()),
        "20Gi is below the image's virtual size: the disk keeps the image's size"
    );
    assert!(!argv.iter().any(|a| a == "--vnc"), "no VNC password: no display");
    assert_eq!(mac_calls(&env, "image pull").len(), 0, "the image was already there");
    assert_eq!(annotation(&env, "mac-0", VNC_PORT), None);
    d.kill().await;
}

/// Lifecycle: L64.
#[tokio::test(flavor = "multi_thread")]
async fn a_live_vm_is_adopted_and_a_dead_record_is_started_never_run_again() {
    let env = env(false).await;
    env.mac.macos_add_image(TAHOE).unwrap();
    for vm in ["vm-live", "vm-dead"] {
        env.macos
            .run(&MacRunSpec {
                name: vm.into(),
                image: TAHOE.into(),
                cpus: 2,
                memory_mib: 4096,
                vnc: Some(Vnc {
                    display: 7,
                    password: "pw".into(),
                })
                .filter(|_| vm == "vm-live"),
                storage_bytes: None,
            })
            .await
            .unwrap();
    }
    let live_pid = env.mac.macos_vm("vm-live").unwrap().unwrap().pid;
    env.mac.macos_crash("vm-dead").unwrap();
    let runs_before = mac_calls(&env, "vm run").len();
    lease(&env, &["vm-live", "vm-dead"]);

    let d = start(&env, with_vnc("pw", 5900..=5999));
    create(&env, &mac_pod("live-0", "vm-live", &[])).await;
    create(&env, &mac_pod("dead-0", "vm-dead", &[])).await;
    eventually(30, "both Ready", || {
        ready_is(&env, "live-0", "True", "") && ready_is(&env, "dead-0", "True", "")
    })
    .await;
    assert_eq!(
        mac_calls(&env, "vm run").len(),
        runs_before,
        "nothing is run over an existing record"
    );
    assert_eq!(
        mac_calls_for(&env, "vm start", "vm-live"),
        0,
        "a live qemu is adopted as it is"
    );
    assert_eq!(env.mac.macos_vm("vm-live").unwrap().unwrap().pid, live_pid);
    assert_eq!(
        annotation(&env, "live-0", VNC_PORT).as_deref(),
        Some("5907"),
        "the display it serves"
    );
    let starts: Vec<Vec<String>> = mac_calls(&env, "vm start");
    assert_eq!(starts.len(), 1, "{starts:?}");
    assert_eq!(
        flag(&starts[0], "--vnc-password"),
        Some("pw"),
        "the password is passed again"
    );
    assert_eq!(starts[0].last().map(String::as_str), Some("vm-dead"));
    assert!(env.mac.macos_running("vm-dead").unwrap());
    let dead_port = annotation(&env, "dead-0", VNC_PORT).unwrap();
    assert_ne!(dead_port, "5907", "node-unique");
    assert_eq!(annotation(&env, "dead-0", VM_ID).as_deref(), Some("qemu-vm-dead"));
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_pulls_the_image_once_gets_unique_vnc_ports_and_a_freed_port_is_reused() {
    let env = env(false).await;
    env.mac.delay("image pull", Some(1), 500).unwrap();
    let d = start(&env, with_vnc("pw", 5900..=5999));
    for i in 0..3 {
        create(&env, &mac_pod(&format!("mac-{i}"), &format!("vm-{i}"), &[])).await;
    }
    eventually(60, "three VMs run", || {
        (0..3).all(|i| env.mac.macos_running(&format!("vm-{i}")).unwrap())
    })
    .await;
    assert_eq!(mac_calls(&env, "image pull").len(), 1, "one pull for the burst");
    eventually(10, "every pod has its port", || {
        (0..3).all(|i| annotation(&env, &format!("mac-{i}"), VNC_PORT).is_some())
    })
    .await;
    let mut ports: Vec<String> = (0..3)
        .map(|i| annotation(&env, &format!("mac-{i}"), VNC_PORT).unwrap())
        .collect();
    ports.sort();
    assert_eq!(ports, ["5900", "5901", "5902"]);
    let freed = annotation(&env, "mac-1", VNC_PORT).unwrap();
    delete(&env, "mac-1").await;
    eventually(30, "mac-1 is gone", || get(&env, "mac-1").is_none()).await;
    create(&env, &mac_pod("mac-3", "vm-3", &[])).await;
    eventually(30, "the new pod gets the freed port", || {
        annotation(&env, "mac-3", VNC_PORT).as_deref() == Some(freed.as_str())
    })
    .await;
    assert!(env.mac.macos_running("vm-3").unwrap());
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_exhausted_port_range_and_a_failed_run_leave_a_clear_event_and_no_vm() {
    let env = env(false).await;
    env.mac.macos_add_image(TAHOE).unwrap();
    // The first run fails as a taken port would: the VM is not removed (run is atomic), the
    // create is retried and the second run boots it.
    env.mac
        .inject_failure(
            "vm run",
            1,
            "Error: bind vnc port: listen tcp 0.0.0.0:5900: bind: address already in use",
            1,
        )
        .unwrap();
    let d = start(&env, with_vnc("pw", 5900..=5900));
    create(&env, &mac_pod("mac-0", "vm-a", &[])).await;
    eventually(30, "the run failure is on the pod", || {
        has_event(&env, "mac-0", "MacOSRunFailed")
    })
    .await;
    let msg = event_message(&env, "mac-0", "MacOSRunFailed").unwrap();
    assert!(msg.contains("vm-a") && msg.contains("bind vnc port"), "{msg}");
    eventually(60, "the retried create runs it", || {
        env.mac.macos_running("vm-a").unwrap()
    })
    .await;
    assert_eq!(mac_calls(&env, "vm rm").len(), 0, "a failed run never triggers rm");

    create(&env, &mac_pod("mac-1", "vm-b", &[])).await;
    eventually(30, "the exhausted range is on the pod", || {
        has_event(&env, "mac-1", "MacOSVNCPortsExhausted")
    })
    .await;
    let msg = event_message(&env, "mac-1", "MacOSVNCPortsExhausted").unwrap();
    assert!(
        msg.contains("5900-5900") && msg.contains("VK_COCOON_MACOS_VNC_PORTS"),
        "{msg}"
    );
    assert_eq!(mac_calls_for(&env, "vm run", "vm-b"), 0);
    assert!(env.mac.macos_vm("vm-b").unwrap().is_none(), "no VM");

    // Deleting the holder frees the port: the waiting pod's retry boots.
    delete(&env, "mac-0").await;
    eventually(60, "the waiting pod boots on the freed port", || {
        env.mac.macos_running("vm-b").unwrap() && annotation(&env, "mac-1", VNC_PORT).as_deref() == Some("5900")
    })
    .await;
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_refused_with_a_clear_event_and_boots_nothing() {
    let env = env(false).await;
    env.mac.macos_add_image(TAHOE).unwrap();
    let d = start(&env, Options::default());
    create(&env, &managed("noimg-0", "vm-noimg", &[(OS, "macos")])).await;
    wait_failed_with(&env, "noimg-0", "none is set").await;
    // The Event is posted on its own, not ordered with the lifecycle patch: wait for it too.
    eventually(30, "the refusal's Event", || {
        has_event(&env, "noimg-0", "InvalidVMSpec")
    })
    .await;
    let event = event_message(&env, "noimg-0", "InvalidVMSpec").expect("an Event");
    assert!(event.contains(IMAGE) && event.contains("vm-noimg"), "{event}");
    d.kill().await;

    for (password, says) in [("123456789", "at most 8 bytes"), ("pa\nss", "control character")] {
        let settings =
            MacosSettings::from_lookup(&|k: &str| (k == "COCOON_MACOS_VNC_PASSWORD").then(|| password.to_string()))
                .unwrap();
        let d = start(
            &env,
            Options {
                macos: settings,
                ..Default::default()
            },
        );
        let name = format!("pw-{}", password.len());
        create(&env, &mac_pod(&name, &format!("vm-{name}"), &[])).await;
        eventually(30, "the password refusal is on the pod", || {
            has_event(&env, &name, "MacOSVNCPasswordInvalid")
        })
        .await;
        let event = event_message(&env, &name, "MacOSVNCPasswordInvalid").unwrap();
        assert!(
            event.contains(says) && event.contains("COCOON_MACOS_VNC_PASSWORD"),
            "{event}"
        );
        assert!(!event.contains(password), "the password itself is never shown: {event}");
        d.kill().await;
    }
    assert!(mac_calls(&env, "vm run").is_empty(), "nothing was booted");
    assert!(env.mac.macos_vm_names().unwrap().is_empty());
}

/// Lifecycle: L52.
#[tokio::test(flavor = "multi_thread")]
async fn hibernate_is_refused_and_the_guest_keeps_running() {
    let env = env(false).await;
    env.mac.macos_add_image(TAHOE).unwrap();
    let d = start(&env, Options::default());
    create(&env, &mac_pod("mac-0", "vm-h", &[])).await;
    eventually(30, "the VM runs", || env.mac.macos_running("vm-h").unwrap()).await;
    lease(&env, &["vm-h"]);
    eventually(30, "Ready", || ready_is(&env, "mac-0", "True", "")).await;
    annotate(&env, "mac-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(30, "the refusal is on the pod", || {
        has_event(&env, "mac-0", "HibernateUnsupported")
    })
    .await;
    let event = event_message(&env, "mac-0", "HibernateUnsupported").unwrap();
    assert!(
        event.contains("vm-h") && event.contains("does not support hibernate"),
        "{event}"
    );
    assert!(env.mac.macos_running("vm-h").unwrap(), "nothing was stopped");
    assert!(env.sim.calls().unwrap().iter().all(|c| c.verb != "snapshot save"));
    assert_eq!(mac_calls(&env, "vm rm").len(), 0);
    // The lifecycle is failed (sticky, as for any failed operation), and the published status
    // says so while the update waits for the operator, rather than keeping the Ready it had.
    eventually(30, "Not Ready, with the refusal", || {
        ready_is(&env, "mac-0", "False", "does not support hibernate")
    })
    .await;
    d.kill().await;
}

/// Lifecycle: L65.
#[tokio::test(flavor = "multi_thread")]
async fn a_tcp_probe_port_replaces_the_ssh_banner_and_no_banner_is_not_ready() {
    let env = env(false).await;
    env.mac.macos_add_image(TAHOE).unwrap();
    // The guest's sshd is down; the guest serves a TCP service on port 8080.
    env.mac
        .set_settings(|s| {
            s.macos_sshd = false;
            s.guest_http_ports = vec![8080];
        })
        .unwrap();
    let d = start(&env, Options::default());
    create(&env, &mac_pod("tcp-0", "vm-tcp", &[(PROBE_PORT, "8080")])).await;
    create(&env, &mac_pod("ssh-0", "vm-ssh", &[])).await;
    eventually(30, "both run", || {
        env.mac.macos_running("vm-tcp").unwrap() && env.mac.macos_running("vm-ssh").unwrap()
    })
    .await;
    lease(&env, &["vm-tcp", "vm-ssh"]);
    eventually(30, "the probe-port pod is Ready on a TCP accept", || {
        ready_is(&env, "tcp-0", "True", "")
    })
    .await;
    eventually(30, "no SSH banner: not Ready, and the condition says why", || {
        ready_is(&env, "ssh-0", "False", "SSH- banner on port 22")
    })
    .await;
    d.kill().await;
}

/// Lifecycle: L66.
#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_daemon_re_registers_a_live_macos_vm_without_booting_it_again() {
    let env = env(false).await;
    env.mac.macos_add_image(TAHOE).unwrap();
    let d = start(&env, with_vnc("pw", 5900..=5999));
    create(&env, &mac_pod("mac-0", "vm-r", &[])).await;
    eventually(30, "the VM runs", || env.mac.macos_running("vm-r").unwrap()).await;
    lease(&env, &["vm-r"]);
    eventually(30, "Ready with the lease's ip annotated", || {
        ready_is(&env, "mac-0", "True", "") && annotation(&env, "mac-0", IP).is_some()
    })
    .await;
    let pid = env.mac.macos_vm("vm-r").unwrap().unwrap().pid;
    d.kill().await;

    // The lease file is gone for a while (cocoon-net restarting): the ip annotation stays.
    std::fs::write(&env.leases, "null").unwrap();
    let ip_before = annotation(&env, "mac-0", IP).unwrap();
    let d = start(&env, with_vnc("pw", 5900..=5999));
    eventually(30, "the restarted daemon tracks the VM", || {
        d.provider.state().vm_by_name("vm-r").is_some()
    })
    .await;
    assert_eq!(
        annotation(&env, "mac-0", IP).as_deref(),
        Some(ip_before.as_str()),
        "kept until a lease appears"
    );
    lease(&env, &["vm-r"]);
    eventually(30, "Ready again", || ready_is(&env, "mac-0", "True", "")).await;
    assert_eq!(mac_calls(&env, "vm run").len(), 1, "never run again");
    assert_eq!(mac_calls(&env, "vm start").len(), 0);
    assert_eq!(env.mac.macos_vm("vm-r").unwrap().unwrap().pid, pid);
    assert_eq!(annotation(&env, "mac-0", VNC_PORT).as_deref(), Some("5900"));
    d.kill().await;
}
