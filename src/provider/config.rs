//! Provider settings ([`ProviderArgs`]) and the timings of its background work. Every timing
//! defaults to the Go daemon's value; tests shorten them.

use std::path::{Path, PathBuf};
use std::time::Duration;

// The probe agents own their timings; the provider's settings carry them.
pub use super::probe::ProbeTimings;
use super::reconcile::OrphanPolicy;
use crate::policy::contract::types::RestoreMode;
use crate::settings::parser;

/// Provider settings.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub node_name: String,
    /// `VK_SNAPSHOT_CPU_CLASS`; "" = unclassified.
    pub node_class: String,
    /// `VK_RESTORE_MODE` (`copy` | `ondemand` | `mmap`, trimmed, any ASCII case; default mmap).
    pub restore_mode: RestoreMode,
    /// `VK_ORPHAN_POLICY`.
    pub orphan_policy: OrphanPolicy,
    /// `COCOON_ROOT_DIR`.
    pub root_dir: PathBuf,
    /// cocoon's run directory (`COCOON_RUN_DIR`, default `<root>/run`): a VM's
    /// `<backend>/<id>/` holds its cloud-image overlay and its serial console socket.
    pub run_dir: PathBuf,
    /// `VK_STATE_DIR`: what the daemon keeps across restarts (which pod holds each VM name);
    /// `None` keeps it in memory only.
    pub state_dir: Option<PathBuf>,
    /// `VK_CLONE_FROM_DIR_ROOTS`: where a clone-from-dir may point.
    pub clone_roots: super::clone_roots::CloneRoots,
    /// Where probes and port-forward may connect (`VK_PROBE_NETWORKS`, or derived).
    pub guest_networks: super::probe_scope::GuestNetworks,
    /// `VK_NETWORK_MODE` (or derived from cocoon-net's pool): which DHCP a Windows guest's
    /// release and renew address.
    pub network_mode: super::plan::NetworkMode,
    /// The cocoon-macos path's node settings.
    pub macos: super::macos::MacosSettings,
    /// `VK_MAX_CONCURRENT_BRING_UPS`: creates whose cocoon work (gather, clone, restore) runs at
    /// once on this node; the rest wait their turn.
    pub max_bring_ups: usize,
    pub timings: Timings,
}

/// The default of `VK_MAX_CONCURRENT_BRING_UPS`, measured: `tests/benches/BENCHMARKS.md`, "Creates
/// overlap" (the `create_burst` bench).
pub const DEFAULT_MAX_BRING_UPS: usize = 16;

/// The provider's own settings: the restore mode, the orphan policy, the reclaimer's period, where
/// the VM holders are kept, the clone-from-dir roots, the macOS path.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Provider")]
pub struct ProviderArgs {
    /// How clones restore guest memory: copy, ondemand or mmap (any case)
    #[arg(long, env = "VK_RESTORE_MODE", value_name = "MODE", default_value = "mmap",
          value_parser = parser("VK_RESTORE_MODE", "copy, ondemand or mmap", |v| crate::model::vm_spec::restore_mode(v).ok_or_else(|| "not a restore mode".to_string())))]
    pub restore_mode: RestoreMode,
    /// What happens to VMs no pod claims at startup: destroy, alert or keep
    #[arg(long, env = "VK_ORPHAN_POLICY", value_name = "POLICY", default_value = "destroy",
          value_parser = parser("VK_ORPHAN_POLICY", "destroy, alert or keep", |v| OrphanPolicy::parse(Some(v)).map_err(|_| "not an orphan policy".to_string())))]
    pub orphan_policy: OrphanPolicy,
    /// Period of the local snapshot reclaimer (s, m or h; 0 turns it off)
    #[arg(long, env = "VK_SNAPSHOT_RECLAIM_INTERVAL", value_name = "INTERVAL", default_value = "10m",
          value_parser = parser("VK_SNAPSHOT_RECLAIM_INTERVAL", "a duration such as 600s, 10m or 1h (0 turns the reclaimer off)",
                                |v| parse_interval(v).map(Every).ok_or_else(|| "not a duration".to_string())))]
    pub snapshot_reclaim_interval: Every,
    /// What the daemon keeps across restarts: which pod holds each VM name (default <COCOON_ROOT_DIR>/vk-state)
    #[arg(long, env = "VK_STATE_DIR", value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Directories a clone-from-dir annotation may point below, comma-separated, or none (default <COCOON_ROOT_DIR>/exports)
    #[arg(long, env = "VK_CLONE_FROM_DIR_ROOTS", value_name = "DIRS",
          value_parser = parser("VK_CLONE_FROM_DIR_ROOTS", "absolute directories separated by commas, or none",
                                super::clone_roots::CloneRoots::parse))]
    pub clone_from_dir_roots: Option<super::clone_roots::CloneRoots>,
    /// Creates whose cocoon work (lookups, clone or restore) runs at once on this node; more wait their turn
    #[arg(long, env = "VK_MAX_CONCURRENT_BRING_UPS", value_name = "N", default_value_t = DEFAULT_MAX_BRING_UPS,
          value_parser = parser("VK_MAX_CONCURRENT_BRING_UPS", "a number of at least 1", crate::settings::positive::<usize>))]
    pub max_concurrent_bring_ups: usize,
    #[command(flatten)]
    pub macos: super::macos::MacosArgs,
}

