//! Loading the operator's policies and swapping in new versions while the daemon runs.
//!
//! A slot's component is a file or a registry artifact (`oci://…@sha256:…`). A new version —
//! a changed file, or a changed source in the configuration file (a new digest) — is read or
//! fetched, compiled, validated against its slot and run against its case table (the file's,
//! or the one the artifact carries) before it is installed; a version that fails any step is
//! refused, the last good one keeps serving, and the outcome is logged, counted
//! (`cocoon_vk_policy_reloads_total{slot,result}`) and recorded for the Node
//! ([`super::status`]).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, SystemTime};

use notify::{RecursiveMode, Watcher};
use tracing::{error, info, warn};

use super::cases::CaseTable;
use super::component::Origin;
use super::config::{PolicyConfig, PolicySource, SlotConfig};
use super::distribution::PolicyFetcher;
use super::error::LoadError;
use super::loaded::LoadedPolicy;
use super::set::Policies;
use super::slots::{PolicySlot, Slot, SlotVisitor, with_slot};
use super::status::{ReloadOutcome, ReloadResult};

/// Events closer together than this are one change (editors and `cp` write in several steps).
const DEBOUNCE: Duration = Duration::from_millis(150);

/// The case table guarding a swap: a file, or the text an artifact carries.
enum GuardTable {
    File(PathBuf),
    Carried { name: String, text: String },
}

/// Reads (or fetches), validates and tests `config`'s component for `S`.
pub fn load_checked<S: PolicySlot>(
    policies: &Policies,
    fetcher: &PolicyFetcher,
    config: &SlotConfig,
) -> Result<LoadedPolicy<S>, LoadError> {
    let (origin, bytes, carried) = match &config.source {
        PolicySource::File(path) => {
            let bytes = fs::read(path).map_err(|source| LoadError::Read {
                path: path.clone(),
                source,
            })?;
            (Origin::File(path.clone()), bytes, None)
        }
        PolicySource::Oci(reference) => {
            let fetched = fetcher.fetch_blocking(reference)?;
            let origin = Origin::Oci(fetched.reference.clone());
            if fetched.artifact.slot != S::SLOT {
                return Err(LoadError::WrongSlot {
                    origin: origin.to_string(),
                    slot: S::SLOT,
                    found: fetched.artifact.slot,
                });
            }
            let carried = fetched.artifact.cases.map(|bytes| GuardTable::Carried {
                name: format!("the case table in {}", fetched.reference),
                text: String::from_utf8_lossy(&bytes).into_owned(),
            });
            (origin, fetched.artifact.component, carried)
        }
    };
    let policy = LoadedPolicy::<S>::load(policies.engine(), policies.cache(), origin.clone(), &bytes)?;
    let table = config.cases_path().map(GuardTable::File).or(carried);
    if let Some(table) = table {
        run_guard_table(policies, &policy, &origin, table)?;
    }
    Ok(policy)
}

fn run_guard_table<S: PolicySlot>(
    policies: &Policies,
    policy: &LoadedPolicy<S>,
    origin: &Origin,
    guard: GuardTable,
) -> Result<(), LoadError> {
    let table_error = |detail| LoadError::Table {
        origin: origin.to_string(),
        detail,
    };
    let (name, table) = match guard {
        GuardTable::File(path) => (path.clone(), CaseTable::load(&path).map_err(table_error)?),
        GuardTable::Carried { name, text } => {
            let table = CaseTable::parse(&text, &name).map_err(table_error)?;
            (PathBuf::from(name), table)
        }
    };
    if table.slot != S::SLOT {
        return Err(table_error(format!(
            "case table {} is for slot {}, not {}",
            name.display(),
            table.slot,
            S::SLOT
        )));
    }
    let results = table.run(policies.engine(), policy);
    let failed: Vec<_> = results.iter().filter(|r| r.failure.is_some()).collect();
    match failed.first() {
        None => Ok(()),
        Some(first) => Err(LoadError::CasesFailed {
            origin: origin.to_string(),
            table: name,
            failed: failed.len(),
            total: results.len(),
            first: format!("{}: {}", first.name, first.failure.as_deref().unwrap_or("")),
        }),
    }
}

