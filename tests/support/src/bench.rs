//! What the benchmark binaries (`tests/benches`) read the same way: their `BENCH_*` knobs, the
//! simulator binary, this process's memory from `/proc/self/status` and CPU time from
//! `getrusage`, medians. Each bench prints its own table; these only gather the inputs.

use std::path::PathBuf;
use std::time::Duration;

/// The positive integer in `name`, else `default` (unset, unparsable or 0: a bench of nothing
/// measures nothing).
pub fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// The comma-separated integers in `name` (unparsable items left out), else those of `default`.
pub fn env_list(name: &str, default: &str) -> Vec<u64> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect()
}

/// The first integer of [`env_list`]`(name)`, else `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    env_list(name, &default.to_string()).first().copied().unwrap_or(default)
}

/// Points `COCOON_SIM_BIN` at the simulator when it is not set: the one of the bench's own
/// profile (`cargo build --release -p cocoon-sim`), else the debug one. Returns the binary it
/// chose (`None`: the variable was set already). Call it first thing in `main`, before any
/// thread starts: it sets a process environment variable.
#[allow(unsafe_code)]
pub fn locate_sim() -> Option<PathBuf> {
    if std::env::var_os("COCOON_SIM_BIN").is_some() {
        return None;
    }
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf();
    let candidates = [
        profile_dir.join("cocoon-sim"),
        profile_dir.parent().unwrap().join("debug/cocoon-sim"),
    ];
    let found = candidates
        .iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("cocoon-sim not found at {candidates:?}: run `cargo build --release -p cocoon-sim`"));
    // SAFETY: single-threaded here (the caller's contract: before the tokio runtime starts).
    unsafe { std::env::set_var("COCOON_SIM_BIN", found) };
    Some(found.clone())
}

/// A `kB` field of `/proc/self/status` (`"VmRSS:"`, `"VmHWM:"`), 0 when it cannot be read.
pub fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// User + system CPU time so far of `who`: `libc::RUSAGE_SELF` (this process),
/// `RUSAGE_THREAD` (the calling thread) or `RUSAGE_CHILDREN` (the children reaped so far).
#[allow(unsafe_code)]
pub fn cpu_time(who: libc::c_int) -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(who, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The middle of `v` (the upper one of an even count).
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
