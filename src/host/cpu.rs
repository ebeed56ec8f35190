//! CPUs and CPU time.

use std::time::Duration;

/// The logical CPUs this process may run on (its affinity mask), or what `std` reports when the
/// mask cannot be read.
pub fn usable_cpus() -> u64 {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most size_of::<cpu_set_t>()
    // bytes into the set on this stack.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            let n = libc::CPU_COUNT(&set);
            if n > 0 {
                return n as u64;
            }
        }
    }
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

/// CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`); `None` if unavailable.
/// Unlike a wall clock it does not advance while the thread waits to be scheduled.
pub fn thread_cpu_time() -> Option<Duration> {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec it is given, which lives on this stack.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    (rc == 0).then(|| Duration::new(now.tv_sec as u64, now.tv_nsec as u32))
}

/// The kernel's clock ticks per second: `/proc` counts CPU times in them.
pub fn clock_ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_sees_its_cpu_time_grow_and_the_host_has_cpus_and_ticks() {
        let before = thread_cpu_time().expect("thread CPU clock");
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(thread_cpu_time().unwrap() > before);
        assert!(usable_cpus() >= 1);
        assert!(clock_ticks_per_second() >= 1);
    }
}
