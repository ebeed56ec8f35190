//! Processes: signals, liveness, the effective user, resource limits, the allocator's arenas.

use std::io;

/// Whether `pid` names a process this one may see (signal 0 succeeds, or is refused for lack of
/// permission, which still proves it exists). A zombie counts as existing here.
pub fn exists(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 sends nothing; it only checks existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Sends SIGTERM to `pid`. The caller must hold the process unreaped (a child it has not waited
/// for), so the pid cannot name another process.
pub fn terminate(pid: i32) -> io::Result<()> {
    signal(pid, libc::SIGTERM)
}

/// Sends SIGKILL to every process of the group `pgid`. As for [`terminate`], the group's leader
/// must be the caller's unreaped child.
pub fn kill_group(pgid: i32) -> io::Result<()> {
    if pgid <= 0 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    signal(-pgid, libc::SIGKILL)
}

fn signal(target: i32, sig: i32) -> io::Result<()> {
    // SAFETY: kill only sends a signal; it touches no memory of this process.
    if unsafe { libc::kill(target, sig) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The effective user id of this process.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Sets this process's `RLIMIT_AS` (soft and hard): past it, allocations fail.
pub fn limit_address_space(bytes: u64) -> io::Result<()> {
    let limit = libc::rlimit {
        rlim_cur: bytes,
        rlim_max: bytes,
    };
    // SAFETY: setrlimit only reads the struct passed to it.
    if unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Caps glibc's malloc at `arenas` heap arenas. Call before any other thread exists: glibc reads
/// the tunable when a thread first allocates.
pub fn cap_malloc_arenas(arenas: i32) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable of the allocator.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, arenas);
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_exists_and_a_reaped_child_does_not() {
        assert!(exists(std::process::id() as i32));
        assert!(!exists(0) && !exists(-1));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        assert!(!exists(pid), "a reaped child is gone");
    }

    #[test]
    fn terminate_ends_a_child_with_sigterm() {
        use std::os::unix::process::ExitStatusExt;
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        terminate(child.id() as i32).unwrap();
        assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGTERM));
        assert!(kill_group(0).is_err(), "group 0 would be this process's own group");
    }
}
