//! Loading the operator's policy files and swapping in new versions while the daemon runs.
//!
//! A new version is read, compiled, validated against its slot and run against its case table
//! (if one exists) before it is installed; a version that fails any step is refused, the last
//! good one keeps serving, and the refusal is logged and counted
//! (`cocoon_vk_policy_reloads_total{slot,result}`).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tracing::{error, info, warn};

use super::cases::CaseTable;
use super::component::Origin;
use super::config::SlotConfig;
use super::error::LoadError;
use super::loaded::LoadedPolicy;
use super::set::Policies;
use super::slots::{PolicySlot, Slot, SlotVisitor, with_slot};

/// Events closer together than this are one change (editors and `cp` write in several steps).
const DEBOUNCE: Duration = Duration::from_millis(150);

/// Reads, validates and tests the component at `config.path` for `S`.
pub fn load_checked<S: PolicySlot>(policies: &Policies, config: &SlotConfig) -> Result<LoadedPolicy<S>, LoadError> {
    let bytes = fs::read(&config.path).map_err(|source| LoadError::Read {
        path: config.path.clone(),
        source,
    })?;
    let origin = Origin::File(config.path.clone());
    let policy = LoadedPolicy::<S>::load(policies.engine(), policies.cache(), origin.clone(), &bytes)?;
    if let Some(table_path) = config.cases_path() {
        run_guard_table(policies, &policy, &origin, &table_path)?;
    }
    Ok(policy)
}

/// Loads, tests and installs `config`'s component for the slot known at run time.
fn load_and_install(policies: &Policies, slot: Slot, config: &SlotConfig) -> Result<(), LoadError> {
    struct Install<'a>(&'a Policies, &'a SlotConfig);
    impl SlotVisitor for Install<'_> {
        type Output = Result<(), LoadError>;
        fn visit<S: PolicySlot>(self) -> Self::Output {
            let policy = load_checked::<S>(self.0, self.1)?;
            self.0.install(policy);
            Ok(())
        }
    }
    with_slot(slot, Install(policies, config))
}

fn run_guard_table<S: PolicySlot>(
    policies: &Policies,
    policy: &LoadedPolicy<S>,
    origin: &Origin,
    path: &Path,
) -> Result<(), LoadError> {
    let table = CaseTable::load(path).map_err(|detail| LoadError::Table {
        origin: origin.to_string(),
        detail,
    })?;
    if table.slot != S::SLOT {
        return Err(LoadError::Table {
            origin: origin.to_string(),
            detail: format!(
                "case table {} is for slot {}, not {}",
                path.display(),
                table.slot,
                S::SLOT
            ),
        });
    }
    let results = table.run(policies.engine(), policy);
    let failed: Vec<_> = results.iter().filter(|r| r.failure.is_some()).collect();
    match failed.first() {
        None => Ok(()),
        Some(first) => Err(LoadError::CasesFailed {
            origin: origin.to_string(),
            table: path.to_path_buf(),
            failed: failed.len(),
            total: results.len(),
            first: format!("{}: {}", first.name, first.failure.as_deref().unwrap_or("")),
        }),
    }
}

/// Keeps the configured slots in step with their files.
pub struct PolicyReloader {
    policies: Arc<Policies>,
    slots: BTreeMap<Slot, SlotConfig>,
}

impl PolicyReloader {
    pub fn new(policies: Arc<Policies>, slots: BTreeMap<Slot, SlotConfig>) -> Self {
        PolicyReloader { policies, slots }
    }

    /// Installs every configured slot's component. At startup there is no last good version
    /// of an operator's policy, so a bad file is an error the daemon must not start past.
    pub fn load_all(&self) -> Result<(), LoadError> {
        for (slot, config) in &self.slots {
            load_and_install(&self.policies, *slot, config)?;
            self.policies.metrics().count_reload(*slot, "ok");
        }
        Ok(())
    }

    /// Re-reads `slot`'s file; installs it if it changed and passes every check. Returns
    /// whether a new version was installed.
    pub fn reload(&self, slot: Slot) -> Result<bool, LoadError> {
        let Some(config) = self.slots.get(&slot) else {
            return Ok(false);
        };
        let metrics = self.policies.metrics();
        let current = self.policies.digest(slot);
        match fs::read(&config.path) {
            Ok(bytes) if super::cache::sha256_hex(&bytes) == current => return Ok(false),
            _ => {}
        }
        match load_and_install(&self.policies, slot, config) {
            Ok(()) => {
                metrics.count_reload(slot, "ok");
                Ok(true)
            }
            Err(error) => {
                error!(%slot, path = %config.path.display(), %error, kept = %current, "new policy version refused; the last good version keeps serving");
                metrics.count_reload(slot, error.metric_label());
                Err(error)
            }
        }
    }

    /// Watches the configured files (their directories, so atomic replacement by rename is
    /// seen) and reloads a slot when its file changes. The returned watcher must be kept alive.
    pub fn watch(self: Arc<Self>) -> notify::Result<notify::RecommendedWatcher> {
        let (tx, rx) = mpsc::channel::<PathBuf>();
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
            Ok(event) => {
                for path in event.paths {
                    let _ = tx.send(path);
                }
            }
            Err(error) => warn!(%error, "policy file watch error"),
        })?;
        let mut dirs: Vec<PathBuf> = self
            .slots
            .values()
            .map(|c| {
                c.path
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("."))
            })
            .collect();
        dirs.sort();
        dirs.dedup();
        for dir in &dirs {
            watcher.watch(dir, RecursiveMode::NonRecursive)?;
            info!(dir = %dir.display(), "watching policy components");
        }
        let reloader = self;
        thread::Builder::new()
            .name("policy-reload".into())
            .spawn(move || reloader.reload_loop(rx))
            .expect("spawn the policy reload thread");
        Ok(watcher)
    }

    fn reload_loop(&self, rx: mpsc::Receiver<PathBuf>) {
        while let Ok(first) = rx.recv() {
            let mut changed = vec![first];
            while let Ok(more) = rx.recv_timeout(DEBOUNCE) {
                changed.push(more);
            }
            for (slot, config) in &self.slots {
                let touched = changed.iter().any(|p| {
                    p == &config.path
                        || config.cases_path().is_some_and(|c| p == &c)
                        || p.file_name() == config.path.file_name()
                });
                if touched {
                    // Errors are logged and counted inside `reload`.
                    let _ = self.reload(*slot);
                }
            }
        }
    }
}
