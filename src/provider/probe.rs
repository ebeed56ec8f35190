//! Readiness probing: one agent per pod. The first probe runs inside the
//! caller (so the first status already says whether the guest answers); later probes run on a
//! schedule — 100 ms growing ×1.5 to 1 s while not ready, 5 s once ready, three failures in a
//! row to flip back — and every flip calls back into the provider so the status is republished.
//!
//! Pure: [`Schedule`] and [`target`]. I/O: the [`Prober`] port ([`NetProber`]: TCP connect, one
//! ICMPv4 echo) and the [`Probes`] manager that runs the agents.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::policy::contract::types::ReadinessProbe;

/// Readiness probing: how often, and how many failures flip a ready pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeTimings {
    /// First interval while not ready; grows ×1.5 up to `max_unready`.
    pub initial: Duration,
    pub max_unready: Duration,
    /// Steady interval once ready.
    pub ready: Duration,
    /// Timeout of one probe.
    pub timeout: Duration,
    /// Consecutive failures that flip a ready pod back to not ready.
    pub failures_to_unready: u32,
}

impl Default for ProbeTimings {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max_unready: Duration::from_secs(1),
            ready: Duration::from_secs(5),
            timeout: Duration::from_secs(3),
            failures_to_unready: 3,
        }
    }
}

/// The latest verdict of a pod's agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    pub ready: bool,
    pub message: String,
    pub last_seen: Option<Instant>,
}

impl ProbeResult {
    fn not_started() -> Self {
        Self {
            ready: false,
            message: "not probed yet".into(),
            last_seen: None,
        }
    }
}

/// When to probe next, and whether a result flips readiness.
#[derive(Debug, Clone)]
pub struct Schedule {
    timings: ProbeTimings,
    ready: bool,
    failures: u32,
    interval: Duration,
}

impl Schedule {
    pub fn new(timings: ProbeTimings) -> Self {
        Self {
            timings,
            ready: false,
            failures: 0,
            interval: timings.initial,
        }
    }

    pub fn ready(&self) -> bool {
        self.ready
    }

    /// Records one probe; returns whether readiness flipped and the delay before the next probe.
    pub fn observe(&mut self, ok: bool) -> (bool, Duration) {
        if ok {
            self.failures = 0;
            let flipped = !self.ready;
            self.ready = true;
            return (flipped, self.timings.ready);
        }
        if self.ready {
            self.failures += 1;
            if self.failures < self.timings.failures_to_unready {
                return (false, self.timings.ready);
            }
            self.ready = false;
            self.failures = 0;
            self.interval = self.timings.initial;
            return (true, self.interval);
        }
        let delay = self.interval;
        self.interval = self.interval.mul_f64(1.5).min(self.timings.max_unready);
        (false, delay)
    }
}

/// What one probe of a pod checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Not reachable by construction; the message says why.
    Unready(String),
    Tcp(SocketAddr),
    Icmp(Ipv4Addr),
    /// Connect and read: ready when the service greets with `prefix` (a macOS guest's sshd,
    /// `SSH-`: an accepted connection alone could be QEMU's user-mode forwarder, not the guest).
    Banner {
        addr: SocketAddr,
        prefix: &'static str,
    },
}

/// The probe of a macOS guest: a TCP accept on the probe
/// port when one is set, else an `SSH-` banner on `:22`; no lease yet is its own state.
pub fn macos_target(has_vm: bool, ip: &str, probe: &ReadinessProbe) -> Target {
    if !has_vm {
        return Target::Unready("vm gone".into());
    }
    if ip.is_empty() {
        return Target::Unready("waiting for guest dhcp lease".into());
    }
    let Ok(addr) = ip.parse::<IpAddr>() else {
        return Target::Unready(format!("vm ip {ip:?} is not an IP address"));
    };
    match probe {
        ReadinessProbe::Tcp(port) => Target::Tcp(SocketAddr::new(addr, *port)),
        ReadinessProbe::Invalid(raw) => Target::Unready(format!(
            "vm.cocoonstack.io/probe-port {raw:?} is not a port number (1-65535)"
        )),
        ReadinessProbe::Icmp => Target::Banner {
            addr: SocketAddr::new(addr, 22),
            prefix: "SSH-",
        },
    }
}

