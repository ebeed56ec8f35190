//! `kubectl exec` through the real kube-apiserver against cocoon itself, in the same run:
//!
//! * round trip: `kubectl exec web-0 -- echo hi` (kubectl → apiserver → the daemon's kubelet
//!   API → `cocoon vm exec`) against the bare `cocoon vm exec VM -- echo hi` the daemon runs,
//!   with `kubectl get pod web-0` beside them (kubectl's own start-up and one apiserver call);
//! * throughput: `kubectl exec -i web-0 -- cat` with `BENCH_MIB` (default 256) MiB piped in and
//!   counted coming out, against the same bytes piped through `cocoon vm exec -i VM -- cat`;
//!   beside them the daemon's own share: the same bytes over a v5 WebSocket straight to the
//!   kubelet port (TLS, the apiserver's client certificate, 32 KiB stdin messages as kubectl
//!   sends), no kubectl and no apiserver in the way.
//!
//! Both transports to the daemon: a node that declares `ExtendWebSocketsToKubelet` (the
//! apiserver passes kubectl's WebSocket through) and one that does not (the apiserver
//! translates it to SPDY/3.1). The cocoon here is the simulator, which runs the argv as a real
//! child process — the baseline is exactly the call the daemon makes, so the ratios are the
//! cost of the path from kubectl to it.
//!
//! `cargo build --release -p cocoon-sim && cargo bench --bench streaming_exec` (the real
//! control plane of `tests/real_apiserver`: `VK_KUBE_TOOLS_DIR` or `../shared/tools/kubernetes`;
//! kubectl on PATH). `BENCH_ROUNDS` (default 30) sets the round-trip samples. Everything is on
//! loopback.

use std::io::{Read, Write};
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tokio::io::AsyncWrite;
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
use vk_cocoon::runtime::{CocoonRuntime, ExecIo, ExecSpec};
// The real-apiserver tests' harness: the control plane, a node with a running VM pod, its
// daemon, the simulator running exec'd commands for real.
use vk_test_support::bench::env_usize;
use vk_test_support::kubelet_node::{self, Node};

/// 1 MiB of xorshift bytes: incompressible, so no layer gets a free ride.
fn chunk() -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Counts what is written, keeps nothing.
#[derive(Default)]
struct Counter(u64);

impl AsyncWrite for Counter {
    fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.0 += buf.len() as u64;
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// kubectl as admin against `node`'s namespace.
fn kubectl(node: &Node, args: &[&str]) -> Command {
    let mut c = Command::new("kubectl");
    c.arg("--kubeconfig")
        .arg(node.cluster.admin_kubeconfig_path())
        .args(["-n", &node.ns])
        .args(args)
        .env_remove("KUBECONFIG");
    c
}

/// Runs `args` to completion, asserting it succeeds with `want` on stdout.
fn kubectl_ok(node: &Node, args: &[&str], want: &[u8]) -> Duration {
    let started = Instant::now();
    let out = kubectl(node, args).stdin(Stdio::null()).output().unwrap();
    let took = started.elapsed();
    assert!(
        out.status.success() && out.stdout.starts_with(want),
        "kubectl {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// `mib` MiB of `data` through `kubectl exec -i web-0 -- cat`: (bytes back, seconds).
fn kubectl_cat(node: &Node, data: &[u8], mib: usize) -> (u64, f64) {
    let mut child = kubectl(node, &["exec", "-i", "web-0", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let started = Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            for _ in 0..mib {
                stdin.write_all(data).unwrap();
            }
        });
        let mut buf = vec![0u8; 256 << 10];
        let mut got = 0u64;
        loop {
            match stdout.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got += n as u64,
                Err(e) => panic!("reading kubectl's stdout: {e}"),
            }
        }
        let status = child.wait().unwrap();
        let took = started.elapsed().as_secs_f64();
        let mut err = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
        assert!(status.success(), "kubectl exec -i cat: {err}");
        (got, took)
    })
}

