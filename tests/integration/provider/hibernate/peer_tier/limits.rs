//! Node A's peer port against clients that never finish a request, and against a stream of
//! unauthenticated callers: what the listener holds is bounded and the log stays readable.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::*;

/// Half-requests a flood opens: each sends a request line and nothing more.
const FLOOD: usize = 5_000;

/// Opens one connection to `addr`, sends the first bytes of a TLS handshake record and nothing
/// more (the port speaks only TLS: a half-request now stops inside the handshake), and waits
/// until the peer closes it (EOF, or a reset for a socket closed with our bytes unread). Returns
/// how long it was open, timed from before the connect (the server's deadline cannot start
/// earlier, however late this task is polled once the connection is up: 5,000 tasks share two
/// cores) and from after it (the server cannot have closed it before: a connect retried in a
/// full accept queue does not count).
async fn half_request(addr: SocketAddr, bound: Duration) -> (Duration, Duration) {
    let dialled = Instant::now();
    let mut c = TcpStream::connect(addr).await.expect("connect to the peer port");
    let opened = Instant::now();
    // A reset can come before the write completes: that is a close too.
    let _ = c.write_all(&[0x16, 0x03, 0x01]).await;
    let mut buf = [0u8; 1024];
    let closed = async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => return (dialled.elapsed(), opened.elapsed()),
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(bound, closed)
        .await
        .unwrap_or_else(|_| panic!("a half-request is still open after {bound:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_half_requests_on_the_peer_port_is_closed_and_capped() {
    let (_env, a) = setup(1 << 20).await;
    let limits = *a.listener.limits();
    // How late this test's own tasks run while the flood is on (5,000 of them share two cores,
    // often with a build beside): a close read that late is no close the daemon made late.
    let lateness = Arc::new(Mutex::new(Duration::ZERO));
    let probe = tokio::spawn({
        let lateness = lateness.clone();
        async move {
            loop {
                let asked = Instant::now();
                tokio::time::sleep(Duration::from_millis(10)).await;
                let late = asked.elapsed().saturating_sub(Duration::from_millis(10));
                let mut worst = lateness.lock().unwrap();
                *worst = (*worst).max(late);
            }
        }
    });
    let flood: Vec<_> = (0..FLOOD)
        .map(|_| tokio::spawn(half_request(a.addr, Duration::from_secs(15))))
        .collect();
    // The listener fills up to its cap, never past it (a semaphore): the daemon holds at most
    // that many sockets whatever the flood.
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.listener.open_connections() < limits.max_connections {
        assert!(Instant::now() < deadline, "the listener never reached its cap");
        tokio::task::yield_now().await;
    }
    let (mut since_dial, mut closes) = (Vec::with_capacity(FLOOD), Vec::with_capacity(FLOOD));
    for c in flood {
        let (dial, open) = c.await.unwrap();
        since_dial.push(dial);
        closes.push(open);
    }
    closes.sort();
    probe.abort();
    let late = *lateness.lock().unwrap();
    // A connection within the cap waited for the header deadline; the others were closed at
    // once (a slot freed while the flood was still opening takes one more; a close this test
    // reads late looks held: hence at least).
    let held = since_dial.iter().filter(|d| **d >= limits.handshake_timeout).count();
    let refused = a.listener.refused_connections() as usize;
    assert!(
        held >= limits.max_connections,
        "{held} connections were held: {closes:?}"
    );
    assert!(refused + held >= FLOOD, "{refused} refused, {held} held of {FLOOD}");
    assert!(refused >= FLOOD / 2, "{refused} refused at the cap");
    assert!(
        closes[FLOOD - 1] < limits.handshake_timeout * 3 + late,
        "every half-request is closed by about the handshake deadline (the slowest after {:?}; this test's tasks ran up to {late:?} late)",
        closes[FLOOD - 1]
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.listener.open_connections() > 0 {
        assert!(Instant::now() < deadline, "slots still taken after the flood");
        tokio::task::yield_now().await;
    }
}

/// A `tracing` writer into memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

// One thread: every task of the test (node A's server included) logs through the subscriber
// set on it.
#[tokio::test(flavor = "current_thread")]
async fn unauthenticated_peer_requests_do_not_flood_the_log() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _log = tracing::subscriber::set_default(subscriber);
    let (_env, a) = setup(1 << 20).await;
    // A node of the fleet with the wrong token: the token is still checked inside TLS.
    let tls = FLEET.node_tls(NODE);
    for _ in 0..200 {
        let (status, _) = peer_get(a.addr, &tls, NODE_A, &plan_path(VM), Some("not-the-peer-token-at-all"))
            .await
            .unwrap();
        assert_eq!(status, 401);
    }
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("peer"))
        .collect();
    assert!(
        warnings.len() <= 1,
        "{} warnings for 200 refused requests:\n{}",
        warnings.len(),
        warnings.iter().take(3).copied().collect::<Vec<_>>().join("\n")
    );
}