/// The probe of a pod whose VM is `has_vm`, resolved IP `ip` ("" while none) and
/// `vm.cocoonstack.io/probe-port` annotation `probe_port` ("" for ICMP).
pub fn target(has_vm: bool, ip: &str, probe: &ReadinessProbe) -> Target {
    if !has_vm {
        return Target::Unready("vm gone".into());
    }
    if ip.is_empty() {
        return Target::Unready("waiting for dhcp lease".into());
    }
    let Ok(addr) = ip.parse::<IpAddr>() else {
        return Target::Unready(format!("vm ip {ip:?} is not an IP address"));
    };
    match probe {
        ReadinessProbe::Tcp(port) => return Target::Tcp(SocketAddr::new(addr, *port)),
        ReadinessProbe::Invalid(raw) => {
            return Target::Unready(format!(
                "vm.cocoonstack.io/probe-port {raw:?} is not a port number (1-65535)"
            ));
        }
        ReadinessProbe::Icmp => {}
    }
    match addr {
        IpAddr::V4(v4) => Target::Icmp(v4),
        IpAddr::V6(_) => Target::Unready(format!(
            "vm ip {ip} is IPv6: set vm.cocoonstack.io/probe-port for a TCP probe"
        )),
    }
}

/// Why a probe found its target unreachable. The text follows the probe's kind in the Ready
/// condition's message (`tcp probe 22: connection refused`), so each variant reads as the rest
/// of that sentence.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// Connecting or reading failed: the system's own words (`connection refused`).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The ICMP echo failed or timed out.
    #[error(transparent)]
    Ping(#[from] surge_ping::SurgeError),
    /// No connection within the probe's timeout.
    #[error("no answer within {0:?}")]
    NoAnswer(Duration),
    /// Connected, but the greeting did not come within the probe's timeout.
    #[error("no greeting within {0:?}")]
    NoGreeting(Duration),
    /// The greeting is another service's.
    #[error("greeting {shown:?} does not start with {prefix:?}")]
    WrongGreeting { shown: String, prefix: String },
    /// The target lies outside the networks the node may probe (`setting`, listing `networks`):
    /// it was not contacted.
    #[error("{ip} is outside {setting} ({networks}): not probed; add the guests' network to {setting}")]
    OutOfScope {
        ip: IpAddr,
        setting: &'static str,
        networks: String,
    },
}

/// Reachability checks.
#[async_trait]
pub trait Prober: Send + Sync {
    async fn tcp(&self, addr: SocketAddr, timeout: Duration) -> Result<(), ProbeError>;
    async fn ping(&self, ip: Ipv4Addr, timeout: Duration) -> Result<(), ProbeError>;
    /// Connects to `addr` and reads its greeting: `Ok` when it starts with `prefix`.
    async fn banner(&self, addr: SocketAddr, prefix: &str, timeout: Duration) -> Result<(), ProbeError>;
}

/// Probes one target; `(ready, message)` as the Ready condition shows it.
pub async fn probe(prober: &dyn Prober, target: &Target, timeout: Duration) -> (bool, String) {
    match target {
        Target::Unready(why) => (false, why.clone()),
        Target::Tcp(addr) => match prober.tcp(*addr, timeout).await {
            Ok(()) => (true, "tcp ok".into()),
            Err(e) => (false, format!("tcp probe {}: {e}", addr.port())),
        },
        Target::Icmp(ip) => match prober.ping(*ip, timeout).await {
            Ok(()) => (true, "ping ok".into()),
            Err(e) => (false, format!("ping failed: {e}")),
        },
        Target::Banner { addr, prefix } => match prober.banner(*addr, prefix, timeout).await {
            Ok(()) => (true, format!("{prefix} banner ok")),
            Err(e) => (false, format!("{prefix} banner on port {}: {e}", addr.port())),
        },
    }
}