/// The same bytes through `cocoon vm exec -i VM -- cat`, as the daemon calls it.
async fn bare_cat(node: &Node, vm: &str, data: &[u8], mib: usize) -> (u64, f64) {
    let (mut feed, mut input) = tokio::io::duplex(256 << 10);
    let spec = ExecSpec {
        argv: vec!["cat".into()],
        stdin: true,
        unbounded: true,
        ..Default::default()
    };
    let mut out = Counter::default();
    let mut err = Counter::default();
    let started = Instant::now();
    let feeding = async {
        for _ in 0..mib {
            tokio::io::AsyncWriteExt::write_all(&mut feed, data).await.unwrap();
        }
        drop(feed);
    };
    let io = ExecIo {
        stdin: Some(&mut input),
        stdout: &mut out,
        stderr: &mut err,
    };
    let (_, result) = tokio::join!(feeding, node.machine.runtime.exec(vm, &spec, io));
    result.unwrap();
    (out.0, started.elapsed().as_secs_f64())
}

/// TLS to the kubelet port with the certificate the apiserver presents to kubelets.
async fn tls_as_apiserver(node: &Node) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(node.cluster.ca_cert_path()).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let chain: Vec<_> = CertificateDer::pem_file_iter(node.cluster.kubelet_client_cert_path())
        .unwrap()
        .map(|c| c.unwrap())
        .collect();
    let key = PrivateKeyDer::from_pem_file(node.cluster.kubelet_client_key_path()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", node.daemon.kubelet_port))
        .await
        .unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap()
}

/// The same bytes through `cat` over a v5 WebSocket straight to the daemon.
async fn direct_cat(node: &Node, data: &[u8], mib: usize) -> (u64, f64) {
    let mut request = format!(
        "wss://127.0.0.1:{}/exec/{}/web-0/agent?command=cat&input=1&output=1",
        node.daemon.kubelet_port, node.ns
    )
    .into_client_request()
    .unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", "v5.channel.k8s.io".parse().unwrap());
    let started = Instant::now();
    let (socket, _) = tokio_tungstenite::client_async(request, tls_as_apiserver(node).await)
        .await
        .unwrap();
    let (mut tx, mut rx) = socket.split();
    let sending = async {
        for _ in 0..mib {
            for piece in data.chunks(32 << 10) {
                let mut message = Vec::with_capacity(piece.len() + 1);
                message.push(0u8);
                message.extend_from_slice(piece);
                tx.send(Message::Binary(message.into())).await.unwrap();
            }
        }
        // v5: stdin is over.
        tx.send(Message::Binary(vec![255u8, 0].into())).await.unwrap();
        tx
    };
    let receiving = async {
        let (mut got, mut status) = (0u64, Vec::new());
        while let Some(message) = rx.next().await {
            match message.unwrap() {
                Message::Binary(b) if b.first() == Some(&1) => got += b.len() as u64 - 1,
                Message::Binary(b) if b.first() == Some(&3) => status.extend_from_slice(&b[1..]),
                Message::Close(_) => break,
                _ => {}
            }
        }
        (got, String::from_utf8_lossy(&status).into_owned())
    };
    let (_tx, (got, status)) = tokio::join!(sending, receiving);
    assert!(status.contains("Success"), "the direct cat ended with {status}");
    (got, started.elapsed().as_secs_f64())
}

