//! Host measurement (I/O at the edge): CPUs, memory and hugepages from `/proc/meminfo`,
//! storage from `statvfs(COCOON_ROOT_DIR)`, the node IP. Parsing is pure and unit-tested.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

/// What the host has, as measured once at startup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostResources {
    /// Logical CPUs this process may run on.
    pub cpus: u64,
    /// `MemTotal`, bytes.
    pub memory_bytes: u64,
    /// Total size of the filesystem holding `COCOON_ROOT_DIR`, bytes.
    pub storage_total_bytes: u64,
    /// Space available to unprivileged users there (`f_bavail`), bytes.
    pub storage_available_bytes: u64,
    /// Pre-allocated hugepages, if any.
    pub hugepages: Option<HugePages>,
}

/// `HugePages_Total` pages of `Hugepagesize` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugePages {
    pub page_size_bytes: u64,
    pub total_pages: u64,
}

/// Why the host could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error("reading {path}: {source}; the node capacity is measured from it (set VK_NODE_MEM to skip)")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} has no MemTotal line; set VK_NODE_MEM to the node memory")]
    NoMemTotal { path: PathBuf },
    #[error("statvfs({path}): {source}; COCOON_ROOT_DIR must exist (or set VK_NODE_STORAGE)")]
    Statfs { path: PathBuf, source: std::io::Error },
    #[error("no non-loopback IPv4 address found on this host; set VK_NODE_IP")]
    NoNodeIp,
}

/// The fields of `/proc/meminfo` the node needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    pub mem_total_bytes: Option<u64>,
    pub hugepages_total: u64,
    pub hugepage_size_bytes: Option<u64>,
}

/// Parses `/proc/meminfo` text.
pub fn parse_meminfo(text: &str) -> MemInfo {
    let mut info = MemInfo::default();
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let Some(value) = parts.next().and_then(|v| v.parse::<u64>().ok()) else {
            continue;
        };
        let bytes = if parts.next() == Some("kB") {
            value * 1024
        } else {
            value
        };
        match key.trim() {
            "MemTotal" => info.mem_total_bytes = Some(bytes),
            "HugePages_Total" => info.hugepages_total = value,
            "Hugepagesize" => info.hugepage_size_bytes = Some(bytes),
            _ => {}
        }
    }
    info
}

fn cpu_count() -> u64 {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most size_of::<cpu_set_t>() bytes.
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

/// `(total, available)` bytes of the filesystem holding `path`.
pub fn statfs_bytes(path: &Path) -> Result<(u64, u64), MeasureError> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|e| MeasureError::Statfs {
        path: path.to_path_buf(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
    })?;
    // SAFETY: c_path is a valid NUL-terminated string and st is a properly sized out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(MeasureError::Statfs {
            path: path.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    let frsize = st.f_frsize as u64;
    Ok((st.f_blocks as u64 * frsize, st.f_bavail as u64 * frsize))
}

/// Measures the host: CPUs, `/proc/meminfo`, `statvfs(root_dir)`.
pub fn measure_host(root_dir: &Path) -> Result<HostResources, MeasureError> {
    let meminfo_path = PathBuf::from("/proc/meminfo");
    let text = std::fs::read_to_string(&meminfo_path).map_err(|source| MeasureError::Read {
        path: meminfo_path.clone(),
        source,
    })?;
    let mem = parse_meminfo(&text);
    let memory_bytes = mem
        .mem_total_bytes
        .ok_or(MeasureError::NoMemTotal { path: meminfo_path })?;
    let (storage_total_bytes, storage_available_bytes) = statfs_bytes(root_dir)?;
    let hugepages = (mem.hugepages_total > 0).then(|| HugePages {
        // The key follows the host page size, falling back to 2Mi.
        page_size_bytes: mem.hugepage_size_bytes.unwrap_or(2 << 20),
        total_pages: mem.hugepages_total,
    });
    Ok(HostResources {
        cpus: cpu_count(),
        memory_bytes,
        storage_total_bytes,
        storage_available_bytes,
        hugepages,
    })
}

/// The first non-loopback IPv4 address of the host.
pub fn detect_node_ip() -> Result<IpAddr, MeasureError> {
    let mut found: Option<Ipv4Addr> = None;
    // SAFETY: getifaddrs allocates a list we walk read-only and free with freeifaddrs.
    unsafe {
        let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut ifap) != 0 {
            return Err(MeasureError::NoNodeIp);
        }
        let mut cur = ifap;
        while !cur.is_null() {
            let ifa = &*cur;
            if !ifa.ifa_addr.is_null() && (*ifa.ifa_addr).sa_family as i32 == libc::AF_INET {
                let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !ip.is_loopback() && !ip.is_unspecified() {
                    found = Some(ip);
                    break;
                }
            }
            cur = ifa.ifa_next;
        }
        libc::freeifaddrs(ifap);
    }
    found.map(IpAddr::V4).ok_or(MeasureError::NoNodeIp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields() {
        let text = "MemTotal:       16314220 kB\nMemFree:         1000 kB\nHugePages_Total:      8\nHugePages_Free:       8\nHugepagesize:       2048 kB\n";
        let m = parse_meminfo(text);
        assert_eq!(m.mem_total_bytes, Some(16314220 * 1024));
        assert_eq!(m.hugepages_total, 8);
        assert_eq!(m.hugepage_size_bytes, Some(2 << 20));
        assert_eq!(parse_meminfo("garbage\n"), MemInfo::default());
    }

    #[test]
    fn measures_this_host() {
        let dir = std::env::temp_dir();
        let host = measure_host(&dir).expect("measure the build host");
        assert!(host.cpus >= 1);
        assert!(host.memory_bytes > 0);
        assert!(host.storage_total_bytes >= host.storage_available_bytes);
        assert!(matches!(
            measure_host(Path::new("/definitely/not/here")),
            Err(MeasureError::Statfs { .. })
        ));
    }
}