/// The production prober: `connect(2)` for TCP, one ICMPv4 echo (identifier = pid & 0xffff,
/// payload `vk-cocoon`) through an unprivileged ICMP socket or a raw one. When the host allows
/// neither (no CAP_NET_RAW and `net.ipv4.ping_group_range` excludes us) it says so once and
/// treats ICMP-probed guests as reachable, as vk-cocoon always has.
///
/// Every echo gets the next sequence number: the ICMP client matches a reply to its request by
/// (address, identifier, sequence) and refuses a second request with the same three while the
/// first is in flight, which two agents of one address (a pod's startup agent and the one its
/// CreatePod starts) would otherwise send.
pub struct NetProber {
    icmp: tokio::sync::OnceCell<Option<surge_ping::Client>>,
    sequence: std::sync::atomic::AtomicU16,
}

impl Default for NetProber {
    fn default() -> Self {
        Self {
            icmp: tokio::sync::OnceCell::new(),
            sequence: std::sync::atomic::AtomicU16::new(1),
        }
    }
}

impl NetProber {
    async fn icmp_client(&self) -> Option<&surge_ping::Client> {
        self.icmp
            .get_or_init(|| async {
                match surge_ping::Client::new(&surge_ping::Config::default()) {
                    Ok(client) => Some(client),
                    Err(error) => {
                        tracing::warn!(%error, "cannot open an ICMP socket (needs CAP_NET_RAW or net.ipv4.ping_group_range): pods without vm.cocoonstack.io/probe-port are treated as reachable");
                        None
                    }
                }
            })
            .await
            .as_ref()
    }
}

const PING_PAYLOAD: &[u8] = b"vk-cocoon";

/// Connects and reads the greeting until `prefix.len()` bytes are in, within `timeout`.
pub async fn read_banner(addr: SocketAddr, prefix: &str, timeout: Duration) -> Result<(), ProbeError> {
    use tokio::io::AsyncReadExt;
    let work = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let mut got = Vec::new();
        let mut buf = [0u8; 256];
        // The prefix is all readiness needs: stop reading as soon as it is in (or cannot be).
        while got.len() < prefix.len() {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        if got.starts_with(prefix.as_bytes()) {
            Ok(())
        } else {
            let shown = String::from_utf8_lossy(&got[..got.len().min(40)]).trim().to_string();
            Err(ProbeError::WrongGreeting {
                shown,
                prefix: prefix.to_string(),
            })
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(r) => r,
        Err(_) => Err(ProbeError::NoGreeting(timeout)),
    }
}

#[async_trait]
impl Prober for NetProber {
    async fn tcp(&self, addr: SocketAddr, timeout: Duration) -> Result<(), ProbeError> {
        match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(_stream)) => Ok(()),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(ProbeError::NoAnswer(timeout)),
        }
    }

    async fn banner(&self, addr: SocketAddr, prefix: &str, timeout: Duration) -> Result<(), ProbeError> {
        read_banner(addr, prefix, timeout).await
    }

    async fn ping(&self, ip: Ipv4Addr, timeout: Duration) -> Result<(), ProbeError> {
        let Some(client) = self.icmp_client().await else {
            return Ok(());
        };
        let ident = surge_ping::PingIdentifier((std::process::id() & 0xffff) as u16);
        let mut pinger = client.pinger(IpAddr::V4(ip), ident).await;
        pinger.timeout(timeout);
        pinger
            .ping(
                surge_ping::PingSequence(self.sequence.fetch_add(1, std::sync::atomic::Ordering::Relaxed)),
                PING_PAYLOAD,
            )
            .await
            .map(|_| ())
            .map_err(ProbeError::from)
    }
}

/// Called by an agent to learn what to probe now (`None` = stop: the pod is gone).
pub type TargetFn = Arc<dyn Fn() -> Option<Target> + Send + Sync>;
/// What an agent runs when readiness flips (the new readiness given).
#[derive(Clone)]
pub struct FlipHooks {
    /// Awaited before the new result is visible to [`Probes::result`]: what a Ready must follow
    /// (the IP annotation) is in place before any status can say Ready.
    pub prepare: Arc<dyn Fn(bool) -> futures::future::BoxFuture<'static, ()> + Send + Sync>,
    /// Called once the new result is visible: republish the status.
    pub announce: Arc<dyn Fn(bool) + Send + Sync>,
}

