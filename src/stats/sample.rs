//! One sample of the node and of every tracked VM, read straight from the kernel's files
//! (no cocoon CLI call), cached for a short while so that `/stats/summary`, `/metrics/resource`
//! and the `cocoon_vk_vm_*` collector share it.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use super::parse::{self, CpuStat, IfaceCounters};
use super::paths::HostPaths;
use crate::host;
use crate::host::memory::MemInfo;

/// A VM to sample, as the provider tracks it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmTarget {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    /// The container name the stats are reported under (the pod's first container).
    pub container: String,
    pub vm_id: String,
    pub vm_name: String,
    /// `cloud-hypervisor` or `firecracker`.
    pub hypervisor: crate::hypervisor::Hypervisor,
    /// The VMM's pid (0 while none runs).
    pub pid: i64,
    /// The first NIC's TAP device on the host.
    pub tap: Option<String>,
    /// The pod's `status.startTime`.
    pub pod_start: Option<SystemTime>,
}

/// What the provider offers the sampler: its tracked VMs, copied under its lock.
pub trait VmTargets: Send + Sync {
    fn vm_targets(&self) -> Vec<VmTarget>;
}

/// The COW disk: bytes the filesystem allocated (`st_blocks × 512`) and its apparent size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CowUsage {
    pub allocated: u64,
    pub size: u64,
}

/// Network counters from the guest's point of view (the host TAP's counters swapped: what
/// the host transmits on the TAP, the guest receives).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestNet {
    pub iface: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