async fn bare_echo(node: &Node, vm: &str) -> Duration {
    let spec = ExecSpec {
        argv: vec!["echo".into(), "hi".into()],
        ..Default::default()
    };
    let started = Instant::now();
    let output = node.machine.runtime.exec_capture(vm, &spec, None).await.unwrap();
    let took = started.elapsed();
    assert_eq!((output.code, output.stdout.as_slice()), (0, &b"hi\n"[..]));
    took
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

struct Latency {
    p50: f64,
    p90: f64,
}

fn latency(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    Latency {
        p50: percentile(&samples, 0.5),
        p90: percentile(&samples, 0.9),
    }
}

/// Median of three throughput runs, MiB/s.
fn median_rate(mut runs: Vec<(u64, f64)>, want: u64, what: &str) -> f64 {
    for (got, _) in &runs {
        assert_eq!(*got, want, "{what}: bytes lost or added");
    }
    runs.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (_, secs) = runs[runs.len() / 2];
    want as f64 / (1 << 20) as f64 / secs
}

struct Figures {
    transport: &'static str,
    kubectl_get: Latency,
    kubectl_echo: Latency,
    bare_echo: Latency,
    kubectl_cat: f64,
    direct_cat: f64,
    bare_cat: f64,
}

async fn measure(node: Node, transport: &'static str, rounds: usize, mib: usize, data: &[u8]) -> Figures {
    let vm = node.machine.vms_named("vm-web").await.remove(0).id;
    let node = std::sync::Arc::new(node);
    // Warm-up: the apiserver's connection to the daemon, the daemon's authorization cache.
    for _ in 0..3 {
        kubectl_ok(&node, &["exec", "web-0", "--", "echo", "hi"], b"hi\n");
        bare_echo(&node, &vm).await;
    }
    let (mut get, mut echo, mut bare) = (Vec::new(), Vec::new(), Vec::new());
    // Interleaved, so a burst of load from elsewhere on the machine hits every row alike.
    for _ in 0..rounds {
        let n = node.clone();
        let (g, e) = tokio::task::spawn_blocking(move || {
            (
                kubectl_ok(&n, &["get", "pod", "web-0", "-o", "name"], b"pod/web-0"),
                kubectl_ok(&n, &["exec", "web-0", "--", "echo", "hi"], b"hi\n"),
            )
        })
        .await
        .unwrap();
        get.push(g);
        echo.push(e);
        bare.push(bare_echo(&node, &vm).await);
    }
    let want = (mib as u64) << 20;
    let (mut through, mut daemon_only, mut direct) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        let (n, d) = (node.clone(), data.to_vec());
        through.push(
            tokio::task::spawn_blocking(move || kubectl_cat(&n, &d, mib))
                .await
                .unwrap(),
        );
        daemon_only.push(direct_cat(&node, data, mib).await);
        direct.push(bare_cat(&node, &vm, data, mib).await);
    }
    Figures {
        transport,
        kubectl_get: latency(get),
        kubectl_echo: latency(echo),
        bare_echo: latency(bare),
        kubectl_cat: median_rate(through, want, "kubectl exec -i cat"),
        direct_cat: median_rate(daemon_only, want, "a WebSocket straight to the daemon"),
        bare_cat: median_rate(direct, want, "cocoon vm exec -i cat"),
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let rounds = env_usize("BENCH_ROUNDS", 30);
    let mib = env_usize("BENCH_MIB", 256);
    let data = chunk();
    let mut all = Vec::new();
    for (transport, websockets) in [("WebSocket", true), ("SPDY/3.1", false)] {
        let Some(node) = kubelet_node::exec_node_with(
            if websockets { "bench-ws" } else { "bench-spdy" },
            if websockets {
                &[]
            } else {
                &[("VK_STREAMING_WEBSOCKETS", "false")]
            },
        )
        .await
        else {
            eprintln!("streaming_exec: skipped (no Kubernetes control plane; see tests/real_apiserver)");
            return;
        };
        all.push(measure(node, transport, rounds, mib, &data).await);
    }
    println!("exec round trip (`echo hi`), {rounds} rounds each, ms:");
    println!(
        "{:<12} {:>22} {:>22} {:>22} {:>12}",
        "apiserver →", "kubectl get pod p50/p90", "kubectl exec p50/p90", "cocoon vm exec p50/p90", "exec ratio"
    );
    for f in &all {
        println!(
            "{:<12} {:>22} {:>22} {:>22} {:>11.1}×",
            f.transport,
            format!("{:.1} / {:.1}", f.kubectl_get.p50, f.kubectl_get.p90),
            format!("{:.1} / {:.1}", f.kubectl_echo.p50, f.kubectl_echo.p90),
            format!("{:.1} / {:.1}", f.bare_echo.p50, f.bare_echo.p90),
            f.kubectl_echo.p50 / f.bare_echo.p50
        );
    }
    println!();
    println!("cat throughput, {mib} MiB, median of 3, MiB/s:");
    println!(
        "{:<12} {:>20} {:>8} {:>26} {:>8} {:>22}",
        "apiserver →", "kubectl exec -i cat", "ratio", "WebSocket to the daemon", "ratio", "cocoon vm exec -i cat"
    );
    for f in &all {
        println!(
            "{:<12} {:>20.1} {:>6.1} % {:>26.1} {:>6.1} % {:>22.1}",
            f.transport,
            f.kubectl_cat,
            100.0 * f.kubectl_cat / f.bare_cat,
            f.direct_cat,
            100.0 * f.direct_cat / f.bare_cat,
            f.bare_cat
        );
    }
}
