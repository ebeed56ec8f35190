//! exec, attach and port-forward from kubectl through the real apiserver, for a node that
//! declares `ExtendWebSocketsToKubelet` (the apiserver forwards kubectl's WebSockets to the
//! daemon) and one that does not (the apiserver translates them to SPDY/3.1). The simulator runs
//! exec'd commands as real processes, serves each VM's serial console and a web server on each
//! guest's loopback address.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::daemon::eventually;
use crate::kubelet_api::{Node, node_with_pod_on};

/// A node whose exec'd commands run for real; `websockets` = whether it declares them.
async fn exec_node(prefix: &str, websockets: bool) -> Option<Node> {
    let env: &[(&str, &str)] = if websockets {
        &[]
    } else {
        &[("VK_STREAMING_WEBSOCKETS", "false")]
    };
    let node = node_with_pod_on(
        prefix,
        Duration::from_secs(3600),
        |s| s.guest_http_ports = vec![8080],
        env,
    )
    .await?;
    node.machine
        .sim
        .on_exec(cocoon_sim::ExecRule {
            run: true,
            ..Default::default()
        })
        .unwrap();
    Some(node)
}

impl Node {
    /// kubectl as admin, for a streaming command (no request timeout: streams last).
    fn kubectl_stream(&self, args: &[&str]) -> Command {
        let mut c = Command::new("kubectl");
        c.arg("--kubeconfig")
            .arg(self.cluster.admin_kubeconfig_path())
            .args(["-n", &self.ns])
            .args(args)
            .env_remove("KUBECONFIG");
        c
    }

    /// `kubectl exec web-0 ARGS`, stdin from `input`: (exit code, stdout, stderr).
    fn exec(&self, flags: &[&str], argv: &[&str], input: Option<Vec<u8>>) -> (i32, Vec<u8>, String) {
        let mut args = vec!["exec"];
        args.extend_from_slice(flags);
        args.extend(["web-0", "--"]);
        args.extend_from_slice(argv);
        let mut child = self
            .kubectl_stream(&args)
            .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let feeder = input.map(|data| {
            let mut stdin = child.stdin.take().unwrap();
            std::thread::spawn(move || {
                let _ = stdin.write_all(&data);
            })
        });
        let out = child.wait_with_output().unwrap();
        if let Some(f) = feeder {
            f.join().unwrap();
        }
        (
            out.status.code().unwrap_or(-1),
            out.stdout,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// Pids of processes whose argv is exactly `argv`.
fn processes(argv: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

fn random_bytes(n: usize) -> Vec<u8> {
    // xorshift: random enough that a lost, duplicated or reordered chunk shows.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ n as u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

async fn exec_works(node: &Node) {
    let (code, out, err) = node.exec(&[], &["echo", "hi"], None);
    assert_eq!(
        (code, out.as_slice()),
        (0, &b"hi\n"[..]),
        "{err}\n{}",
        node.daemon.log()
    );

    let input = random_bytes(16 << 20);
    let (code, out, err) = node.exec(&["-i"], &["cat"], Some(input.clone()));
    assert_eq!(code, 0, "{err}");
    assert!(
        out == input,
        "16 MiB of stdin came back as {} bytes, not the same",
        out.len()
    );

    let (code, _, err) = node.exec(&[], &["sh", "-c", "exit 3"], None);
    assert_eq!(code, 3, "kubectl exits with the command's code: {err}");
    assert!(err.contains("command terminated with exit code 3"), "{err}");

    let (code, out, err) = node.exec(&[], &["sh", "-c", "echo out; echo err >&2; exit 0"], None);
    assert_eq!((code, out.as_slice()), (0, &b"out\n"[..]));
    assert_eq!(err, "err\n", "stderr stays apart from stdout");

    // The guest's stdin closes when kubectl's does.
    let (code, out, _) = node.exec(&["-i"], &["wc", "-c"], Some(b"12345".to_vec()));
    assert_eq!((code, String::from_utf8_lossy(&out).trim()), (0, "5"));
    assert_eq!(
        node.metric("cocoon_vk_kubelet_api_streams").unwrap_or(0.0),
        0.0,
        "no session left open"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_exec_through_spdy() {
    let Some(node) = exec_node("exec-spdy", false).await else {
        return;
    };
    exec_works(&node).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_exec_refuses_a_tty_and_stops_the_command_of_a_client_that_leaves() {
    let Some(node) = exec_node("exec-leave", false).await else {
        return;
    };
    // -t needs a terminal on kubectl's side: `script` gives it one.
    let out = Command::new("script")
        .args(["-qec"])
        .arg(format!(
            "kubectl --kubeconfig {} -n {} exec -it web-0 -- sh",
            node.cluster.admin_kubeconfig_path().display(),
            node.ns
        ))
        .arg("/dev/null")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("cocoon-agent, which allocates no terminal"), "{text}");

    let marker = format!("86399.{}", std::process::id());
    let mut kubectl: Child = node
        .kubectl_stream(&[
            "exec",
            "-i",
            "web-0",
            "--",
            "sh",
            "-c",
            &format!("echo ready; exec sleep {marker}"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(kubectl.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    assert_eq!(processes(&["sleep", &marker]).len(), 1, "the command runs");
    assert_eq!(node.metric("cocoon_vk_kubelet_api_streams"), Some(1.0));
    kubectl.kill().unwrap();
    kubectl.wait().unwrap();
    eventually(30, "the command is gone with its client", || async {
        processes(&["sleep", &marker]).is_empty()
    })
    .await;
    eventually(30, "no cocoon vm exec left", || async {
        node.machine.sim.pids_of("vm exec").unwrap().is_empty()
    })
    .await;
    eventually(30, "the session is closed", || async {
        node.metric("cocoon_vk_kubelet_api_streams") == Some(0.0)
    })
    .await;
}