struct Agent {
    uid: String,
    result: Arc<Mutex<ProbeResult>>,
    stop: CancellationToken,
}

/// The per-pod probe agents.
pub struct Probes {
    prober: Arc<dyn Prober>,
    timings: ProbeTimings,
    duration: prometheus::Histogram,
    agents: Mutex<HashMap<String, Agent>>,
    /// The agents' tasks ([`Self::closed`] waits for them).
    tasks: TaskTracker,
}

impl Probes {
    pub fn new(prober: Arc<dyn Prober>, timings: ProbeTimings, duration: prometheus::Histogram) -> Self {
        Self {
            prober,
            timings,
            duration,
            agents: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
        }
    }

    async fn once(
        prober: &dyn Prober,
        target: &Target,
        timings: &ProbeTimings,
        duration: &prometheus::Histogram,
    ) -> ProbeResult {
        let started = Instant::now();
        let (ready, message) = probe(prober, target, timings.timeout).await;
        duration.observe(started.elapsed().as_secs_f64());
        ProbeResult {
            ready,
            message,
            last_seen: Some(Instant::now()),
        }
    }

    /// Starts (or replaces) the agent of pod `key`, incarnation `uid`. The first probe runs
    /// before this returns; `on_flip` runs on every later readiness flip.
    pub async fn start(&self, key: &str, uid: &str, target: TargetFn, on_flip: FlipHooks) {
        let result = Arc::new(Mutex::new(ProbeResult::not_started()));
        let stop = CancellationToken::new();
        if let Some(old) = self.agents.lock().expect("probe agents").insert(
            key.into(),
            Agent {
                uid: uid.into(),
                result: result.clone(),
                stop: stop.clone(),
            },
        ) {
            old.stop.cancel();
        }
        let mut schedule = Schedule::new(self.timings);
        let Some(first_target) = target() else { return };
        let first = Self::once(self.prober.as_ref(), &first_target, &self.timings, &self.duration).await;
        let (_, mut delay) = schedule.observe(first.ready);
        tracing::debug!(pod = %key, ready = first.ready, message = %first.message, "first probe");
        *result.lock().expect("probe result") = first;

        let (prober, timings, duration, key) = (
            self.prober.clone(),
            self.timings,
            self.duration.clone(),
            key.to_string(),
        );
        self.tasks.spawn(async move {
            loop {
                // The cadence is the probe schedule's (`observe` above), the wait the one owner's.
                if !crate::retry::pause(delay, &stop).await {
                    return;
                }
                let Some(t) = target() else { return };
                let r = Self::once(prober.as_ref(), &t, &timings, &duration).await;
                if stop.is_cancelled() {
                    return;
                }
                let (flipped, next) = schedule.observe(r.ready);
                delay = next;
                // The verdict is the schedule's: a ready pod stays ready through the failures
                // before the third in a row, with the latest probe's message.
                let ready = schedule.ready();
                let r = ProbeResult { ready, ..r };
                if flipped {
                    tracing::info!(pod = %key, ready, message = %r.message, "readiness flipped");
                    (on_flip.prepare)(ready).await;
                    if stop.is_cancelled() {
                        return;
                    }
                }
                *result.lock().expect("probe result") = r;
                if flipped {
                    (on_flip.announce)(ready);
                }
            }
        });
    }

    /// The agent's latest result for incarnation `uid` (`None` without an agent).
    pub fn result(&self, key: &str, uid: &str) -> Option<ProbeResult> {
        let agents = self.agents.lock().expect("probe agents");
        agents
            .get(key)
            .filter(|a| a.uid == uid)
            .map(|a| a.result.lock().expect("probe result").clone())
    }

