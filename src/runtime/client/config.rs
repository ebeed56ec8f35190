//! How the client is configured: the `cocoon` binary and root, per-call deadlines and the retry of a
//! busy snapshot. Plain data with the defaults the daemon ships; the settings file fills it in.

use crate::runtime::events::WatchBackoff;
use std::path::PathBuf;
use std::time::Duration;

/// Per-call deadlines. A call past its deadline is killed and reported as `RuntimeError::Timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// inspect, list, rm, start, net, logs, reconcile-stale-create, snapshot inspect/rm/list, image inspect.
    pub query: Duration,
    /// run, clone, snapshot save, image pull.
    pub create: Duration,
    /// snapshot import/export (whole stream), export --to-dir, image import.
    pub transfer: Duration,
    /// vm exec.
    pub exec: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            query: Duration::from_secs(60),
            create: Duration::from_secs(600),
            transfer: Duration::from_secs(2 * 3600),
            exec: Duration::from_secs(3600),
        }
    }
}

/// How `snapshot rm` is retried while the snapshot is leased (`is in use by an active`): every
/// `interval` for at most `budget` (500 ms / 30 s in the Go client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusyRetry {
    pub interval: Duration,
    pub budget: Duration,
}

impl Default for BusyRetry {
    fn default() -> Self {
        BusyRetry {
            interval: Duration::from_millis(500),
            budget: Duration::from_secs(30),
        }
    }
}

#[derive(Debug, Clone)]
pub struct CocoonCliConfig {
    /// `VK_COCOON_BIN` (default `/usr/local/bin/cocoon`).
    pub bin: PathBuf,
    /// Run as `sudo -n <bin> …`.
    pub sudo: bool,
    /// Extra environment for every invocation (e.g. `COCOON_ROOT_DIR`).
    pub env: Vec<(String, String)>,
    pub timeouts: Timeouts,
    pub watch_backoff: WatchBackoff,
    pub busy_retry: BusyRetry,
}

impl Default for CocoonCliConfig {
    fn default() -> Self {
        CocoonCliConfig {
            bin: PathBuf::from("/usr/local/bin/cocoon"),
            sudo: false,
            env: Vec::new(),
            timeouts: Timeouts::default(),
            watch_backoff: WatchBackoff::default(),
            busy_retry: BusyRetry::default(),
        }
    }
}
