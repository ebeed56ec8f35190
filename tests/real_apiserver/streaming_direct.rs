//! The streaming endpoints reached directly on the kubelet port, as a client that talks to a
//! node itself would (and as the apiserver does, frame by frame): the WebSocket channel
//! protocols v5 (with its close signal) and v4, who may call them, the refusals of bad
//! requests, the session cap, the stream creation and idle timeouts, a malformed SPDY frame, and
//! that no descriptor outlives a session. Tokens come from the real apiserver (TokenReview,
//! SubjectAccessReview).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::{SinkExt, StreamExt};
use k8s_openapi::api::rbac::v1::PolicyRule;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::{self, Message, client::IntoClientRequest};
use vk_cocoon::kubelet_api::streaming::spdy::codec::frame::{Frame, encode, goaway};
use vk_cocoon::kubelet_api::streaming::spdy::codec::{Decoder, Limits};

use crate::daemon::eventually;
use crate::kubelet_node::{Node, exec_node_with, plain_log, processes, token_with};

pub(crate) type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

pub(crate) async fn tls(node: &Node) -> Tls {
    use rustls_pki_types::pem::PemObject;
    let ca = std::fs::read(node.cluster.ca_cert_path()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(&ca) {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", node.daemon.kubelet_port))
        .await
        .unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap()
}

pub(crate) type Ws = tokio_tungstenite::WebSocketStream<Tls>;

/// A WebSocket to `path` offering `protocol`; `Err(status, body)` when refused.
pub(crate) async fn ws(
    node: &Node,
    path: &str,
    protocol: &str,
    token: Option<&str>,
) -> Result<(Ws, String), (u16, String)> {
    let mut req = format!("wss://127.0.0.1:{}{path}", node.daemon.kubelet_port)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", protocol.parse().unwrap());
    if let Some(t) = token {
        req.headers_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    match tokio_tungstenite::client_async(req, tls(node).await).await {
        Ok((ws, response)) => {
            let chosen = response
                .headers()
                .get("sec-websocket-protocol")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default();
            Ok((ws, chosen))
        }
        Err(tungstenite::Error::Http(r)) => Err((
            r.status().as_u16(),
            String::from_utf8_lossy(r.body().as_deref().unwrap_or_default()).into_owned(),
        )),
        Err(e) => panic!("{path}: {e}"),
    }
}

/// Everything the server sends until it closes: (stdout, stderr, error channel).
pub(crate) async fn drain(ws: &mut Ws) -> (Vec<u8>, Vec<u8>, String) {
    let (mut out, mut err, mut status) = (Vec::new(), Vec::new(), Vec::new());
    loop {
        let m = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("the server finishes");
        match m {
            Some(Ok(Message::Binary(b))) => match b.first() {
                Some(1) => out.extend_from_slice(&b[1..]),
                Some(2) => err.extend_from_slice(&b[1..]),
                Some(3) => status.extend_from_slice(&b[1..]),
                other => panic!("a message on channel {other:?}"),
            },
            Some(Ok(Message::Close(_))) | None => break,
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("{e}"),
        }
    }
    (out, err, String::from_utf8_lossy(&status).into_owned())
}

pub(crate) fn exec_path(node: &Node, query: &str) -> String {
    format!("/exec/{}/web-0/agent?{query}", node.ns)
}

/// A raw SPDY upgrade of `path`: the TLS stream, and the status line and headers (and the body,
/// when refused).
pub(crate) async fn spdy(node: &Node, path: &str, protocol: &str, token: &str) -> (Tls, String) {
    let mut s = tls(node).await;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: {protocol}\r\nContent-Length: 0\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "the head ends: {head:?}");
        head.push(b[0]);
    }
    let mut head = String::from_utf8(head).unwrap();
    if !head.starts_with("HTTP/1.1 101") {
        let length = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().to_string())
            })
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        s.read_exact(&mut body).await.unwrap();
        head.push_str(&String::from_utf8_lossy(&body));
    }
    (s, head)
}

/// Frames from the server until it closes the connection.
pub(crate) async fn frames_until_eof(s: &mut Tls) -> Vec<Frame> {
    let mut decoder = Decoder::new(Limits::default());
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    loop {
        while let Some(f) = decoder.decode(&mut buf).unwrap() {
            frames.push(f);
        }
        let n = tokio::time::timeout(Duration::from_secs(30), s.read_buf(&mut buf))
            .await
            .expect("the server closes the connection")
            .unwrap_or(0);
        if n == 0 {
            return frames;
        }
    }
}