    /// Stops the agent of pod `key` (any incarnation when `uid` is `None`).
    pub fn forget(&self, key: &str, uid: Option<&str>) {
        let mut agents = self.agents.lock().expect("probe agents");
        if agents.get(key).is_some_and(|a| uid.is_none_or(|u| a.uid == u))
            && let Some(agent) = agents.remove(key)
        {
            agent.stop.cancel();
        }
    }

    pub fn stop_all(&self) {
        for (_, agent) in self.agents.lock().expect("probe agents").drain() {
            agent.stop.cancel();
        }
    }

    /// Stops every agent and waits until their tasks have ended.
    pub async fn closed(&self) {
        self.stop_all();
        self.tasks.close();
        self.tasks.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Whether `done` holds within 5 s, asked every 5 ms (the agent's task runs on its own).
    async fn soon(done: impl FnMut() -> bool) -> bool {
        crate::retry::Schedule::every(Duration::from_millis(5))
            .within(Duration::from_secs(5))
            .poll(done)
            .await
    }

    fn timings() -> ProbeTimings {
        ProbeTimings {
            initial: Duration::from_millis(100),
            max_unready: Duration::from_secs(1),
            ready: Duration::from_secs(5),
            timeout: Duration::from_secs(3),
            failures_to_unready: 3,
        }
    }

    #[test]
    fn not_ready_intervals_grow_by_half_up_to_one_second() {
        let mut s = Schedule::new(timings());
        let delays: Vec<u128> = (0..8).map(|_| s.observe(false).1.as_millis()).collect();
        assert_eq!(delays, vec![100, 150, 225, 337, 506, 759, 1000, 1000]);
        assert!(!s.ready());
    }

    #[test]
    fn ready_is_steady_and_three_failures_flip_back_and_reset_the_interval() {
        let mut s = Schedule::new(timings());
        s.observe(false);
        s.observe(false);
        assert_eq!(s.observe(true), (true, Duration::from_secs(5)), "first success flips");
        assert_eq!(s.observe(true), (false, Duration::from_secs(5)));
        assert_eq!(
            s.observe(false),
            (false, Duration::from_secs(5)),
            "one failure keeps ready"
        );
        assert_eq!(
            s.observe(true),
            (false, Duration::from_secs(5)),
            "a success resets the count"
        );
        assert_eq!(s.observe(false), (false, Duration::from_secs(5)));
        assert_eq!(s.observe(false), (false, Duration::from_secs(5)));
        assert_eq!(
            s.observe(false),
            (true, Duration::from_millis(100)),
            "third failure in a row flips"
        );
        assert!(!s.ready());
        assert_eq!(s.observe(false), (false, Duration::from_millis(100)));
    }

    #[test]
    fn targets() {
        let target = |vm, ip, port: &str| target(vm, ip, &crate::model::vm_spec::probe(port));
        assert_eq!(target(false, "10.0.0.1", ""), Target::Unready("vm gone".into()));
        assert_eq!(target(true, "", "22"), Target::Unready("waiting for dhcp lease".into()));
        assert_eq!(
            target(true, "10.0.0.1", "22"),
            Target::Tcp("10.0.0.1:22".parse().unwrap())
        );
        assert_eq!(target(true, "10.0.0.1", ""), Target::Icmp("10.0.0.1".parse().unwrap()));
        assert!(matches!(target(true, "10.0.0.1", "ssh"), Target::Unready(m) if m.contains("not a port number")));
        assert!(matches!(target(true, "10.0.0.1", "0"), Target::Unready(_)));
        assert!(matches!(target(true, "fe80::1", ""), Target::Unready(m) if m.contains("IPv6")));
    }

    #[tokio::test]
    async fn concurrent_pings_of_one_address_do_not_collide() {
        // Two agents of one guest ping it at once (startup's and CreatePod's): with one
        // sequence number for every echo the ICMP client refused the second as a duplicate.
        let prober = NetProber::default();
        let ip: Ipv4Addr = "127.0.0.1".parse().unwrap();
        let t = Duration::from_secs(5);
        let (a, b, c) = tokio::join!(prober.ping(ip, t), prober.ping(ip, t), prober.ping(ip, t));
        assert!(a.is_ok() && b.is_ok() && c.is_ok(), "{a:?} {b:?} {c:?}");
    }

    struct Flaky {
        up: AtomicBool,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl Prober for Flaky {
        async fn tcp(&self, _: SocketAddr, _: Duration) -> Result<(), ProbeError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.up.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into())
            }
        }
        async fn ping(&self, _: Ipv4Addr, _: Duration) -> Result<(), ProbeError> {
            Ok(())
        }
        async fn banner(&self, _: SocketAddr, _: &str, _: Duration) -> Result<(), ProbeError> {
            Ok(())
        }
    }