/// Keeps the configured slots in step with their files, artifacts and configuration file.
pub struct PolicyReloader {
    policies: Arc<Policies>,
    slots: Mutex<BTreeMap<Slot, SlotConfig>>,
    fetcher: PolicyFetcher,
    /// The configuration file, re-read when it changes, and the slots the environment pins.
    config_file: Option<(PathBuf, BTreeMap<Slot, SlotConfig>)>,
}

impl PolicyReloader {
    /// A reloader for `slots`; registry sources are kept under the default artifact directory
    /// and must be pinned by digest (see [`Self::from_config`]).
    pub fn new(policies: Arc<Policies>, slots: BTreeMap<Slot, SlotConfig>) -> Self {
        let defaults = PolicyConfig::default();
        PolicyReloader {
            policies,
            slots: Mutex::new(slots),
            fetcher: PolicyFetcher::new(defaults.artifact_dir, false),
            config_file: None,
        }
    }

    /// The reloader of a daemon's configuration: its slots, artifact store, tag rule, and its
    /// configuration file (watched).
    pub fn from_config(policies: Arc<Policies>, config: &PolicyConfig) -> Self {
        PolicyReloader {
            policies,
            slots: Mutex::new(config.slots.clone()),
            fetcher: PolicyFetcher::new(&config.artifact_dir, config.allow_tags),
            config_file: config.file.clone().map(|file| (file, config.env_slots.clone())),
        }
    }

    fn slots(&self) -> BTreeMap<Slot, SlotConfig> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Installs every configured slot's component. At startup there is no last good version
    /// of an operator's policy, so a bad one (or an artifact neither stored nor reachable) is
    /// an error the daemon must not start past.
    pub fn load_all(&self) -> Result<(), LoadError> {
        for (slot, config) in self.slots() {
            self.load_and_record(slot, &config, true)?;
        }
        Ok(())
    }