/// A period; `None` = off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Every(pub Option<Duration>);

impl ProviderConfig {
    /// The provider's configuration: its settings, and the node's identity and cocoon's root
    /// (owned by the node's and the runtime's settings).
    pub fn from_args(
        args: &ProviderArgs,
        node_name: &str,
        node_class: Option<&str>,
        root_dir: &Path,
        guest_networks: super::probe_scope::GuestNetworks,
        network_mode: super::plan::NetworkMode,
    ) -> Self {
        Self {
            guest_networks,
            network_mode,
            node_name: node_name.to_string(),
            node_class: node_class.unwrap_or_default().to_string(),
            restore_mode: args.restore_mode,
            orphan_policy: args.orphan_policy,
            root_dir: root_dir.to_path_buf(),
            run_dir: root_dir.join("run"),
            state_dir: Some(args.state_dir.clone().unwrap_or_else(|| root_dir.join("vk-state"))),
            clone_roots: args
                .clone_from_dir_roots
                .clone()
                .unwrap_or_else(|| super::clone_roots::CloneRoots::default_for(root_dir)),
            timings: Timings {
                reclaim_interval: args.snapshot_reclaim_interval.0,
                ..Timings::default()
            },
            macos: super::macos::MacosSettings::from_args(&args.macos),
            max_bring_ups: args.max_concurrent_bring_ups,
        }
    }

    /// Reads the variables (and the node's and cocoon's) through `lookup`, with the rules of the
    /// environment.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, crate::settings::SettingsError> {
        let node = crate::kubelet::KubeletConfig::from_lookup(&lookup)?;
        let args = crate::settings::parse_lookup::<ProviderArgs>(&lookup)?;
        let probes = crate::settings::parse_lookup::<super::probe_scope::ProbeArgs>(&lookup)?;
        let leases = crate::settings::parse_lookup::<super::cocoon_net::CocoonNetArgs>(&lookup)?;
        let guests = super::probe_scope::GuestNetworks::from_settings(probes.probe_networks, &leases.leases_path);
        let network_mode = super::probe_scope::network_mode(leases.network_mode, &leases.leases_path);
        Ok(Self::from_args(
            &args,
            &node.node_name,
            node.snapshot_cpu_class.as_deref(),
            &node.root_dir,
            guests,
            network_mode,
        ))
    }
}

/// The VM-name records under `VK_STATE_DIR` cannot be made or read: the daemon must not run
/// without knowing who holds which VM name.
#[derive(Debug, thiserror::Error)]
#[error("the {what} records in {}: {source} (VK_STATE_DIR)", dir.display())]
pub struct StateDirError {
    /// Which records (`VM holder`, `woken-from`).
    pub what: &'static str,
    pub dir: std::path::PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// `600`, `600s`, `10m`, `1h`: `Some(None)` for zero (off), `None` when unparseable.
fn parse_interval(text: &str) -> Option<Option<Duration>> {
    let t = text.trim();
    let (number, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, "s"),
    };
    let n: u64 = number.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        _ => return None,
    };
    Some((secs > 0).then(|| Duration::from_secs(secs)))
}

