//! `vk-cocoon run` as a process: it connects through a kubeconfig, registers the node, runs a
//! pod as a VM through cocoon (the simulator), serves `/metrics` with the provider and policy
//! families, and stops on SIGTERM.

mod provider_support;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use provider_support::*;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn scrape(port: u16) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_daemon_runs_a_pod_serves_metrics_and_stops_on_sigterm() {
    let env = env(false).await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: {}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: fake\n    user: u\n    namespace: default\ncurrent-context: c\n",
            env.server.url()
        ),
    )
    .unwrap();
    let port = free_port();
    let (sim_key, sim_root) = env.sim.env();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vk-cocoon"))
        .arg("run")
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("KUBECONFIG", &kubeconfig)
        .env("VK_NODE_NAME", "vk-daemon")
        .env("VK_NODE_IP", "127.0.0.1")
        .env("COCOON_ROOT_DIR", dir.path())
        .env("VK_COCOON_BIN", runtime_support::sim_bin())
        .env(sim_key, sim_root)
        .env("VK_POLICY_CACHE_DIR", "")
        .env("VK_LEASES_PATH", &env.leases)
        .env("VK_COCOON_NET_CONTROL_SOCKET", "")
        .env("VK_METRICS_ADDR", format!("127.0.0.1:{port}"))
        .env("VK_LOG_LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();

    eventually(60, "node registered", || {
        env.server.store().get_as::<Node>(None, "vk-daemon").is_some()
    })
    .await;
    let mut pod = managed("d-0", "vm-daemon", &[("cocoonset.cocoonstack.io/image", "base")]);
    pod.spec.as_mut().unwrap().node_name = Some("vk-daemon".into());
    create(&env, &pod).await;
    eventually(60, "pod ready", || {
        lifecycle(&env, "d-0").as_deref() == Some("ready") && ready(&env, "d-0")
    })
    .await;
    assert!(vm_named(&env, "vm-daemon").await.is_some());

    let text = scrape(port).expect("metrics answer");
    assert!(
        text.contains(r#"cocoon_vk_pod_lifecycle_total{op="create",reason="",result="ok"} 1"#),
        "{text}"
    );
    assert!(text.contains("cocoon_vk_vm_boot_duration_seconds_count"), "{text}");
    assert!(
        text.contains("cocoon_vk_policy_decision_seconds"),
        "policy metrics are served too: {text}"
    );

    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "clean exit on SIGTERM: {status:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the daemon did not stop on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
