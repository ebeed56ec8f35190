//! Parsers of the kernel files the stats come from (pure: text in, numbers out). Each returns
//! `None` for a file that does not have the expected shape, never a guess.

/// The cgroup v2 `cpu.stat` fields the daemon reports (microseconds and counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuStat {
    pub usage_usec: u64,
    pub throttled_usec: u64,
    pub nr_throttled: u64,
    pub nr_periods: u64,
}

/// `cpu.stat`: `key value` lines. `usage_usec` must be present; the throttling keys exist only
/// when the CPU controller is enabled and read as zero otherwise.
pub fn cpu_stat(text: &str) -> Option<CpuStat> {
    let mut stat = CpuStat::default();
    let mut usage = None;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(key), Some(value)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Ok(value) = value.parse::<u64>() else { continue };
        match key {
            "usage_usec" => usage = Some(value),
            "throttled_usec" => stat.throttled_usec = value,
            "nr_throttled" => stat.nr_throttled = value,
            "nr_periods" => stat.nr_periods = value,
            _ => {}
        }
    }
    stat.usage_usec = usage?;
    Some(stat)
}

/// `VmRSS` of `/proc/<pid>/status`, in bytes.
pub fn status_rss(text: &str) -> Option<u64> {
    kib_field(text, "VmRSS:")
}

/// A `Name:   123 kB` field of `/proc/<pid>/status`, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let mut parts = line[name.len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => value.checked_mul(1024),
        None => Some(value),
        Some(_) => None,
    }
}

/// Counters of one interface in `/proc/<pid>/net/dev`, as the kernel names them (the host's
/// side of a TAP: `rx` is what the guest sent).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IfaceCounters {
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

/// The line of interface `iface` in `/proc/<pid>/net/dev` (two header lines, then
/// `name: rx_bytes rx_packets rx_errs rx_drop rx_fifo rx_frame rx_compressed rx_multicast
/// tx_bytes tx_packets tx_errs …`).
pub fn net_dev(text: &str, iface: &str) -> Option<IfaceCounters> {
    for line in text.lines().skip(2) {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        if name.trim() != iface {
            continue;
        }
        let fields: Vec<u64> = rest.split_whitespace().map(|f| f.parse().ok()).collect::<Option<_>>()?;
        if fields.len() < 11 {
            return None;
        }
        return Some(IfaceCounters {
            rx_bytes: fields[0],
            rx_errors: fields[2],
            tx_bytes: fields[8],
            tx_errors: fields[10],
        });
    }
    None
}

/// The node's CPU time from the `cpu` line of `/proc/stat`, in jiffies: busy (everything but
/// `idle` and `iowait`) and the boot time (`btime`, seconds since the epoch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcStat {
    pub busy_jiffies: u64,
    pub btime: u64,
}

pub fn proc_stat(text: &str) -> Option<ProcStat> {
    let mut out = ProcStat::default();
    let mut cpu = false;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        match parts.next() {
            Some("cpu") => {
                // user nice system idle iowait irq softirq steal (guest time is already in user).
                let v: Vec<u64> = parts.take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
                if v.len() < 4 {
                    return None;
                }
                let idle = v[3] + v.get(4).copied().unwrap_or(0);
                out.busy_jiffies = v.iter().sum::<u64>() - idle;
                cpu = true;
            }
            Some("btime") => out.btime = parts.next()?.parse().ok()?,
            _ => {}
        }
    }
    cpu.then_some(out)
}

/// Field 22 of `/proc/<pid>/stat` (`starttime`, clock ticks after boot). The command name
/// (field 2) is in parentheses and may contain spaces, so fields are counted after its `)`.
pub fn pid_start_ticks(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    // After the name come field 3 (state) … field 22 (starttime): index 19.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Fields 14 and 15 of `/proc/<pid>/stat` (`utime` + `stime`, clock ticks): the CPU time of
/// every thread of the process. Fields are counted after the command name's `)`, as above.
pub fn pid_cpu_ticks(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is index 0, so utime and stime are indices 11 and 12.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime.saturating_add(stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_cpu_time_is_its_user_and_system_ticks() {
        // A command name with spaces and a `)` of its own, as `/proc` prints it.
        let stat = "4242 (qemu (vm) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 1500 250 0 0 20 0 9 0 777 1000 50";
        assert_eq!(pid_cpu_ticks(stat), Some(1750));
        assert_eq!(pid_start_ticks(stat), Some(777));
        assert_eq!(pid_cpu_ticks("4242 (short) S 1 2"), None);
    }

    #[test]
    fn cpu_stat_with_and_without_the_cpu_controller() {
        let full = "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\nnr_periods 40\nnr_throttled 3\nthrottled_usec 25000\n";
        assert_eq!(
            cpu_stat(full),
            Some(CpuStat {
                usage_usec: 1_500_000,
                throttled_usec: 25_000,
                nr_throttled: 3,
                nr_periods: 40
            })
        );
        assert_eq!(
            cpu_stat("usage_usec 7\nuser_usec 5\nsystem_usec 2\n"),
            Some(CpuStat {
                usage_usec: 7,
                ..Default::default()
            })
        );
        assert_eq!(cpu_stat(""), None);
        assert_eq!(cpu_stat("user_usec 5\n"), None);
    }

    #[test]
    fn rss_is_bytes() {
        let status = "Name:\tcloud-hypervisor\nVmPeak:\t  9000 kB\nVmRSS:\t  4096 kB\nThreads:\t4\n";
        assert_eq!(status_rss(status), Some(4096 * 1024));
        assert_eq!(status_rss("Name:\tx\n"), None, "a kernel thread has no VmRSS");
    }

    #[test]
    fn net_dev_finds_the_tap_line() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0\n\
tapK7Q2M4XZ-0: 123456  90    2    0    0     0          0         0   654321     80    1    0    0     0       0          0\n";
        assert_eq!(
            net_dev(text, "tapK7Q2M4XZ-0"),
            Some(IfaceCounters {
                rx_bytes: 123_456,
                rx_errors: 2,
                tx_bytes: 654_321,
                tx_errors: 1
            })
        );
        assert_eq!(net_dev(text, "tapOTHER-0"), None);
        assert_eq!(net_dev(text, "lo").map(|c| c.tx_bytes), Some(100));
    }

    #[test]
    fn proc_stat_busy_time_excludes_idle_and_iowait() {
        let text = "cpu  100 10 50 1000 20 5 5 2 0 0\ncpu0 50 5 25 500 10 2 3 1 0 0\nintr 1 2 3\nbtime 1700000000\n";
        assert_eq!(
            proc_stat(text),
            Some(ProcStat {
                busy_jiffies: 100 + 10 + 50 + 5 + 5 + 2,
                btime: 1_700_000_000
            })
        );
        assert_eq!(proc_stat("intr 1\n"), None);
    }

    #[test]
    fn start_ticks_skip_a_command_name_with_spaces() {
        let text = "4242 (cloud hyper) S 1 4242 4242 0 -1 4194560 100 0 0 0 5 3 0 0 20 0 4 0 987654 1000000 250 18446744073709551615";
        assert_eq!(pid_start_ticks(text), Some(987_654));
        assert_eq!(pid_start_ticks("garbage"), None);
    }
}
