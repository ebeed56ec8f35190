//! A slowloris flood against each listener of the daemon, with the daemon as its own process
//! (`vk-cocoon run` against the real kube-apiserver of `tests/real_apiserver`, default
//! settings): `/metrics`, the peer port and the kubelet API (TLS) each get `BENCH_FLOOD`
//! (default 5,000) connections that send `GET / HTTP/1.1\r\n` and nothing more. Per listener
//! the table shows how many the daemon held at the peak (its own descriptor count, read from
//! `/proc/PID/fd`), how many it closed at once (past its cap), when it closed the last one, and
//! its descriptors and RSS before, at the peak and after, against the before figure.
//!
//! `cargo bench --bench listener_flood` (the control plane: `VK_KUBE_TOOLS_DIR` or
//! `../shared/tools/kubernetes`; the client side needs `ulimit -n` above the flood size).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
// The real-apiserver tests' harness: the control plane and a node machine running the daemon.
use vk_test_support::daemon::{Machine, free_port};
use vk_test_support::kube_support::{self, signer};
use vk_test_support::provider_support;

const TOKEN: &str = "the-flood-benchmark-peer-token-0123456789";

/// The daemon's descriptors and RSS (MiB).
#[derive(Clone, Copy, Debug)]
struct Sample {
    fds: usize,
    rss: f64,
}

fn sample(pid: i32) -> Sample {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("the daemon is running")
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the daemon is running");
    let rss_kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status");
    Sample {
        fds,
        rss: rss_kib / 1024.0,
    }
}

/// How a listener is reached.
#[derive(Clone)]
enum Dial {
    Plain,
    Tls(tokio_rustls::TlsConnector),
}

/// What became of one half-request: whether the daemon took it past the accept (a TLS
/// handshake answered, or a plain connection not reset at once) and when it was closed,
/// counted from the flood's start.
struct Outcome {
    closed_at: Duration,
    open_for: Duration,
}

async fn wait_closed<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, bound: Duration) -> bool {
    let _ = s.write_all(b"GET / HTTP/1.1\r\n").await;
    let mut buf = [0u8; 1024];
    let closed = async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(bound, closed).await.is_ok()
}

async fn half_request(addr: SocketAddr, dial: Dial, started: Instant) -> Outcome {
    let bound = Duration::from_secs(120);
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let opened = Instant::now();
    let closed = match dial {
        Dial::Plain => wait_closed(tcp, bound).await,
        Dial::Tls(connector) => match connector.connect(ServerName::from(addr.ip()), tcp).await {
            Ok(tls) => wait_closed(tls, bound).await,
            // Closed before the handshake: refused at the cap.
            Err(_) => true,
        },
    };
    assert!(closed, "a half-request to {addr} is still open after {bound:?}");
    Outcome {
        closed_at: started.elapsed(),
        open_for: opened.elapsed(),
    }
}

struct Row {
    listener: &'static str,
    opened: usize,
    closed_at_once: usize,
    held_peak: usize,
    closed_by: Duration,
    held_closed_after: Duration,
    before: Sample,
    peak: Sample,
    after: Sample,
}

async fn flood(listener: &'static str, pid: i32, addr: SocketAddr, dial: Dial, n: usize) -> Row {
    let before = sample(pid);
    let started = Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|_| tokio::spawn(half_request(addr, dial.clone(), started)))
        .collect();
    let mut peak = before;
    let mut outcomes = Vec::with_capacity(n);
    for t in tasks {
        while !t.is_finished() {
            let now = sample(pid);
            if now.fds > peak.fds {
                peak.fds = now.fds;
            }
            peak.rss = peak.rss.max(now.rss);
            // The sampling period, not a wait for anything.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        outcomes.push(t.await.expect("a half-request task"));
    }
    // The daemon's descriptors come back once its connection tasks have ended.
    let settled = Instant::now();
    let mut after = sample(pid);
    while after.fds > before.fds && settled.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = sample(pid);
    }
    // Held: closed by the header deadline (a second or more after the connect); the rest were
    // closed at the accept.
    let mut held: Vec<Duration> = outcomes
        .iter()
        .map(|o| o.open_for)
        .filter(|d| *d >= Duration::from_secs(1))
        .collect();
    held.sort();
    Row {
        listener,
        opened: n,
        closed_at_once: n - held.len(),
        held_peak: peak.fds.saturating_sub(before.fds),
        closed_by: outcomes.iter().map(|o| o.closed_at).max().unwrap_or_default(),
        held_closed_after: held.get(held.len() / 2).copied().unwrap_or_default(),
        before,
        peak,
        after,
    }
}