impl GuestNet {
    fn from_tap(iface: &str, c: IfaceCounters) -> Self {
        Self {
            iface: iface.to_string(),
            rx_bytes: c.tx_bytes,
            rx_errors: c.tx_errors,
            tx_bytes: c.rx_bytes,
            tx_errors: c.rx_errors,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct VmSample {
    pub target: VmTarget,
    /// `cpu.stat` of the VM's scope; a missing scope reads as zero rather than failing the sample.
    pub cpu: CpuStat,
    /// CPU rate since the previous sample, in nanocores (None on the first sample).
    pub cpu_nanocores: Option<u64>,
    /// The VMM's resident set (the guest's memory as the host sees it).
    pub rss: Option<u64>,
    pub net: Option<GuestNet>,
    pub cow: Option<CowUsage>,
    /// When the VMM process started (the "container" start).
    pub started: Option<SystemTime>,
}

impl VmSample {
    pub fn cpu_usage_ns(&self) -> u64 {
        self.cpu.usage_usec.saturating_mul(1000)
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeSample {
    /// Busy CPU time of the whole node (`/proc/stat`), nanoseconds.
    pub cpu_usage_ns: u64,
    pub cpu_nanocores: Option<u64>,
    pub mem_total: u64,
    pub mem_available: u64,
    /// `statvfs(COCOON_ROOT_DIR)`.
    pub fs: Option<FsUsage>,
    /// Host boot time (`btime`).
    pub boot_time: Option<SystemTime>,
}

impl NodeSample {
    /// MemTotal − MemAvailable, as the Go daemon's Summary reported it.
    pub fn memory_used(&self) -> u64 {
        self.mem_total.saturating_sub(self.mem_available)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FsUsage {
    pub capacity: u64,
    pub available: u64,
    pub used: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

/// One sample of everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// Wall-clock time the sample was taken.
    pub time: Option<SystemTime>,
    pub node: NodeSample,
    pub vms: Vec<VmSample>,
}

fn read(path: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn statvfs(path: &std::path::Path) -> Option<FsUsage> {
    let space = host::fs::space(path).ok()?;
    Some(FsUsage {
        capacity: space.total,
        available: space.available,
        used: space.used,
        inodes: space.inodes,
        inodes_free: space.inodes_free,
    })
}

/// Reads the node's and every target's files once (blocking I/O; the uncached cost).
pub fn collect(paths: &HostPaths, targets: Vec<VmTarget>) -> Sample {
    let ticks = host::cpu::clock_ticks_per_second();
    let proc_stat = read(&paths.proc_file("stat")).and_then(|t| parse::proc_stat(&t));
    let mem = read(&paths.proc_file("meminfo")).map(|t| MemInfo::parse(&t));
    let boot_time = proc_stat
        .filter(|s| s.btime > 0)
        .map(|s| UNIX_EPOCH + Duration::from_secs(s.btime));
    let node = NodeSample {
        cpu_usage_ns: proc_stat.map_or(0, |s| s.busy_jiffies.saturating_mul(1_000_000_000 / ticks)),
        cpu_nanocores: None,
        mem_total: mem.and_then(|m| m.total).unwrap_or(0),
        mem_available: mem.and_then(|m| m.available).unwrap_or(0),
        fs: statvfs(&paths.root_dir),
        boot_time,
    };
    let vms = targets
        .into_iter()
        .map(|target| collect_vm(paths, target, boot_time, ticks))
        .collect();
    Sample {
        time: Some(SystemTime::now()),
        node,
        vms,
    }
}

fn collect_vm(paths: &HostPaths, target: VmTarget, boot: Option<SystemTime>, ticks: u64) -> VmSample {
    let pid_stat = (target.pid > 0)
        .then(|| read(&paths.pid_file(target.pid, "stat")))
        .flatten();
    // A VM outside cocoon's cgroups (a cocoon-macos guest) is charged its VMM process's CPU
    // time instead: every vCPU is a thread of that process.
    let cpu = read(&paths.cpu_stat(&target.vm_id))
        .and_then(|t| parse::cpu_stat(&t))
        .or_else(|| {
            let ticks_used = parse::pid_cpu_ticks(pid_stat.as_deref()?)?;
            Some(CpuStat {
                usage_usec: ticks_used.saturating_mul(1_000_000 / ticks),
                ..CpuStat::default()
            })
        })
        .unwrap_or_default();
    let (rss, net, started) = if target.pid > 0 {
        let rss = read(&paths.pid_file(target.pid, "status")).and_then(|t| parse::status_rss(&t));
        let net = target.tap.as_deref().and_then(|tap| {
            read(&paths.pid_file(target.pid, "net/dev"))
                .and_then(|t| parse::net_dev(&t, tap))
                .map(|c| GuestNet::from_tap(tap, c))
        });
        let started = pid_stat
            .as_deref()
            .and_then(parse::pid_start_ticks)
            .zip(boot)
            .map(|(t, boot)| boot + Duration::from_nanos(t.saturating_mul(1_000_000_000 / ticks)));
        (rss, net, started)
    } else {
        (None, None, None)
    };
    let cow = paths
        .cow_candidates(&target.hypervisor, &target.vm_id)
        .iter()
        .find_map(|p| std::fs::metadata(p).ok())
        .map(|m| CowUsage {
            allocated: m.blocks() * 512,
            size: m.size(),
        });
    VmSample {
        target,
        cpu,
        cpu_nanocores: None,
        rss,
        net,
        cow,
        started,
    }
}

/// When process `pid` started (`/proc/<pid>/stat` starttime after `/proc/stat` btime).
pub fn process_start(paths: &HostPaths, pid: i64) -> Option<SystemTime> {
    if pid <= 0 {
        return None;
    }
    let btime = read(&paths.proc_file("stat")).and_then(|t| parse::proc_stat(&t))?.btime;
    let ticks = read(&paths.pid_file(pid, "stat")).and_then(|t| parse::pid_start_ticks(&t))?;
    let per_s = host::cpu::clock_ticks_per_second();
    Some(UNIX_EPOCH + Duration::from_secs(btime) + Duration::from_nanos(ticks.saturating_mul(1_000_000_000 / per_s)))
}

/// Δusage / Δt in nanocores, when the interval is long enough to mean something.
fn rate(prev_ns: u64, cur_ns: u64, dt: Duration) -> Option<u64> {
    if dt < Duration::from_millis(500) || cur_ns < prev_ns {
        return None;
    }
    Some(((cur_ns - prev_ns) as u128 * 1_000_000_000 / dt.as_nanos()) as u64)
}

/// Fills the CPU rates of `cur` from `prev` (same VM id, earlier sample).
pub fn with_rates(mut cur: Sample, prev: &Sample) -> Sample {
    let (Some(t1), Some(t0)) = (cur.time, prev.time) else {
        return cur;
    };
    let Ok(dt) = t1.duration_since(t0) else { return cur };
    cur.node.cpu_nanocores = rate(prev.node.cpu_usage_ns, cur.node.cpu_usage_ns, dt);
    let before: HashMap<&str, u64> = prev
        .vms
        .iter()
        .map(|v| (v.target.vm_id.as_str(), v.cpu_usage_ns()))
        .collect();
    for vm in &mut cur.vms {
        if let Some(p) = before.get(vm.target.vm_id.as_str()) {
            vm.cpu_nanocores = rate(*p, vm.cpu_usage_ns(), dt);
        }
    }
    cur
}

/// The shared, cached sample. A request finding the cache older than `ttl` collects a new
/// one; concurrent requests wait for that one collection instead of reading the files again.
pub struct Sampler {
    paths: HostPaths,
    source: Arc<dyn VmTargets>,
    ttl: Duration,
    latest: Mutex<Option<(Instant, Arc<Sample>)>>,
}

/// How long one sample serves every surface: 2 s, so the surfaces scraped together read the host
/// once.
pub const SAMPLE_TTL: Duration = Duration::from_secs(2);

/// How often [`Sampler::keep_fresh`] samples while nothing asks (the kubelet runs cadvisor's
/// housekeeping every 10 s). A CPU rate is the difference of two samples: with samples taken
/// only on request, the first Summary after a quiet spell had no earlier sample to take it
/// from (no `usageNanoCores`), or one from long ago (a rate averaged over hours).
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(10);

impl Sampler {
    pub fn new(paths: HostPaths, source: Arc<dyn VmTargets>, ttl: Duration) -> Arc<Self> {
        Arc::new(Self {
            paths,
            source,
            ttl,
            latest: Mutex::new(None),
        })
    }

    pub fn paths(&self) -> &HostPaths {
        &self.paths
    }

    /// The cached sample, or a fresh one (blocking: call from a blocking context).
    pub fn sample_blocking(&self) -> Arc<Sample> {
        let mut latest = self.latest.lock().expect("sampler lock");
        if let Some((at, sample)) = latest.as_ref()
            && at.elapsed() < self.ttl
        {
            return sample.clone();
        }
        let fresh = collect(&self.paths, self.source.vm_targets());
        let fresh = match latest.as_ref() {
            Some((_, prev)) => with_rates(fresh, prev),
            None => fresh,
        };
        let fresh = Arc::new(fresh);
        *latest = Some((Instant::now(), fresh.clone()));
        fresh
    }

    /// [`Sampler::sample_blocking`] off the async workers.
    pub async fn sample(self: &Arc<Self>) -> Arc<Sample> {
        let me = self.clone();
        match tokio::task::spawn_blocking(move || me.sample_blocking()).await {
            Ok(s) => s,
            Err(_) => Arc::new(Sample::default()),
        }
    }

    /// Samples every `interval` until `shutdown` (a sample asked for within the cache's life
    /// is not taken again), so that every sample has a recent one before it to rate against.
    pub fn keep_fresh(
        self: &Arc<Self>,
        interval: Duration,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        me.sample().await;
                    }
                    _ = shutdown.cancelled() => return,
                }
            }
        })
    }

    /// Drops the cache (the next request collects).
    pub fn invalidate(&self) {
        *self.latest.lock().expect("sampler lock") = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vm(id: &str, usage_usec: u64) -> VmSample {
        VmSample {
            target: VmTarget {
                vm_id: id.into(),
                ..Default::default()
            },
            cpu: CpuStat {
                usage_usec,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn this_process_started_after_boot_and_before_now() {
        let started = process_start(&HostPaths::default(), i64::from(std::process::id())).unwrap();
        assert!(started <= SystemTime::now());
        assert!(
            started > SystemTime::now() - Duration::from_secs(24 * 3600),
            "{started:?}"
        );
        assert_eq!(process_start(&HostPaths::default(), 0), None);
    }

    #[test]
    fn a_vm_without_a_cocoon_cgroup_is_charged_its_process_cpu_time() {
        let cgroups = tempfile::tempdir().unwrap();
        let paths = HostPaths {
            cgroup_root: cgroups.path().to_path_buf(),
            ..HostPaths::default()
        };
        let cgroup_stat = paths.cpu_stat("ch");
        std::fs::create_dir_all(cgroup_stat.parent().unwrap()).unwrap();
        std::fs::write(&cgroup_stat, "usage_usec 1500000\n").unwrap();
        // This process stands for a VMM: make sure it has used at least a few clock ticks.
        let until = Instant::now() + Duration::from_millis(60);
        let mut spin = 0u64;
        while Instant::now() < until {
            spin = std::hint::black_box(spin.wrapping_add(1));
        }
        let me = i64::from(std::process::id());
        let target = |vm_id: &str| VmTarget {
            vm_id: vm_id.into(),
            pid: me,
            ..Default::default()
        };
        let sample = collect(&paths, vec![target("ch"), target("qemu-mac")]);
        assert_eq!(
            sample.vms[0].cpu.usage_usec, 1_500_000,
            "the cgroup's figure when it has one"
        );
        let process = sample.vms[1].cpu.usage_usec;
        assert!(process >= 10_000, "the process's own CPU time: {process} µs");
        assert!(sample.vms[1].rss.is_some(), "and its memory, as before");
    }

    #[test]
    fn rates_come_from_the_previous_sample_of_the_same_vm() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1000);
        let prev = Sample {
            time: Some(t0),
            node: NodeSample {
                cpu_usage_ns: 1_000_000_000,
                ..Default::default()
            },
            vms: vec![vm("a", 1_000_000), vm("gone", 5)],
        };
        let cur = Sample {
            time: Some(t0 + Duration::from_secs(2)),
            node: NodeSample {
                cpu_usage_ns: 4_000_000_000,
                ..Default::default()
            },
            vms: vec![vm("a", 2_000_000), vm("new", 10)],
        };
        let r = with_rates(cur, &prev);
        assert_eq!(r.node.cpu_nanocores, Some(1_500_000_000), "3 s of CPU over 2 s");
        assert_eq!(r.vms[0].cpu_nanocores, Some(500_000_000), "1 s of CPU over 2 s");
        assert_eq!(r.vms[1].cpu_nanocores, None, "no earlier sample");
    }

    #[test]
    fn no_rate_over_a_too_short_interval_or_a_reset_counter() {
        assert_eq!(rate(10, 20, Duration::from_millis(100)), None);
        assert_eq!(rate(20, 10, Duration::from_secs(1)), None, "a restarted VM's counter");
        assert_eq!(rate(0, 1_000_000_000, Duration::from_secs(1)), Some(1_000_000_000));
    }

    #[test]
    fn guest_network_is_the_tap_seen_from_the_other_side() {
        let n = GuestNet::from_tap(
            "tap0",
            IfaceCounters {
                rx_bytes: 1,
                rx_errors: 2,
                tx_bytes: 3,
                tx_errors: 4,
            },
        );
        assert_eq!((n.rx_bytes, n.rx_errors, n.tx_bytes, n.tx_errors), (3, 4, 1, 2));
    }
}
