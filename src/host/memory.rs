//! The host's memory, from `/proc/meminfo` text (pure; the callers read the file, so tests and
//! `VK_PROC_ROOT` can hand them another one).

/// The fields of `/proc/meminfo` the daemon uses, in bytes (pages for `hugepages_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    pub total: Option<u64>,
    pub available: Option<u64>,
    pub hugepages_total: u64,
    pub hugepage_size: Option<u64>,
}

impl MemInfo {
    /// Parses `/proc/meminfo` text; lines it does not know or cannot read are skipped.
    pub fn parse(text: &str) -> Self {
        let mut info = MemInfo::default();
        for line in text.lines() {
            let Some((key, rest)) = line.split_once(':') else {
                continue;
            };
            let mut parts = rest.split_whitespace();
            let Some(value) = parts.next().and_then(|v| v.parse::<u64>().ok()) else {
                continue;
            };
            let bytes = match parts.next() {
                Some("kB") => value.checked_mul(1024),
                None => Some(value),
                Some(_) => None,
            };
            match key.trim() {
                "MemTotal" => info.total = bytes,
                "MemAvailable" => info.available = bytes,
                "HugePages_Total" => info.hugepages_total = value,
                "Hugepagesize" => info.hugepage_size = bytes,
                _ => {}
            }
        }
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_fields_are_bytes_and_pages() {
        let text = "MemTotal:       16314220 kB\nMemFree:         1000 kB\nMemAvailable:    8192000 kB\n\
                    HugePages_Total:      8\nHugePages_Free:       8\nHugepagesize:       2048 kB\n";
        assert_eq!(
            MemInfo::parse(text),
            MemInfo {
                total: Some(16_314_220 * 1024),
                available: Some(8_192_000 * 1024),
                hugepages_total: 8,
                hugepage_size: Some(2 << 20),
            }
        );
        assert_eq!(MemInfo::parse("garbage\nMemTotal: many kB\n"), MemInfo::default());
        assert_eq!(MemInfo::parse("MemTotal: 1 kB\n").available, None);
    }
}
