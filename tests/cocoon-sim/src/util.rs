//! Small helpers: IDs, timestamps, size parsing, deterministic content.

use std::io::Read;
use std::time::{SystemTime, UNIX_EPOCH};

const BASE32: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// A 26-character base32 ID (alphabet `A-Z2-7`), like Go's `crypto/rand.Text()`.
pub fn new_id() -> String {
    let mut bytes = [0u8; 26];
    let filled = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if filled.is_err() {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let mut x = (nanos as u64) ^ ((std::process::id() as u64) << 32) | 1;
        for b in bytes.iter_mut() {
            x = xorshift(x);
            *b = x as u8;
        }
    }
    bytes.iter().map(|b| BASE32[(*b & 31) as usize] as char).collect()
}

/// Nanoseconds on the machine's monotonic clock (`CLOCK_MONOTONIC`): the one clock the simulator's
/// logs and a test's own records share, so events of different processes can be ordered.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

pub fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// RFC 3339 UTC timestamp with nanoseconds, e.g. `2026-08-12T02:01:02.123456789Z`.
pub fn now_rfc3339() -> String {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    format_rfc3339(d.as_secs() as i64, d.subsec_nanos())
}

pub fn format_rfc3339(secs: i64, nanos: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// docker `units.RAMInBytes`: `1G`, `512M`, `4Gi`, `4GiB`, plain bytes. All suffixes are binary.
pub fn ram_in_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, rest) = s.split_at(digits_end);
    if num.is_empty() {
        return None;
    }
    let value: f64 = num.parse().ok()?;
    let rest = rest.trim_start().to_ascii_lowercase();
    let rest = rest.strip_suffix('b').unwrap_or(&rest);
    let rest = rest.strip_suffix('i').unwrap_or(rest);
    let mult: u64 = match rest {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        "p" => 1 << 50,
        _ => return None,
    };
    Some((value * mult as f64) as u64)
}

/// Fills `buf` with deterministic pseudo-random bytes derived from `seed` and `block`.
pub fn fill_block(buf: &mut [u8], seed: u64, block: u64) {
    let mut x = seed ^ block.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        x = xorshift(x);
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

pub fn seed_of(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_base32_26() {
        let id = new_id();
        assert_eq!(id.len(), 26);
        assert!(id.bytes().all(|b| BASE32.contains(&b)));
        assert_ne!(id, new_id());
    }

    #[test]
    fn timestamps() {
        assert_eq!(format_rfc3339(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(format_rfc3339(1_786_500_062, 5), "2026-08-12T02:01:02.000000005Z");
    }

    #[test]
    fn ram_sizes() {
        assert_eq!(ram_in_bytes("1G"), Some(1 << 30));
        assert_eq!(ram_in_bytes("512M"), Some(512 << 20));
        assert_eq!(ram_in_bytes("4Gi"), Some(4 << 30));
        assert_eq!(ram_in_bytes("4294967296"), Some(4294967296));
        assert_eq!(ram_in_bytes("lots"), None);
    }
}