/// How long background work waits and retries: apiserver writes, fixups, the lease wait, rechecks,
/// owed retries, the reconcilers.
#[derive(Debug, Clone)]
pub struct Timings {
    /// Pause between attempts of an apiserver write (3 attempts).
    pub patch_retry: Duration,
    /// Budget of the background watcher of a stale create.
    pub stale_watch_budget: Duration,
    /// Period of the lifecycle reconciler (re-flush of intents that did not reach the apiserver).
    pub reflush_interval: Duration,
    pub probe: ProbeTimings,
    /// Guest fixup: pause between `vm exec` attempts, and the whole budget.
    pub fixup_interval: Duration,
    pub fixup_budget: Duration,
    /// Setting a Windows guest's static addresses at its serial console.
    pub sac: super::sac::SacTimings,
    /// Waiting for a DHCP lease before Ready, its poll, and when a Windows guest gets one renew nudge.
    pub ip_wait: Duration,
    pub ip_poll: Duration,
    pub renew_nudge_after: Duration,
    /// VM watcher: pause before the second inline inspect; deferred recheck backoff and budget.
    pub inspect_retry: Duration,
    pub recheck_initial: Duration,
    pub recheck_max: Duration,
    pub recheck_budget: Duration,
    /// A VM that stops again within this window of its last restart is removed, not restarted.
    pub restart_cooldown: Duration,
    /// Status reconciler: first pass after start, then every `status_period`.
    pub status_initial: Duration,
    pub status_period: Duration,
    /// Retry of a failed hibernate or wake (`DECISIONS.md` row 10): `op_retry_min` doubling to
    /// `op_retry_max`.
    pub op_retry_min: Duration,
    pub op_retry_max: Duration,
    /// Eviction: pause × attempt between delete attempts, then background retries up to `evict_retry_max`.
    pub evict_backoff: Duration,
    pub evict_retry_max: Duration,
    /// Classifying a resumed CH+Windows clone (hibernate evidence lookups) gives up after this.
    pub classify_budget: Duration,
    /// A macOS guest whose record shows no MAC yet is inspected again at most this often.
    pub mac_reinspect: Duration,
    /// Period of the local snapshot reclaimer (first pass right after the startup reconcile);
    /// `None` = off (`VK_SNAPSHOT_RECLAIM_INTERVAL=0`).
    pub reclaim_interval: Option<Duration>,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            patch_retry: Duration::from_millis(500),
            stale_watch_budget: Duration::from_secs(30 * 60),
            reflush_interval: Duration::from_secs(15),
            probe: ProbeTimings::default(),
            fixup_interval: Duration::from_secs(3),
            fixup_budget: Duration::from_secs(180),
            sac: super::sac::SacTimings::default(),
            ip_wait: Duration::from_secs(45),
            ip_poll: Duration::from_millis(200),
            renew_nudge_after: Duration::from_secs(30),
            inspect_retry: Duration::from_millis(200),
            recheck_initial: Duration::from_secs(1),
            recheck_max: Duration::from_secs(30),
            recheck_budget: Duration::from_secs(30 * 60),
            restart_cooldown: Duration::from_secs(30),
            status_initial: Duration::from_secs(10),
            status_period: Duration::from_secs(30),
            op_retry_min: Duration::from_secs(15),
            op_retry_max: Duration::from_secs(5 * 60),
            evict_backoff: Duration::from_millis(200),
            evict_retry_max: Duration::from_secs(30),
            classify_budget: Duration::from_secs(30 * 60),
            mac_reinspect: Duration::from_secs(10),
            reclaim_interval: Some(Duration::from_secs(10 * 60)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(pairs: &[(&str, &str)]) -> Result<ProviderConfig, crate::settings::SettingsError> {
        let owned: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        ProviderConfig::from_lookup(|k| owned.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn configuration_defaults_and_startup_errors() {
        let c = cfg(&[]).unwrap();
        assert_eq!(
            (c.node_name.as_str(), c.restore_mode, c.orphan_policy),
            ("cocoon-pool", RestoreMode::Mmap, OrphanPolicy::Destroy)
        );
        assert_eq!(c.root_dir, PathBuf::from("/var/lib/cocoon"));
        assert_eq!(c.timings.fixup_budget, Duration::from_secs(180));
        assert_eq!(c.max_bring_ups, DEFAULT_MAX_BRING_UPS);
        assert_eq!(cfg(&[("VK_MAX_CONCURRENT_BRING_UPS", " 3 ")]).unwrap().max_bring_ups, 3);
        assert!(
            cfg(&[("VK_MAX_CONCURRENT_BRING_UPS", "0")])
                .unwrap_err()
                .to_string()
                .contains("VK_MAX_CONCURRENT_BRING_UPS")
        );
        let c = cfg(&[
            ("VK_NODE_NAME", "n1"),
            ("VK_RESTORE_MODE", " OnDemand "),
            ("VK_ORPHAN_POLICY", "keep"),
            ("VK_SNAPSHOT_CPU_CLASS", "icx"),
            ("COCOON_ROOT_DIR", "/srv/cocoon"),
        ])
        .unwrap();
        assert_eq!(
            (
                c.node_name.as_str(),
                c.restore_mode,
                c.orphan_policy,
                c.node_class.as_str()
            ),
            ("n1", RestoreMode::Ondemand, OrphanPolicy::Keep, "icx")
        );
        assert_eq!(c.root_dir, PathBuf::from("/srv/cocoon"));
        assert!(
            cfg(&[("VK_ORPHAN_POLICY", "nuke")])
                .unwrap_err()
                .to_string()
                .contains("VK_ORPHAN_POLICY")
        );
        assert_eq!(c.timings.reclaim_interval, Some(Duration::from_secs(600)));
        let every = |v: &str| {
            cfg(&[("VK_SNAPSHOT_RECLAIM_INTERVAL", v)])
                .map(|c| c.timings.reclaim_interval)
                .map_err(|e| e.to_string())
        };
        assert_eq!(every("90"), Ok(Some(Duration::from_secs(90))));
        assert_eq!(every("15m"), Ok(Some(Duration::from_secs(900))));
        assert_eq!(every("1h"), Ok(Some(Duration::from_secs(3600))));
        assert_eq!(every("0"), Ok(None));
        assert!(every("soon").unwrap_err().contains("VK_SNAPSHOT_RECLAIM_INTERVAL"));
        assert!(every("5d").is_err());
        assert!(
            cfg(&[("VK_RESTORE_MODE", "lazy")])
                .unwrap_err()
                .to_string()
                .contains("VK_RESTORE_MODE")
        );
    }
}
