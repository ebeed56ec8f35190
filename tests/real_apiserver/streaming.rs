//! exec, attach and port-forward from kubectl through the real apiserver, for a node that
//! declares `ExtendWebSocketsToKubelet` (the apiserver forwards kubectl's WebSockets to the
//! daemon) and one that does not (the apiserver translates them to SPDY/3.1). The simulator runs
//! exec'd commands as real processes, serves each VM's serial console and a web server on each
//! guest's loopback address.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::daemon::eventually;
use crate::kubelet_node::{Node, exec_node_with, plain_log, processes, web_port};

/// A node whose exec'd commands run for real; `websockets` = whether it declares them.
async fn exec_node(prefix: &str, websockets: bool) -> Option<Node> {
    let env: &[(&str, &str)] = if websockets {
        &[]
    } else {
        &[("VK_STREAMING_WEBSOCKETS", "false")]
    };
    exec_node_with(prefix, env).await
}

/// Open streaming sessions of `kind` (exec, attach, portforward) on the daemon's /metrics.
fn streams(node: &Node, kind: &str) -> f64 {
    node.metric(&format!("cocoon_vk_kubelet_api_streams{{kind=\"{kind}\"}}"))
        .unwrap_or(0.0)
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
    // kubectl exits on the status; the session ends when the connection has closed behind it.
    eventually(30, "no exec session left open", || async {
        streams(node, "exec") == 0.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_exec_through_spdy() {
    let Some(node) = exec_node("exec-spdy", false).await else {
        return;
    };
    exec_works(&node).await;
    let log = plain_log(&node);
    assert!(
        log.contains("transport=Spdy protocol=v5.channel.k8s.io") && !log.contains("transport=WebSocket"),
        "the apiserver translated to SPDY:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_exec_through_websockets() {
    let Some(node) = exec_node("exec-ws", true).await else {
        return;
    };
    let declared = node.kubectl(&[
        "get",
        "node",
        &node.machine.node,
        "-o",
        "jsonpath={.status.declaredFeatures}",
    ]);
    assert_eq!(
        String::from_utf8_lossy(&declared.stdout),
        r#"["ExtendWebSocketsToKubelet"]"#
    );
    exec_works(&node).await;
    let log = plain_log(&node);
    assert!(
        log.contains("transport=WebSocket protocol=v5.channel.k8s.io") && !log.contains("transport=Spdy"),
        "the apiserver forwarded kubectl's WebSockets, not SPDY:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_exec_refuses_a_tty_and_stops_the_command_of_a_client_that_leaves() {
    let Some(node) = exec_node("exec-leave", true).await else {
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
    // `ready` is printed just before the shell execs the sleep: wait for the exec.
    eventually(30, "the command runs", || async {
        processes(&["sleep", &marker]).len() == 1
    })
    .await;
    assert_eq!(streams(&node, "exec"), 1.0);
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
    eventually(30, "the session is closed", || async { streams(&node, "exec") == 0.0 }).await;
}

/// Lines of a child's pipe, read by a thread of their own.
fn lines_of(pipe: impl Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Bytes of a child's pipe as they come.
fn bytes_of(mut pipe: impl Read + Send + 'static) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    rx
}

/// Collects `rx` until the text holds `want` (at most 30 s).
fn until_contains(rx: &std::sync::mpsc::Receiver<Vec<u8>>, seen: &mut Vec<u8>, want: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !String::from_utf8_lossy(seen).contains(want) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(chunk) => seen.extend(chunk),
            Err(_) => panic!("no {want:?} within 30 s; got {:?}", String::from_utf8_lossy(seen)),
        }
    }
}

async fn attach_works(node: &Node) {
    let mut first = node
        .kubectl_stream(&["attach", "-i", "web-0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let output = bytes_of(first.stdout.take().unwrap());
    let mut typing = first.stdin.take().unwrap();
    typing.write_all(b"root\n").unwrap();
    let mut seen = Vec::new();
    // The serial console echoes what is typed and the guest's getty answers the line.
    until_contains(&output, &mut seen, "root\r\nvm-web login: ");
    assert_eq!(streams(node, "attach"), 1.0);

    // cloud-hypervisor serves one console client: a second attach is told so.
    let second = node.kubectl_stream(&["attach", "web-0"]).output().unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "{err}");
    assert!(err.contains("is attached by another session"), "{err}");

    typing.write_all(b"second line\r").unwrap();
    until_contains(&output, &mut seen, "second line\r\nvm-web login: ");
    first.kill().unwrap();
    first.wait().unwrap();
    eventually(30, "the console is released when its client leaves", || async {
        streams(node, "attach") == 0.0
    })
    .await;
    let mut again = node
        .kubectl_stream(&["attach", "-i", "web-0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let output = bytes_of(again.stdout.take().unwrap());
    again.stdin.as_mut().unwrap().write_all(b"again\n").unwrap();
    until_contains(&output, &mut Vec::new(), "again\r\nvm-web login: ");
    again.kill().unwrap();
    again.wait().unwrap();
}

async fn port_forward_works(node: &Node) {
    let vm = node.machine.vms_named("vm-web").await.remove(0);
    let guest_ip = vm.primary_ip().unwrap().to_string();
    let port = web_port(node);
    assert!(
        guest_ip.starts_with(&format!("{}.", node.machine.sim.subnet())),
        "the guest is on its machine's loopback subnet: {guest_ip}"
    );
    let mut pf = node
        .kubectl_stream(&["port-forward", "pod/web-0", &format!(":{port}"), ":9999"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines_of(pf.stdout.take().unwrap());
    let err = lines_of(pf.stderr.take().unwrap());
    let mut local = HashMap::new();
    while local.len() < 2 {
        let line = out
            .recv_timeout(Duration::from_secs(30))
            .expect("kubectl port-forward listens");
        // "Forwarding from 127.0.0.1:41235 -> 38117"
        if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
            let (local_port, remote) = rest.split_once(" -> ").unwrap();
            local.insert(remote.to_string(), local_port.parse::<u16>().unwrap());
        }
    }
    let web = local[&port.to_string()];
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    // Many connections over the one session, at once.
    let gets = (0..8).map(|i| {
        let client = client.clone();
        async move {
            let got = async {
                let r = client.get(format!("http://127.0.0.1:{web}/page-{i}")).send().await?;
                Ok::<_, reqwest::Error>((r.status().as_u16(), r.text().await?))
            };
            (i, got.await)
        }
    });
    for (i, got) in futures::future::join_all(gets).await {
        let (status, body) = got.unwrap_or_else(|e| {
            let said: Vec<String> = err.try_iter().collect();
            panic!("GET /page-{i} through kubectl port-forward: {e:?}\nkubectl said: {said:?}")
        });
        assert_eq!(status, 200);
        assert_eq!(body, format!("hello from vm-web ({guest_ip}:{port}): GET /page-{i}\n"));
    }
    let upload = random_bytes(1 << 20);
    let echoed = client
        .post(format!("http://127.0.0.1:{web}/echo"))
        .body(upload.clone())
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert!(
        echoed == upload,
        "1 MiB through the guest came back as {} bytes",
        echoed.len()
    );
    assert_eq!(streams(node, "portforward"), 1.0, "one session for all of them");

    // Nothing listens on 9999 in the guest: the client is told why.
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", local["9999"]))
        .await
        .unwrap();
    let _ = tokio::io::AsyncWriteExt::write_all(&mut conn, b"hello?").await;
    let mut rest = Vec::new();
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut conn, &mut rest).await;
    assert!(rest.is_empty(), "no guest answered");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let reason = loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = err.recv_timeout(left).expect("kubectl reports the failed connection");
        if line.contains("error forwarding port 9999") {
            break line;
        }
    };
    assert!(
        reason.contains(&format!("to pod {}/web-0", node.ns))
            && reason.contains(&format!("failed to connect to {guest_ip}:9999 inside the VM")),
        "{reason}"
    );
    let _ = pf.kill();
    pf.wait().unwrap();
    eventually(30, "the port-forward session ends with kubectl", || async {
        streams(node, "portforward") == 0.0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_attach_and_port_forward_through_websockets() {
    let Some(node) = exec_node("attach-ws", true).await else {
        return;
    };
    attach_works(&node).await;
    port_forward_works(&node).await;
    let log = plain_log(&node);
    assert!(log.contains("endpoint=attach transport=WebSocket"), "{log}");
    assert!(
        log.contains("endpoint=portforward transport=WebSocket protocol=SPDY/3.1+portforward.k8s.io"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_attach_and_port_forward_through_spdy() {
    let Some(node) = exec_node("attach-spdy", false).await else {
        return;
    };
    attach_works(&node).await;
    port_forward_works(&node).await;
    let log = plain_log(&node);
    assert!(log.contains("endpoint=attach transport=Spdy"), "{log}");
    assert!(
        log.contains("endpoint=portforward transport=Spdy protocol=portforward.k8s.io"),
        "{log}"
    );
}