    /// Loads, tests and installs `config`'s component for `slot`, unless the same component
    /// from the same source already serves; records the outcome. Returns whether it installed.
    fn load_and_record(&self, slot: Slot, config: &SlotConfig, startup: bool) -> Result<bool, LoadError> {
        struct Install<'a>(&'a PolicyReloader, &'a SlotConfig);
        impl SlotVisitor for Install<'_> {
            /// (installed, source, digest, contract)
            type Output = Result<(bool, String, String, String), LoadError>;
            fn visit<S: PolicySlot>(self) -> Self::Output {
                let policies = &self.0.policies;
                let policy = load_checked::<S>(policies, &self.0.fetcher, self.1)?;
                let current = policies.current::<S>();
                let unchanged = current.digest() == policy.digest() && current.origin() == policy.origin();
                let shown = (
                    !unchanged,
                    policy.origin().source(),
                    format!("sha256:{}", policy.digest()),
                    policy.version().to_string(),
                );
                if !unchanged {
                    policies.install(policy);
                }
                Ok(shown)
            }
        }
        let metrics = self.policies.metrics();
        match with_slot(slot, Install(self, config)) {
            // The serving component again (a configuration put back after a refused change):
            // nothing to swap, but the refusal is over.
            Ok((false, source, digest, contract)) => {
                if self.policies.status().current().refused.contains_key(&slot) {
                    self.policies.status().record(ReloadOutcome {
                        slot,
                        source,
                        at: SystemTime::now(),
                        result: ReloadResult::Accepted { digest, contract },
                    });
                }
                Ok(false)
            }
            Ok((true, source, digest, contract)) => {
                metrics.count_reload(slot, "ok");
                self.policies.status().record(ReloadOutcome {
                    slot,
                    source,
                    at: SystemTime::now(),
                    result: ReloadResult::Accepted { digest, contract },
                });
                Ok(true)
            }
            Err(error) => {
                let kept = self.policies.active(slot);
                if !startup {
                    error!(%slot, source = %config.source, %error, kept = %kept.digest, "new policy version refused; the last good version keeps serving");
                }
                metrics.count_reload(slot, error.metric_label());
                self.policies.status().record(ReloadOutcome {
                    slot,
                    source: config.source.to_string(),
                    at: SystemTime::now(),
                    result: ReloadResult::Refused {
                        reason: error.metric_label(),
                        message: error.to_string(),
                        kept: kept.digest,
                    },
                });
                Err(error)
            }
        }
    }

    /// Re-reads `slot`'s component; installs it if it changed and passes every check. Returns
    /// whether a new version was installed.
    pub fn reload(&self, slot: Slot) -> Result<bool, LoadError> {
        let Some(config) = self.slots().get(&slot).cloned() else {
            return Ok(false);
        };
        if let PolicySource::File(path) = &config.source
            && let Ok(bytes) = fs::read(path)
            && super::cache::sha256_hex(&bytes) == self.policies.digest(slot)
        {
            return Ok(false);
        }
        self.load_and_record(slot, &config, false)
    }

    /// Re-reads the configuration file: a slot whose source changed (a new digest, another
    /// file) is loaded with the same checks as a changed file; a slot no longer configured
    /// goes back to its built-in policy. Other settings (limits, directories) need a restart.
    pub fn reload_config(&self) -> Result<(), String> {
        let Some((file, env_slots)) = &self.config_file else {
            return Ok(());
        };
        let fresh = PolicyConfig::from_file(file).map_err(|e| e.to_string())?;
        let mut wanted = fresh.slots;
        wanted.extend(env_slots.clone());
        let before = self.slots();
        *self.slots.lock().unwrap_or_else(|p| p.into_inner()) = wanted.clone();
        for slot in Slot::ALL {
            match (before.get(&slot), wanted.get(&slot)) {
                (old, Some(new)) if old != Some(new) => {
                    info!(%slot, source = %new.source, "the policy configuration names a new source");
                    // Errors are logged, counted and recorded inside.
                    let _ = self.load_and_record(slot, new, false);
                }
                (Some(_), None) => {
                    info!(%slot, "the slot left the policy configuration; its built-in policy serves again");
                    self.install_builtin(slot);
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn install_builtin(&self, slot: Slot) {
        struct Builtin<'a>(&'a Policies);
        impl SlotVisitor for Builtin<'_> {
            type Output = Result<(), LoadError>;
            fn visit<S: PolicySlot>(self) -> Self::Output {
                let policy = LoadedPolicy::<S>::builtin(self.0.engine(), self.0.cache())?;
                self.0.install(policy);
                Ok(())
            }
        }
        if let Err(error) = with_slot(slot, Builtin(&self.policies)) {
            error!(%slot, %error, "cannot reinstall the built-in policy");
        }
    }

    /// Watches the configured files and the configuration file (their directories, so atomic
    /// replacement by rename is seen) and reloads what changed. The watcher must be kept alive.
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
        let mut files: Vec<PathBuf> = self
            .slots()
            .values()
            .filter_map(|c| c.path().map(Path::to_path_buf))
            .collect();
        files.extend(self.config_file.as_ref().map(|(file, _)| file.clone()));
        let mut dirs: Vec<PathBuf> = files
            .iter()
            .map(|path| {
                path.parent()
                    .filter(|p| !p.as_os_str().is_empty())
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
            let same_file = |p: &Path, file: &Path| p == file || p.file_name() == file.file_name();
            if let Some((file, _)) = &self.config_file
                && changed.iter().any(|p| same_file(p, file))
                && let Err(error) = self.reload_config()
            {
                error!(file = %file.display(), %error, "the changed policy configuration is unreadable; the policies serving now keep serving");
            }
            for (slot, config) in self.slots() {
                let touched = changed.iter().any(|p| {
                    config.path().is_some_and(|path| same_file(p, path)) || config.cases_path().is_some_and(|c| p == &c)
                });
                if touched {
                    // Errors are logged, counted and recorded inside `reload`.
                    let _ = self.reload(slot);
                }
            }
        }
    }
}