async fn until_listening(addr: SocketAddr) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while TcpStream::connect(addr).await.is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {addr}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn main() {
    let n: usize = std::env::var("BENCH_FLOOD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let Some(cluster) = kube_support::shared().await else {
            eprintln!("listener_flood: no Kubernetes control plane (set VK_KUBE_TOOLS_DIR); nothing measured");
            return;
        };
        let peer_port = free_port();
        let fleet = provider_support::fleet_ca::FleetCa::new("the fleet's peer CA");
        let mut machine = Machine::new("vk-flood")
            .with_registry()
            .with_peer(&fleet, "127.0.0.1", peer_port, TOKEN, None);
        // Debug logging of every refused connection would measure the log, not the listener.
        machine.daemon_env.push(("VK_LOG_LEVEL".into(), "info".into()));
        // What a cluster operator does: approve the kubelet API's CSR (the controller-manager
        // signs it).
        let admin = cluster.admin_client().await;
        let _signer = signer::start(admin, &cluster.state_dir().join("pki"), signer::Mode::Approve, &machine.node);
        let daemon = machine.start_daemon(cluster);
        machine.wait_registered(cluster).await;
        let pid = daemon.pid();
        let metrics: SocketAddr = ([127, 0, 0, 1], daemon.metrics_port).into();
        let peer: SocketAddr = ([127, 0, 0, 1], peer_port).into();
        let kubelet: SocketAddr = ([127, 0, 0, 1], daemon.kubelet_port).into();
        for addr in [metrics, peer, kubelet] {
            until_listening(addr).await;
        }
        // The kubelet API's certificate is signed by the cluster CA once its CSR is approved.
        let (_, roots) = vk_cocoon::kubelet_api::tls::load_client_ca(&cluster.ca_cert_path()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(vk_cocoon::kubelet_api::tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config));
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            // Bound, not the daemon's: it accepts nothing until its certificate is there.
            let tcp = TcpStream::connect(kubelet).await.unwrap();
            let handshake = tls.connect(ServerName::from(kubelet.ip()), tcp);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(2), handshake).await {
                break;
            }
            assert!(Instant::now() < deadline, "the kubelet API never served its certificate");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        let rows = vec![
            flood("/metrics", pid, metrics, Dial::Plain, n).await,
            flood("peer", pid, peer, Dial::Plain, n).await,
            flood("kubelet API (TLS)", pid, kubelet, Dial::Tls(tls), n).await,
        ];
        println!();
        println!(
            "slowloris flood: {n} connections per listener, each sending `GET / HTTP/1.1\\r\\n` and nothing more; vk-cocoon run with default settings"
        );
        println!(
            "| listener | opened | closed at once (cap) | held at peak (daemon fds) | held ones closed after (median) | all closed by | daemon fds before / peak / after | daemon RSS MiB before / peak / after |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for r in &rows {
            println!(
                "| {} | {} | {} | {} | {:.1} s | {:.1} s | {} / {} / {} | {:.1} / {:.1} ({:.2}×) / {:.1} ({:.2}×) |",
                r.listener,
                r.opened,
                r.closed_at_once,
                r.held_peak,
                r.held_closed_after.as_secs_f64(),
                r.closed_by.as_secs_f64(),
                r.before.fds,
                r.peak.fds,
                r.after.fds,
                r.before.rss,
                r.peak.rss,
                r.peak.rss / r.before.rss,
                r.after.rss,
                r.after.rss / r.before.rss,
            );
        }
        drop(daemon);
        drop(machine);
    });
}