    fn fast() -> ProbeTimings {
        ProbeTimings {
            initial: Duration::from_millis(5),
            max_unready: Duration::from_millis(10),
            ready: Duration::from_millis(10),
            timeout: Duration::from_secs(1),
            failures_to_unready: 3,
        }
    }

    #[tokio::test]
    async fn the_first_probe_runs_before_start_returns_and_flips_call_back() {
        let prober = Arc::new(Flaky {
            up: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
        });
        let probes = Arc::new(Probes::new(
            prober.clone(),
            fast(),
            prometheus::Histogram::with_opts(prometheus::HistogramOpts::new("t", "t")).unwrap(),
        ));
        let flips = Arc::new(Mutex::new(Vec::new()));
        // What `prepare` saw: the flip, and the readiness the status could read meanwhile.
        let prepared = Arc::new(Mutex::new(Vec::new()));
        let (f, seen, looked_up) = (flips.clone(), prepared.clone(), probes.clone());
        let target: TargetFn = Arc::new(|| Some(Target::Tcp("127.0.0.1:1".parse().unwrap())));
        // The agent's task holds the other reference: when it ends, this one is the last.
        let held = target.clone();
        let hooks = FlipHooks {
            prepare: Arc::new(move |ready| {
                let visible = looked_up.result("ns/p", "u1").map(|r| r.ready);
                seen.lock().unwrap().push((ready, visible));
                Box::pin(async {})
            }),
            announce: Arc::new(move |ready| f.lock().unwrap().push(ready)),
        };
        probes.start("ns/p", "u1", target, hooks).await;
        assert_eq!(prober.calls.load(Ordering::SeqCst), 1, "the first probe is synchronous");
        let r = probes.result("ns/p", "u1").unwrap();
        assert!(
            !r.ready && r.message.contains("tcp probe 1: connection refused"),
            "{r:?}"
        );
        assert!(probes.result("ns/p", "other-uid").is_none());

        prober.up.store(true, Ordering::SeqCst);
        assert!(
            soon(|| !flips.lock().unwrap().is_empty()).await,
            "the agent announces the flip to ready"
        );
        assert_eq!(flips.lock().unwrap().as_slice(), &[true]);
        assert_eq!(probes.result("ns/p", "u1").unwrap().message, "tcp ok");

        prober.up.store(false, Ordering::SeqCst);
        assert!(
            soon(|| flips.lock().unwrap().len() >= 2).await,
            "the agent announces the flip back to not ready"
        );
        assert_eq!(flips.lock().unwrap().as_slice(), &[true, false]);
        assert_eq!(
            prepared.lock().unwrap().as_slice(),
            &[(true, Some(false)), (false, Some(true))],
            "each flip is prepared while the status still reads the readiness before it (a \
             ready pod stays ready through the failures before the third in a row)"
        );

        probes.forget("ns/p", Some("u1"));
        let calls = prober.calls.load(Ordering::SeqCst);
        assert!(probes.result("ns/p", "u1").is_none());
        assert!(
            soon(|| Arc::strong_count(&held) <= 1).await,
            "a forgotten agent's task ends"
        );
        // The agent is gone, so its count is final: at most the probe already under way when
        // it was forgotten landed after the forget.
        let after = prober.calls.load(Ordering::SeqCst);
        assert!(after <= calls + 1, "a forgotten agent stops probing: {calls} → {after}");
    }
}
