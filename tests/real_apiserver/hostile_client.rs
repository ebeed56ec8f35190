//! The streaming and log endpoints against a hostile client, on the real kubelet API listener of
//! a daemon process: what any tenant with `pods/log`, `pods/exec` or `pods/portforward` on a pod
//! of the node can send (the apiserver passes SPDY through byte for byte, and the log query as
//! given), and what a guest can print on its console. Each test shows the daemon staying up,
//! bounded and answering: memory is the daemon's own peak RSS (`VmHWM`), never a timing.

use std::io::Write;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vk_cocoon::kubelet_api::streaming::spdy::codec::frame::{Frame, encode, rst};
use vk_cocoon::kubelet_api::streaming::spdy::codec::{Decoder, Deflater, HeaderBlock, Limits};

use crate::daemon::{IMAGE, create_pod, eventually, managed_pod, wait_up};
use crate::kubelet_node::{Node, exec_node_with, node_with_pod_on, plain_log};
use crate::streaming_direct::{Tls, exec_path, spdy, streamer_token, ws};

/// A `/proc/<daemon>/status` figure, in bytes.
fn daemon_memory(node: &Node, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", node.daemon.pid())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in {status}"));
    kib * 1024
}

/// The client the apiserver uses for the kubelet (its kubelet-client certificate).
fn as_apiserver(node: &Node) -> reqwest::Client {
    let mut pem = std::fs::read(node.cluster.kubelet_client_cert_path()).unwrap();
    pem.extend(std::fs::read(node.cluster.kubelet_client_key_path()).unwrap());
    node.client_builder()
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .build()
        .unwrap()
}

/// Reads a streamed body until what came so far ends with the line `marker`, within
/// `deadline`; the bytes read.
async fn read_until(response: reqwest::Response, marker: &str, deadline: Duration, what: &str) -> u64 {
    let started = Instant::now();
    let want = format!("{marker}\n");
    let mut stream = response.bytes_stream();
    let mut total = 0u64;
    // The last bytes seen (the line may straddle two chunks).
    let mut tail: Vec<u8> = Vec::new();
    loop {
        let left = deadline.saturating_sub(started.elapsed());
        let chunk = tokio::time::timeout(left, stream.next())
            .await
            .unwrap_or_else(|_| panic!("{what}: the last line did not arrive in {deadline:?} ({total} bytes came)"))
            .unwrap_or_else(|| panic!("{what}: the stream ended before the last line ({total} bytes came)"))
            .unwrap_or_else(|e| panic!("{what}: {e} ({total} bytes came)"));
        total += chunk.len() as u64;
        tail.extend_from_slice(&chunk[chunk.len().saturating_sub(want.len())..]);
        tail.drain(..tail.len().saturating_sub(want.len()));
        if tail.ends_with(want.as_bytes()) {
            return total;
        }
    }
}

const LAST_LINE: &str = "the very last line of the guest's log";

