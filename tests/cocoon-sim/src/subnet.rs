//! A loopback guest subnet of its own for every simulator root a test creates.
//!
//! Loopback is one per machine, but each simulator root numbers its guests from the start of
//! its `static_subnet`: two roots in use at once — the tests of one binary run in parallel, and
//! other test binaries (other checkouts' suites too) run beside them — would both give their
//! first guest `127.88.0.2`. Their guests' listeners (the VMM's web server that port-forward
//! reaches, a readiness test's TCP listener) would then collide: one bind fails, and the other
//! test's guest answers in its place until that test ends and the connections are refused.
//!
//! So [`Sim::new`](crate::Sim::new) takes a `127.N` (a /16, N in [`POOL`]) that no other live
//! root on the machine holds: an exclusive `flock` on `<tmp>/cocoon-sim-subnets/127.N.lock`,
//! held while any handle of that root lives and released by the kernel when the process
//! dies, however it dies. The default `127.88` (what a user trying the simulator gets) is
//! outside the pool, and so are the second octets tests write themselves (`127.0`, `127.1`,
//! `127.22`).

use std::fs::{File, OpenOptions, TryLockError};
use std::io;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The second octets handed to test roots.
pub const POOL: RangeInclusive<u8> = 100..=254;

/// How long [`reserve`] waits for a subnet when every one is held.
const WAIT: Duration = Duration::from_secs(120);

/// One held subnet: `127.N`, exclusive while this lives.
#[derive(Debug)]
pub struct Reservation {
    subnet: String,
    _lock: File,
}

impl Reservation {
    /// The first two octets, as `Settings::static_subnet` takes them (`"127.N"`).
    pub fn subnet(&self) -> &str {
        &self.subnet
    }
}

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("cocoon-sim-subnets")
}

/// Takes a subnet no other live simulator root on this machine holds.
pub fn reserve() -> io::Result<Reservation> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = lock_dir();
    std::fs::create_dir_all(&dir)?;
    let span = POOL.clone().count();
    // Processes start at different places in the pool, so they rarely try the same files.
    let start = std::process::id() as usize * 31 + NEXT.fetch_add(1, Ordering::Relaxed);
    let deadline = Instant::now() + WAIT;
    loop {
        for k in 0..span {
            let octet = *POOL.start() as usize + (start + k) % span;
            let path = dir.join(format!("127.{octet}.lock"));
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)?;
            match file.try_lock() {
                Ok(()) => {
                    return Ok(Reservation {
                        subnet: format!("127.{octet}"),
                        _lock: file,
                    });
                }
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => {
                    return Err(io::Error::new(e.kind(), format!("locking {}: {e}", path.display())));
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "every simulator guest subnet 127.{}-127.{} is held (locks in {}) for {WAIT:?}: too many simulator roots alive at once",
                    POOL.start(),
                    POOL.end(),
                    dir.display()
                ),
            ));
        }
        // Polling for a root elsewhere to end: there is nothing to wait on across processes.
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_reservations_never_share_a_subnet() {
        let held: Vec<Reservation> = (0..8).map(|_| reserve().unwrap()).collect();
        let mut subnets: Vec<&str> = held.iter().map(Reservation::subnet).collect();
        subnets.sort();
        subnets.dedup();
        assert_eq!(subnets.len(), held.len(), "{subnets:?}");
        for s in &subnets {
            let octet: u8 = s.strip_prefix("127.").unwrap().parse().unwrap();
            assert!(POOL.contains(&octet), "{s}");
        }
        // A held subnet's lock cannot be taken again, not even from this process.
        let taken = lock_dir().join(format!("{}.lock", held[0].subnet()));
        let again = OpenOptions::new().write(true).open(&taken).unwrap();
        assert!(matches!(again.try_lock(), Err(TryLockError::WouldBlock)));
    }
}
