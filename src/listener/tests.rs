use std::time::Duration;

use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::*;

fn limits(cap: usize) -> Limits {
    Limits {
        header_timeout: Duration::from_millis(800),
        idle_timeout: Duration::from_millis(1500),
        drain_timeout: Duration::from_secs(2),
        ..Limits::with_cap(cap)
    }
}

async fn start(limits: Limits, app: Router) -> (Arc<Listener>, SocketAddr, CancellationToken) {
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let listener = Listener::new("test", limits, None);
    let stop = CancellationToken::new();
    tokio::spawn(listener.clone().serve(tcp, app, stop.clone()));
    (listener, addr, stop)
}

fn app() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// Reads until the daemon closes the connection (EOF, or a reset for a socket closed with our
/// bytes unread); returns when, counted from `from`. Fails the test past `bound`.
async fn closed_after(stream: &mut TcpStream, from: Instant, bound: Duration) -> Duration {
    let mut buf = [0u8; 4096];
    let wait = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return from.elapsed(),
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(bound, wait)
        .await
        .unwrap_or_else(|_| panic!("the connection is still open after {bound:?}"))
}

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_requests_are_closed_at_the_header_deadline_and_the_cap_holds() {
    let limits = limits(50);
    let (listener, addr, _stop) = start(limits, app()).await;
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..200 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        clients.push(c);
    }
    until("the cap reached", || listener.open_connections() == 50).await;
    let closes = futures::future::join_all(
        clients
            .iter_mut()
            .map(|c| closed_after(c, started, Duration::from_secs(10))),
    )
    .await;
    // The connections within the cap waited for the deadline, the others were closed at once
    // (one whose close this test reads late can look held: hence at least).
    let held = closes.iter().filter(|d| **d >= limits.header_timeout).count();
    assert!(held >= 50, "{held} connections waited for the deadline: {closes:?}");
    assert!(listener.refused_connections() as usize + held >= 200);
    assert!(
        listener.refused_connections() >= 100,
        "{} refused",
        listener.refused_connections()
    );
    assert!(
        closes.iter().all(|d| *d < limits.header_timeout * 3),
        "every connection closed by about the header deadline: {closes:?}"
    );
    until("every slot given back", || listener.open_connections() == 0).await;
}

#[tokio::test]
async fn a_silent_connection_is_closed_at_the_header_deadline() {
    let limits = limits(4);
    let (listener, addr, _stop) = start(limits, app()).await;
    let started = Instant::now();
    let mut c = TcpStream::connect(addr).await.unwrap();
    let closed = closed_after(&mut c, started, Duration::from_secs(10)).await;
    assert!(closed >= limits.header_timeout, "{closed:?}");
    until("the slot given back", || listener.open_connections() == 0).await;
}

#[tokio::test]
async fn a_kept_alive_connection_is_closed_once_idle() {
    let limits = limits(4);
    let (_listener, addr, _stop) = start(limits, app()).await;
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let mut answer = [0u8; 1024];
    let n = c.read(&mut answer).await.unwrap();
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"));
    let answered = Instant::now();
    let closed = closed_after(&mut c, answered, Duration::from_secs(10)).await;
    assert!(closed >= limits.header_timeout, "{closed:?}");
}

#[tokio::test]
async fn a_response_longer_than_the_idle_timeout_is_not_cut() {
    let limits = limits(4);
    // The handler takes twice the idle timeout before it answers: the request is in flight.
    let slow = Router::new().route(
        "/",
        get(move || async move {
            tokio::time::sleep(limits.idle_timeout * 2).await;
            "slow but whole"
        }),
    );
    let (_listener, addr, _stop) = start(limits, slow).await;
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    c.read_to_string(&mut answer).await.unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.ends_with("slow but whole"),
        "{answer}"
    );
}

#[tokio::test]
async fn an_idle_http2_connection_gets_a_goaway() {
    let limits = limits(4);
    let (listener, addr, _stop) = start(limits, app()).await;
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
        .await
        .unwrap();
    let driving = tokio::spawn(conn);
    let req = axum::http::Request::get(format!("http://{addr}/"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    assert_eq!(sender.send_request(req).await.unwrap().status(), 200);
    let answered = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), driving)
        .await
        .expect("the server ended the idle HTTP/2 connection")
        .unwrap()
        .unwrap();
    assert!(answered.elapsed() >= limits.idle_timeout, "{:?}", answered.elapsed());
    until("the slot given back", || listener.open_connections() == 0).await;
}