/// `mib` MiB of 100-byte lines appended to the VM's log (what a guest printing on its serial
/// console gets there), then [`LAST_LINE`].
fn grow_log(node: &Node, mib: usize) {
    let (files, _) = node.machine.sim.vm_files_of("vm-web").unwrap();
    let mut log = std::fs::OpenOptions::new().append(true).open(&files.log_file).unwrap();
    let mut block = String::with_capacity(1 << 20);
    let mut n = 0u64;
    for _ in 0..mib {
        block.clear();
        while block.len() + 100 <= 1 << 20 {
            n += 1;
            block.push_str(&format!("guest filler line {n:012} {}\n", "x".repeat(69)));
        }
        log.write_all(block.as_bytes()).unwrap();
    }
    writeln!(log, "{LAST_LINE}").unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_log_queries_and_huge_logs_are_served_bounded() {
    let Some(node) = node_with_pod_on("logs-hostile", |_| {}, &[]).await else {
        return;
    };
    let client = as_apiserver(&node);
    let logs = |query: &str| node.url(&format!("/containerLogs/{}/web-0/agent?{query}", node.ns));

    // A sinceSeconds past the calendar is the client's mistake: 400, the connection lives on.
    let r = client
        .get(logs("sinceSeconds=99999999999999"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("sinceSeconds=99999999999999: no answer ({e})\n{}", plain_log(&node)));
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("sinceSeconds"));

    // A guest line whose elapsed time is past the calendar is shown, not a panic.
    node.machine
        .sim
        .append_vm_log_raw("vm-web", "cloud-hypervisor: 9000000000000s: x\n")
        .unwrap();
    let r = client
        .get(logs("timestamps=true&sinceSeconds=3600"))
        .send()
        .await
        .unwrap_or_else(|e| panic!("a huge elapsed time in the log: no answer ({e})\n{}", plain_log(&node)));
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("cloud-hypervisor: 9000000000000s: x"));

    // 100 MiB of log (a firecracker guest's console is its log: the tenant sets its size).
    grow_log(&node, 100);
    // Against the peak so far: what serving the log adds on top of it.
    let before = daemon_memory(&node, "VmHWM");

    // `kubectl logs -f` three times at once, and once with a huge tailLines: each streams the
    // whole log to its last line, while the daemon's workers stay free for everything else.
    let mut follows = Vec::new();
    for query in [
        "follow=true",
        "follow=true",
        "follow=true",
        "follow=true&tailLines=1000000000",
    ] {
        let r = client.get(logs(query)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{query}");
        follows.push(tokio::spawn(read_until(r, LAST_LINE, Duration::from_secs(120), query)));
    }
    let health = tokio::time::timeout(Duration::from_secs(20), client.get(node.url("/healthz")).send())
        .await
        .expect("/healthz answers while logs are being streamed")
        .unwrap();
    assert_eq!(health.status(), 200);
    for f in follows {
        let total = f.await.unwrap();
        assert!(total > 100_000_000, "the whole log came: {total} bytes");
    }

    // The snapshot path (`cocoon vm logs --tail N`) holds a bounded tail of cocoon's output.
    let r = client.get(logs("tailLines=1000000000")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let body = r.bytes().await.unwrap();
    assert!(body.ends_with(format!("{LAST_LINE}\n").as_bytes()));
    assert!(
        body.len() < 100 << 20,
        "{} bytes of a 100 MiB log in one answer",
        body.len()
    );

    let peak = daemon_memory(&node, "VmHWM");
    eprintln!(
        "serving a 100 MiB log five times raised the daemon's peak RSS by {} MiB",
        peak.saturating_sub(before) >> 20
    );
    assert!(
        peak < before + (96 << 20),
        "the daemon's peak RSS grew by {} MiB serving a 100 MiB log",
        (peak - before) >> 20
    );
}

/// SYN_STREAM `stream_id` with `pairs`, compressed in the client's one zlib stream.
fn syn(deflater: &mut Deflater, stream_id: u32, pairs: &[(&str, &str)], out: &mut BytesMut) {
    let headers = deflater.deflate(&HeaderBlock(
        pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect(),
    ));
    encode(
        &Frame::SynStream {
            stream_id,
            associated_to: 0,
            priority: 0,
            slot: 0,
            fin: false,
            unidirectional: false,
            headers,
        },
        out,
    )
    .unwrap();
}

/// Reads the session's frames in the background (so it never blocks on this client), sending
/// each to the returned channel.
fn frames_of(read: tokio::io::ReadHalf<Tls>) -> tokio::sync::mpsc::UnboundedReceiver<Frame> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut read = read;
        let mut decoder = Decoder::new(Limits {
            max_data_piece: usize::MAX,
            ..Limits::default()
        });
        let mut buf = BytesMut::new();
        loop {
            loop {
                match decoder.decode(&mut buf) {
                    Ok(Some(f)) => {
                        if tx.send(f).is_err() {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(_) => return,
                }
            }
            match read.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    rx
}

/// Writes `bytes` and flushes them: a TLS writer may accept bytes into its own buffer when
/// the socket is full and send them only on a later write or a flush, and the test's next
/// step waits for the daemon's answer to them.
async fn send(write: &mut tokio::io::WriteHalf<Tls>, bytes: &[u8]) {
    write.write_all(bytes).await.unwrap();
    write.flush().await.unwrap();
}

/// Waits for the frame `want` picks, within 60 s. On failure the message names what did
/// arrive meanwhile (how many frames of each kind, the resets with their statuses).
async fn frame_matching(
    frames: &mut tokio::sync::mpsc::UnboundedReceiver<Frame>,
    what: &str,
    mut want: impl FnMut(&Frame) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let mut resets = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let frame = match tokio::time::timeout(left, frames.recv()).await {
            Ok(Some(f)) if want(&f) => return,
            Ok(Some(f)) => f,
            Ok(None) => panic!("the session closed before {what}; meanwhile {seen:?}, resets {resets:?}"),
            Err(_) => panic!("no {what} in 60 s; meanwhile {seen:?}, resets (stream, status) {resets:?}"),
        };
        let kind = format!("{frame:?}");
        let kind = kind.split([' ', '{', '(']).next().unwrap_or_default().to_string();
        *seen.entry(kind).or_default() += 1;
        if let Frame::RstStream { stream_id, status } = frame
            && resets.len() < 300
        {
            resets.push((stream_id, status));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_portforward_flood_of_half_open_streams_stays_bounded() {
    // A creation timeout long enough that all the streams below are in before any expires.
    let Some(node) = exec_node_with("pf-flood", &[("VK_STREAMING_CREATION_TIMEOUT", "10s")]).await else {
        return;
    };
    let token = streamer_token(&node, "streamer", &["get", "create"]).await;
    let path = format!("/portForward/{}/web-0", node.ns);
    let (session, head) = spdy(&node, &path, "portforward.k8s.io", &token).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let (read, mut write) = tokio::io::split(session);
    let mut frames = frames_of(read);
    let before = daemon_memory(&node, "VmHWM");

    // 20 000 streams of a type port-forward does not know, each with its own 60 KB request id
    // (a few hundred bytes compressed): each is reset, and nothing of it may stay behind.
    let mut deflater = Deflater::new();
    let filler = "a".repeat(60_000);
    let mut id = 1u32;
    for batch in 0..100 {
        let mut out = BytesMut::new();
        for i in 0..200 {
            let requestid = format!("{batch:04}{i:04}{filler}");
            syn(
                &mut deflater,
                id,
                &[("streamtype", "bogus"), ("port", "80"), ("requestid", &requestid)],
                &mut out,
            );
            id += 2;
        }
        send(&mut write, &out).await;
    }
    let mut ping = BytesMut::new();
    encode(&Frame::Ping { id: 1 }, &mut ping).unwrap();
    send(&mut write, &ping).await;
    frame_matching(&mut frames, "the PING answer after the flood", |f| {
        *f == Frame::Ping { id: 1 }
    })
    .await;
    let grown = daemon_memory(&node, "VmHWM").saturating_sub(before);
    eprintln!(
        "20 000 refused streams raised the daemon's peak RSS by {} MiB",
        grown >> 20
    );
    assert!(
        grown < 200 << 20,
        "20 000 refused streams left the daemon {} MiB bigger",
        grown >> 20
    );

    // Data streams whose error stream never comes: at most the session's connection limit wait
    // for their pair; the one past it is refused at once.
    let limit = 256;
    let mut out = BytesMut::new();
    for i in 0..=limit {
        syn(
            &mut deflater,
            id,
            &[
                ("streamtype", "data"),
                ("port", "80"),
                ("requestid", &format!("half-{i}")),
            ],
            &mut out,
        );
        id += 2;
    }
    let refused = id - 2;
    send(&mut write, &out).await;
    frame_matching(&mut frames, "the refusal of the stream past the limit", |f| {
        *f == Frame::RstStream {
            stream_id: refused,
            status: rst::REFUSED_STREAM,
        }
    })
    .await;
    // The ones that wait are reset when the creation timeout is up: none stays behind.
    let mut cancelled = std::collections::HashSet::new();
    while cancelled.len() < limit {
        frame_matching(
            &mut frames,
            "the reset of a connection that never got its error stream",
            |f| matches!(f, Frame::RstStream { stream_id, status: rst::CANCEL } if cancelled.insert(*stream_id)),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn peer_controlled_values_cannot_forge_log_lines() {
    let Some(node) = exec_node_with("log-inject", &[]).await else {
        return;
    };
    let token = streamer_token(&node, "streamer", &["get", "create"]).await;

    // exec: a stream type with a line break in it.
    let (session, head) = spdy(
        &node,
        &exec_path(&node, "command=true&output=1"),
        "v4.channel.k8s.io",
        &token,
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let (read, mut write) = tokio::io::split(session);
    let mut frames = frames_of(read);
    let mut deflater = Deflater::new();
    let mut out = BytesMut::new();
    syn(&mut deflater, 1, &[("streamtype", "x\nFORGED-EXEC-ENTRY")], &mut out);
    send(&mut write, &out).await;
    frame_matching(&mut frames, "the reset of the odd stream", |f| {
        matches!(f, Frame::RstStream { stream_id: 1, .. })
    })
    .await;

    // port-forward: a request id with a line break, on a second data stream of one connection.
    let (session, head) = spdy(
        &node,
        &format!("/portForward/{}/web-0", node.ns),
        "portforward.k8s.io",
        &token,
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let (read, mut write) = tokio::io::split(session);
    let mut frames = frames_of(read);
    let mut deflater = Deflater::new();
    let mut out = BytesMut::new();
    let requestid = "7\nFORGED-PF-ENTRY";
    syn(
        &mut deflater,
        1,
        &[("streamtype", "data"), ("port", "80"), ("requestid", requestid)],
        &mut out,
    );
    syn(
        &mut deflater,
        3,
        &[("streamtype", "data"), ("port", "80"), ("requestid", requestid)],
        &mut out,
    );
    send(&mut write, &out).await;
    frame_matching(&mut frames, "the reset of the second data stream", |f| {
        matches!(f, Frame::RstStream { stream_id: 3, .. })
    })
    .await;

    // exec: the command line of a client that leaves (it may carry secrets).
    let (c, _) = ws(
        &node,
        &exec_path(
            &node,
            "command=sh&command=-c&command=sleep%20600%20%23%20SECRET-ARGUMENT&output=1",
        ),
        "v5.channel.k8s.io",
        Some(&token),
    )
    .await
    .unwrap();
    eventually(30, "the command runs", || async {
        !node.machine.sim.pids_of("vm exec").unwrap().is_empty()
    })
    .await;
    drop(c);
    eventually(30, "the command is stopped", || async {
        node.machine.sim.pids_of("vm exec").unwrap().is_empty()
    })
    .await;

    let log = plain_log(&node);
    for forged in ["FORGED-EXEC-ENTRY", "FORGED-PF-ENTRY"] {
        assert!(log.contains(forged), "the value is logged: {forged}\n{log}");
        assert!(
            !log.lines().any(|l| l.starts_with(forged)),
            "a peer's header value started a log line of its own:\n{log}"
        );
    }
    let leaked: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("SECRET-ARGUMENT") && !l.contains("DEBUG"))
        .collect();
    assert!(leaked.is_empty(), "an exec's argv logged above debug: {leaked:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn one_pods_sessions_do_not_take_another_pods_share() {
    let Some(node) = node_with_pod_on(
        "share",
        |_| {},
        &[
            ("VK_STREAMING_MAX_SESSIONS", "6"),
            ("VK_STREAMING_MAX_SESSIONS_PER_POD", "2"),
            ("VK_STREAMING_MAX_SESSIONS_PER_CALLER", "3"),
        ],
    )
    .await
    else {
        return;
    };
    let pod = managed_pod(&node.ns, &node.machine.node, "web-1", "vm-web-1", &[(IMAGE, "base")]);
    create_pod(&node.admin, &pod).await;
    wait_up(&node.admin, &node.ns, "web-1").await;
    // Both pods up (their guest fix-ups ran as the simulator answers them): from now on an
    // exec'd command runs for real, so a `sleep` holds its session.
    node.machine
        .sim
        .on_exec(cocoon_sim::ExecRule {
            run: true,
            ..Default::default()
        })
        .unwrap();
    let token = streamer_token(&node, "streamer", &["get", "create"]).await;
    let sleeper = |pod: &str| format!("/exec/{}/{pod}/agent?command=sleep&command=600&output=1", node.ns);

    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            ws(&node, &sleeper("web-0"), "v5.channel.k8s.io", Some(&token))
                .await
                .unwrap()
                .0,
        );
    }
    let (status, body) = ws(&node, &sleeper("web-0"), "v5.channel.k8s.io", Some(&token))
        .await
        .expect_err("a third session on one pod is refused");
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("VK_STREAMING_MAX_SESSIONS_PER_POD"), "{body}");
    // The other pod still gets in: the first one's sessions took only its own share.
    held.push(
        ws(&node, &sleeper("web-1"), "v5.channel.k8s.io", Some(&token))
            .await
            .unwrap()
            .0,
    );
    // One caller (a token reaching the port itself) has a share of its own.
    let (status, body) = ws(&node, &sleeper("web-1"), "v5.channel.k8s.io", Some(&token))
        .await
        .expect_err("a caller past its share is refused");
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("VK_STREAMING_MAX_SESSIONS_PER_CALLER"), "{body}");
    let other = streamer_token(&node, "other", &["get", "create"]).await;
    held.push(
        ws(&node, &sleeper("web-1"), "v5.channel.k8s.io", Some(&other))
            .await
            .unwrap()
            .0,
    );
    drop(held);
}