pub(crate) async fn streamer_token(node: &Node, name: &str, verbs: &[&str]) -> String {
    let token = token_with(
        node,
        name,
        vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["nodes/proxy".into()]),
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            ..Default::default()
        }],
    )
    .await;
    // RBAC reaches the authorizer through an informer: wait until the token counts.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while node
        .direct()
        .get(node.url("/pods"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .status()
        != 200
    {
        assert!(std::time::Instant::now() < deadline, "the binding never counted");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    token
}

#[tokio::test(flavor = "multi_thread")]
async fn websocket_clients_authorization_and_bad_requests() {
    let Some(node) = exec_node_with("direct", &[]).await else {
        return;
    };
    let token = streamer_token(&node, "streamer", &["get", "create"]).await;

    // v5: stdin ends with the close signal; the status says Success.
    let (mut c, chosen) = ws(
        &node,
        &exec_path(&node, "command=cat&input=1&output=1&error=1"),
        "v5.channel.k8s.io",
        Some(&token),
    )
    .await
    .unwrap();
    assert_eq!(chosen, "v5.channel.k8s.io");
    c.send(Message::Binary(Bytes::from_static(b"\x00typed into stdin")))
        .await
        .unwrap();
    c.send(Message::Binary(Bytes::from_static(b"\xff\x00"))).await.unwrap();
    let (out, err, status) = drain(&mut c).await;
    assert_eq!((out.as_slice(), err.as_slice()), (&b"typed into stdin"[..], &b""[..]));
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["status"], "Success");

    // v4: no close signal; the exit code comes as NonZeroExitCode.
    let (mut c, chosen) = ws(
        &node,
        &exec_path(
            &node,
            "command=sh&command=-c&command=echo%20hi%3B%20echo%20oops%20%3E%262%3B%20exit%207&output=1&error=1",
        ),
        "v4.channel.k8s.io",
        Some(&token),
    )
    .await
    .unwrap();
    assert_eq!(chosen, "v4.channel.k8s.io");
    let (out, err, status) = drain(&mut c).await;
    assert_eq!((out.as_slice(), err.as_slice()), (&b"hi\n"[..], &b"oops\n"[..]));
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(
        (
            status["reason"].as_str(),
            status["details"]["causes"][0]["message"].as_str()
        ),
        (Some("NonZeroExitCode"), Some("7"))
    );

    // A TTY is refused with the reason, on the error channel.
    let (mut c, _) = ws(
        &node,
        &exec_path(&node, "command=sh&input=1&output=1&tty=1"),
        "v5.channel.k8s.io",
        Some(&token),
    )
    .await
    .unwrap();
    let (_, _, status) = drain(&mut c).await;
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["reason"], "BadRequest");
    assert!(
        status["message"].as_str().unwrap().contains("allocates no terminal"),
        "{status}"
    );

    // Who may call: nobody anonymous; a token needs nodes/proxy.
    let path = exec_path(&node, "command=true&output=1");
    assert_eq!(ws(&node, &path, "v5.channel.k8s.io", None).await.err().unwrap().0, 401);
    let nobody = token_with(&node, "nobody", vec![]).await;
    let (status, body) = ws(&node, &path, "v5.channel.k8s.io", Some(&nobody))
        .await
        .err()
        .unwrap();
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("subresource(s)=[proxy]"), "{body}");
    // A WebSocket upgrade is a GET, a SPDY one a POST; either way running something is
    // `create`: a token that may only read nodes/proxy (what monitoring gets) opens neither.
    let get_only = streamer_token(&node, "get-only", &["get"]).await;
    for path in [
        path.clone(),
        format!("/attach/{}/web-0/agent?output=1", node.ns),
        format!("/portForward/{}/web-0", node.ns),
    ] {
        let protocol = if path.starts_with("/portForward") {
            "SPDY/3.1+portforward.k8s.io"
        } else {
            "v5.channel.k8s.io"
        };
        let (status, body) = ws(&node, &path, protocol, Some(&get_only)).await.err().unwrap();
        assert_eq!(status, 403, "{path}: {body}");
        assert!(
            body.contains("verb=create") && body.contains("user=system:serviceaccount:"),
            "{path}: {body}"
        );
    }
    let (_, head) = spdy(&node, &path, "v5.channel.k8s.io", &get_only).await;
    assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    assert!(head.contains("verb=create"), "{head}");
    // get-only still reads what it may: the pod list.
    let r = node
        .direct()
        .get(node.url("/pods"))
        .bearer_auth(&get_only)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Bad requests: a 4xx that says what is wrong, before any upgrade.
    for (path, protocol, status, fragment) in [
        (
            exec_path(&node, "output=1"),
            "v5.channel.k8s.io",
            400,
            "you must specify a command",
        ),
        (
            exec_path(&node, "command=ls"),
            "v5.channel.k8s.io",
            400,
            "at least 1 of stdin",
        ),
        (
            exec_path(&node, "command=ls&output=1"),
            "base64.channel.k8s.io",
            403,
            "unable to negotiate protocol",
        ),
        (
            format!("/exec/{}/nope/agent?command=ls&output=1", node.ns),
            "v5.channel.k8s.io",
            404,
            "does not exist",
        ),
        (
            format!("/attach/{}/web-0/other?output=1", node.ns),
            "v5.channel.k8s.io",
            404,
            "containers: agent",
        ),
        (
            format!("/portForward/{}/web-0", node.ns),
            "portforward.k8s.io",
            403,
            "SPDY/3.1+portforward.k8s.io",
        ),
    ] {
        let (got, body) = ws(&node, &path, protocol, Some(&token)).await.err().unwrap();
        assert_eq!(got, status, "{path}: {body}");
        assert!(body.contains(fragment), "{path}: {body}");
    }
    // No upgrade at all.
    let r = node
        .direct()
        .get(node.url(&path))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("upgraded connection"));
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_sessions_creation_timeout_and_malformed_frames() {
    let Some(node) = exec_node_with(
        "limits",
        &[
            ("VK_STREAMING_MAX_SESSIONS", "2"),
            ("VK_STREAMING_CREATION_TIMEOUT", "2s"),
        ],
    )
    .await
    else {
        return;
    };
    let token = streamer_token(&node, "streamer", &["get", "create"]).await;
    let sleeper = exec_path(&node, "command=sleep&command=600&output=1");
    let (first, _) = ws(&node, &sleeper, "v5.channel.k8s.io", Some(&token)).await.unwrap();
    let (second, _) = ws(&node, &sleeper, "v5.channel.k8s.io", Some(&token)).await.unwrap();
    let (status, body) = ws(&node, &sleeper, "v5.channel.k8s.io", Some(&token))
        .await
        .err()
        .unwrap();
    assert_eq!(status, 429, "{body}");
    assert!(body.contains("VK_STREAMING_MAX_SESSIONS"), "{body}");
    drop(first);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let third = loop {
        match ws(&node, &sleeper, "v5.channel.k8s.io", Some(&token)).await {
            Ok((c, _)) => break c,
            Err((429, _)) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("a slot was not freed: {e:?}"),
        }
    };
    drop((second, third));
    crate::daemon::eventually(30, "both sleeps stopped", || async {
        node.machine.sim.pids_of("vm exec").unwrap().is_empty()
    })
    .await;

    // A SPDY client that upgrades but opens no streams is dropped after the creation timeout.
    let (mut idle, head) = spdy(
        &node,
        &exec_path(&node, "command=true&output=1"),
        "v4.channel.k8s.io",
        &token,
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("x-stream-protocol-version: v4.channel.k8s.io"),
        "{head}"
    );
    let started = std::time::Instant::now();
    let frames = frames_until_eof(&mut idle).await;
    assert!(started.elapsed() >= Duration::from_secs(2), "not before the timeout");
    assert!(matches!(frames.last(), Some(Frame::GoAway { .. })), "{frames:?}");
    let log = plain_log(&node);
    assert!(
        log.contains("timed out after 2s waiting for the client to create its streams"),
        "{log}"
    );

    // A malformed frame ends the session with GOAWAY(PROTOCOL_ERROR), and only that session.
    let (mut bad, head) = spdy(
        &node,
        &exec_path(&node, "command=true&output=1"),
        "v4.channel.k8s.io",
        &token,
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let mut junk = BytesMut::new();
    encode(&Frame::Ping { id: 1 }, &mut junk).unwrap();
    junk[1] = 2; // SPDY/2
    bad.write_all(&junk).await.unwrap();
    let frames = frames_until_eof(&mut bad).await;
    assert_eq!(
        frames.last(),
        Some(&Frame::GoAway {
            last_good_stream_id: 0,
            status: goaway::PROTOCOL_ERROR
        })
    );
    assert!(plain_log(&node).contains("only SPDY/3 (3.1) is spoken here"));
    let (mut c, _) = ws(
        &node,
        &exec_path(&node, "command=echo&command=still&output=1"),
        "v5.channel.k8s.io",
        Some(&token),
    )
    .await
    .unwrap();
    assert_eq!(drain(&mut c).await.0, b"still\n");
}

/// Descriptors the daemon has open.
fn daemon_fds(node: &Node) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", node.daemon.pid()))
        .unwrap()
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_sessions_are_closed_and_no_descriptor_outlives_a_session() {
    let idle = Duration::from_secs(4);
    let Some(node) = exec_node_with("idle", &[("VK_STREAMING_IDLE_TIMEOUT", "4s")]).await else {
        return;
    };
    let token = streamer_token(&node, "streamer", &["get", "create"]).await;
    let (mut warm, _) = ws(
        &node,
        &exec_path(&node, "command=true&output=1"),
        "v5.channel.k8s.io",
        Some(&token),
    )
    .await
    .unwrap();
    drain(&mut warm).await;
    drop(warm);
    let fds_before = daemon_fds(&node);

    // Traffic keeps a session open past the idle timeout: a line typed every half second.
    let (mut busy, _) = ws(
        &node,
        &exec_path(&node, "command=cat&input=1&output=1"),
        "v5.channel.k8s.io",
        Some(&token),
    )
    .await
    .unwrap();
    let opened = std::time::Instant::now();
    let mut typed = Vec::new();
    for i in 0..14 {
        let line = format!("line {i}\n");
        typed.extend_from_slice(line.as_bytes());
        let mut message = vec![0u8];
        message.extend_from_slice(line.as_bytes());
        busy.send(Message::Binary(message.into())).await.unwrap();
        // Time passing is what is tested here: the session outlives `idle` with traffic.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(opened.elapsed() > idle);
    busy.send(Message::Binary(Bytes::from_static(b"\xff\x00")))
        .await
        .unwrap();
    let (out, _, status) = drain(&mut busy).await;
    assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(&typed));
    assert!(status.contains("Success"), "{status}");

    // A session with no traffic either way is closed, and its command stopped.
    let marker = format!("86398.{}", std::process::id());
    let (mut quiet, _) = ws(
        &node,
        &exec_path(&node, &format!("command=sleep&command={marker}&output=1")),
        "v5.channel.k8s.io",
        Some(&token),
    )
    .await
    .unwrap();
    let opened = std::time::Instant::now();
    eventually(30, "the command runs", || async {
        processes(&["sleep", &marker]).len() == 1
    })
    .await;
    loop {
        match tokio::time::timeout(Duration::from_secs(60), quiet.next())
            .await
            .expect("the idle session is closed")
        {
            Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
            Some(Ok(_)) => {}
        }
    }
    assert!(
        opened.elapsed() >= idle - Duration::from_secs(1),
        "not before the idle timeout"
    );
    eventually(30, "the idle session's command is stopped", || async {
        processes(&["sleep", &marker]).is_empty() && node.machine.sim.pids_of("vm exec").unwrap().is_empty()
    })
    .await;
    assert!(plain_log(&node).contains("WebSocket stream idle; closing it"));
    eventually(30, "the sessions are gone from the gauge", || async {
        node.metric("cocoon_vk_kubelet_api_streams{kind=\"exec\"}")
            .unwrap_or(0.0)
            == 0.0
    })
    .await;
    // Every socket, pipe and descriptor of the two sessions is closed (other work of the
    // daemon may briefly hold more: wait for the count to come back).
    eventually(30, "the daemon's descriptors are back to where they were", || async {
        daemon_fds(&node) <= fds_before
    })
    .await;
}
