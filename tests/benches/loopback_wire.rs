//! A shaped wire on loopback: a TCP proxy in front of the registry that carries at most `rate`
//! bytes per second each way and delivers every segment `delay` after it left, so the bench can
//! measure transfers where bytes cost time (the v2 targets assume such a wire) without sending a
//! byte off the machine.
//!
//! The rate is shared by every connection through the wire, as one node's link is: eight parallel
//! uploads split it, they do not get it eight times. Each direction has its own budget (a full-duplex
//! link). The proxy runs in a process of its own: its pacing does not wait on the transfer's
//! runtime, and its buffers are not counted in the transfer's peak RSS (its CPU, small at these
//! rates, still comes from the same cores). Tokio's timers tick in milliseconds: a delay under
//! 1 ms is rounded up to the next tick, and pacing lets a burst of up to [`BURST`] through to make
//! up for late ticks.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// The most a direction reads and sends as one segment.
const SEGMENT: usize = 64 << 10;
/// How far behind schedule a direction may fall before the lost time is forgotten: without it, each
/// late timer tick would be wire time lost for good.
const BURST: Duration = Duration::from_millis(2);
/// Segments in flight per direction and connection (sent, not yet delivered).
const IN_FLIGHT: usize = 256;

/// What the wire carries: megabits per second each way, and the one-way delay.
#[derive(Clone, Copy, Debug)]
pub struct WireShape {
    pub mbit_per_s: u64,
    pub one_way_delay: Duration,
}

impl WireShape {
    pub fn mib_per_s(&self) -> f64 {
        self.mbit_per_s as f64 * 1e6 / 8.0 / 1048576.0
    }
}

/// The proxy, a child process (this bench binary, run with [`SERVE_ARG`]) so that its buffers are
/// not counted as the transfer's own; killed when dropped.
pub struct Wire {
    host: String,
    child: std::process::Child,
}

/// The first argument that makes this binary serve a wire instead of benchmarking.
const SERVE_ARG: &str = "--serve-loopback-wire";

impl Wire {
    /// A wire from a fresh loopback port to `target`.
    pub fn start(target: SocketAddr, shape: WireShape) -> Wire {
        assert!(
            target.ip().is_loopback(),
            "the wire only leads to loopback, not {target}"
        );
        assert!(shape.mbit_per_s > 0, "a wire needs a rate");
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([SERVE_ARG, &target.to_string(), &shape.mbit_per_s.to_string()])
            .arg(shape.one_way_delay.as_micros().to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the wire");
        let mut host = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut host)
            .expect("the wire's address");
        assert!(!host.trim().is_empty(), "the wire did not start");
        Wire {
            host: host.trim().to_string(),
            child,
        }
    }

    /// `127.0.0.1:<port>`: where a client reaches the target through the wire.
    pub fn host(&self) -> String {
        self.host.clone()
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// When this process was started as a wire ([`SERVE_ARG`] target mbit delay-µs): prints the wire's
/// address and serves until killed; never returns. Otherwise returns at once.
pub fn serve_if_asked() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [flag, target, mbit, delay_us] = &args[..] else {
        return;
    };
    if flag != SERVE_ARG {
        return;
    }
    let target: SocketAddr = target.parse().expect("the wire's target");
    assert!(
        target.ip().is_loopback(),
        "the wire only leads to loopback, not {target}"
    );
    let shape = WireShape {
        mbit_per_s: mbit.parse().expect("the wire's rate"),
        one_way_delay: Duration::from_micros(delay_us.parse().expect("the wire's delay")),
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the wire");
    listener.set_nonblocking(true).unwrap();
    println!("{}", listener.local_addr().unwrap());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(serve(listener, target, shape));
    std::process::exit(0);
}

async fn serve(listener: std::net::TcpListener, target: SocketAddr, shape: WireShape) {
    let listener = TcpListener::from_std(listener).unwrap();
    let up = Arc::new(Pacer::new(shape));
    let down = Arc::new(Pacer::new(shape));
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let Ok(server) = TcpStream::connect(target).await else {
            continue; // dropping the client tells it the far end is not there
        };
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        let (client_rx, client_tx) = client.into_split();
        let (server_rx, server_tx) = server.into_split();
        tokio::spawn(carry(client_rx, server_tx, up.clone(), shape.one_way_delay));
        tokio::spawn(carry(server_rx, client_tx, down.clone(), shape.one_way_delay));
    }
}

/// One direction's budget: the instant the link is free again.
struct Pacer {
    free_at: Mutex<Instant>,
    nanos_per_byte: f64,
}

impl Pacer {
    fn new(shape: WireShape) -> Pacer {
        Pacer {
            free_at: Mutex::new(Instant::now()),
            nanos_per_byte: 8e9 / (shape.mbit_per_s as f64 * 1e6),
        }
    }

    /// Books the link for `n` bytes after whatever is booked already; returns when their last byte
    /// has left.
    fn book(&self, n: usize) -> Instant {
        let now = Instant::now();
        let mut free_at = self.free_at.lock().unwrap();
        let start = (*free_at).max(now.checked_sub(BURST).unwrap_or(now));
        *free_at = start + Duration::from_nanos((n as f64 * self.nanos_per_byte) as u64);
        *free_at
    }
}

/// Carries one direction of a connection: reads a segment, waits its turn on the link, and hands it
/// to the writer to deliver `delay` later. End of stream is passed on after the last segment.
async fn carry(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, pacer: Arc<Pacer>, delay: Duration) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let send = async move {
        let mut buf = vec![0u8; SEGMENT];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let sent = pacer.book(n);
            wait_until(sent).await;
            if tx.send((sent + delay, buf[..n].to_vec())).await.is_err() {
                break;
            }
        }
    };
    let deliver = async move {
        while let Some((at, segment)) = rx.recv().await {
            wait_until(at).await;
            if to.write_all(&segment).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(send, deliver);
}

async fn wait_until(at: Instant) {
    if at > Instant::now() {
        tokio::time::sleep_until(at.into()).await;
    }
}
