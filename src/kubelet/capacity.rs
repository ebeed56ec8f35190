//! Host measurement (I/O at the edge): CPUs, memory and hugepages from `/proc/meminfo`,
//! storage from `statvfs(COCOON_ROOT_DIR)`, the node IP. Parsing is pure and unit-tested.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::host;
use crate::host::memory::MemInfo;

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

/// `(total, available)` bytes of the filesystem holding `path`.
pub fn statfs_bytes(path: &Path) -> Result<(u64, u64), MeasureError> {
    let space = host::fs::space(path).map_err(|source| MeasureError::Statfs {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((space.total, space.available))
}

/// Measures the host: CPUs, `/proc/meminfo`, `statvfs(root_dir)`.
pub fn measure_host(root_dir: &Path) -> Result<HostResources, MeasureError> {
    let meminfo_path = PathBuf::from("/proc/meminfo");
    let text = std::fs::read_to_string(&meminfo_path).map_err(|source| MeasureError::Read {
        path: meminfo_path.clone(),
        source,
    })?;
    let mem = MemInfo::parse(&text);
    let memory_bytes = mem.total.ok_or(MeasureError::NoMemTotal { path: meminfo_path })?;
    let (storage_total_bytes, storage_available_bytes) = statfs_bytes(root_dir)?;
    let hugepages = (mem.hugepages_total > 0).then(|| HugePages {
        // The key follows the host page size, falling back to 2Mi.
        page_size_bytes: mem.hugepage_size.unwrap_or(2 << 20),
        total_pages: mem.hugepages_total,
    });
    Ok(HostResources {
        cpus: host::cpu::usable_cpus(),
        memory_bytes,
        storage_total_bytes,
        storage_available_bytes,
        hugepages,
    })
}

/// The first non-loopback IPv4 address of the host.
pub fn detect_node_ip() -> Result<IpAddr, MeasureError> {
    host::net::first_routable_ipv4()
        .map(IpAddr::V4)
        .ok_or(MeasureError::NoNodeIp)
}

#[cfg(test)]
mod tests {
    use super::*;

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
