//! The official Python client (`kubernetes`, the version `.ci/test` installs) against the
//! daemon through the real apiserver, as its users run it: `kubernetes.stream.portforward`
//! speaks the kubelet's own WebSocket port-forward protocol (`v4.channel.k8s.io`: the ports in
//! the query, a data and an error channel per port), not kubectl's SPDY tunnel. The Java and
//! JavaScript clients speak the same.

use std::path::PathBuf;
use std::time::Duration;

use crate::kubelet_node::{Node, exec_node_with, plain_log, web_port};

/// The interpreter with the `kubernetes` package: `VK_TEST_PYTHON` (what `.ci/test` sets up),
/// else `python3`. `None` (the test is skipped) when it lacks the package, except under
/// `CI=true`, where that fails the test.
fn python() -> Option<String> {
    let python = std::env::var("VK_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let found = std::process::Command::new(&python)
        .args(["-c", "import kubernetes"])
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(python);
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{python} has no `kubernetes` package: .ci/test installs it (pip install kubernetes==…) and sets VK_TEST_PYTHON"
    );
    eprintln!("skipped: {python} has no `kubernetes` package (pip install kubernetes, or set VK_TEST_PYTHON)");
    None
}

/// Runs tests/real_apiserver/python/portforward.py against pod web-0 of `node`: its JSON.
async fn python_port_forward(python: &str, node: &Node, closed_port: u16) -> serde_json::Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/real_apiserver/python/portforward.py");
    let run = tokio::process::Command::new(python)
        .arg(script)
        .arg(node.cluster.admin_kubeconfig_path())
        .args([&node.ns, "web-0", &web_port(node).to_string(), &closed_port.to_string()])
        .env_remove("KUBECONFIG")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("the Python client finishes within 3 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the Python client failed:\n{}\n{stdout}\n--- daemon log ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        plain_log(node)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

async fn python_port_forward_works(prefix: &str, env: &[(&str, &str)]) {
    let Some(python) = python() else { return };
    let Some(node) = exec_node_with(prefix, env).await else {
        return;
    };
    let vm = node.machine.vms_named("vm-web").await.remove(0);
    let guest_ip = vm.primary_ip().unwrap().to_string();
    let port = web_port(&node);
    let r = python_port_forward(&python, &node, 9999).await;

    let get = r["get"].as_str().unwrap();
    assert!(get.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
    assert!(
        get.ends_with(&format!(
            "\r\n\r\nhello from vm-web ({guest_ip}:{port}): GET /from-python\n"
        )),
        "the guest's answer, whole: {r}"
    );
    assert!(r["get_error"].is_null(), "{r}");
    // Nothing listens on 9999 in the guest: its error channel says so, in the kubelet's words.
    assert_eq!(r["closed_read"], "", "no guest answered: {r}");
    let why = r["closed_error"]
        .as_str()
        .unwrap_or_else(|| panic!("an error for port 9999: {r}"));
    assert!(
        why.starts_with(&format!("error forwarding port 9999 to pod {}/web-0", node.ns))
            && why.contains(&format!("failed to connect to {guest_ip}:9999 inside the VM")),
        "{why}"
    );

    assert_eq!(r["echo_status"], "HTTP/1.1 200 OK", "{r}");
    assert_eq!(r["echo_back_bytes"], 4 << 20, "{r}");
    assert_eq!(r["echo_back_sha256"], r["echo_sent_sha256"], "4 MiB came back the same");
    assert!(r["echo_error"].is_null(), "{r}");

    let log = plain_log(&node);
    assert!(
        log.contains("endpoint=portforward transport=WebSocket protocol=v4.channel.k8s.io"),
        "the kubelet's channel protocol:\n{log}"
    );
    crate::daemon::eventually(30, "no port-forward session left open", || async {
        node.metric(r#"cocoon_vk_kubelet_api_streams{kind="portforward"}"#)
            .unwrap_or(0.0)
            == 0.0
    })
    .await;
}

/// The node declares `ExtendWebSocketsToKubelet` (the default): the apiserver hands the
/// client's WebSocket on as it is.
#[tokio::test(flavor = "multi_thread")]
async fn python_client_port_forward_round_trip() {
    python_port_forward_works("py-pf", &[]).await;
}

/// A node that does not declare them: the apiserver still proxies a channel-protocol
/// port-forward as it is (only kubectl's SPDY tunnel is translated).
#[tokio::test(flavor = "multi_thread")]
async fn python_client_port_forward_round_trip_without_declared_websockets() {
    python_port_forward_works("py-pf-spdy", &[("VK_STREAMING_WEBSOCKETS", "false")]).await;
}
