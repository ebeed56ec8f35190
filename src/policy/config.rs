//! Operator configuration of the policy engine: which component serves each slot, the sandbox
//! limits, and the compile cache. From a YAML file (`VK_POLICY_CONFIG`) and environment
//! overrides; see `deploy/policies.yaml` and `deploy/vk-cocoon.env.example`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::compile_worker::{ADDRESS_SPACE_RANGE_MIB, CompileLimits, DEADLINE_RANGE_S};
use super::distribution::PolicyRef;
use super::engine::SandboxLimits;
use super::slots::Slot;
use crate::settings::{self, parser};

/// Default location of the compiled-policy cache.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cocoon/vk-policy-cache";
/// Default location of pulled policy artifacts (kept by digest).
pub const DEFAULT_ARTIFACT_DIR: &str = "/var/lib/cocoon/vk-policy-artifacts";

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct PolicyConfig {
    /// Slots served by an operator's component; the others use the built-in defaults.
    #[serde(default)]
    pub slots: BTreeMap<Slot, SlotConfig>,
    #[serde(default)]
    pub limits: SandboxLimits,
    /// How long and how big compiling one component may get, in its worker process.
    #[serde(default)]
    pub compile: CompileLimits,
    /// Compiled components are cached here; `null` disables the cache.
    #[serde(default = "default_cache_dir")]
    pub cache_dir: Option<PathBuf>,
    /// Pulled policy artifacts are kept here, by digest.
    #[serde(default = "default_artifact_dir")]
    pub artifact_dir: PathBuf,
    /// Accept `oci://…:TAG` (resolved once per load, and logged); otherwise only digests.
    #[serde(default)]
    pub allow_tags: bool,
    /// The YAML file this configuration came from (`VK_POLICY_CONFIG`): watched, so a changed
    /// slot (a new digest) is loaded like a changed file.
    #[serde(skip)]
    pub file: Option<PathBuf>,
    /// Slots set by `VK_POLICY_<SLOT>`: they override the file, also when it is re-read.
    #[serde(skip)]
    pub env_slots: BTreeMap<Slot, SlotConfig>,
}

/// Where a slot's component comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PolicySource {
    /// A `.wasm` file, watched: a new version is validated and swapped in.
    File(PathBuf),
    /// An artifact in a registry (`oci://…@sha256:…`), fetched and kept by digest.
    Oci(PolicyRef),
}

impl PolicySource {
    /// `oci://…` is a registry reference; anything else a file path.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim_start().starts_with(super::distribution::reference::SCHEME) {
            PolicyRef::parse(text).map(PolicySource::Oci)
        } else {
            Ok(PolicySource::File(PathBuf::from(text)))
        }
    }
}

impl std::fmt::Display for PolicySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PolicySource::File(path) => write!(f, "{}", path.display()),
            PolicySource::Oci(reference) => write!(f, "{reference}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RawSlotConfig")]
pub struct SlotConfig {
    /// The component: a file path or an `oci://` reference (YAML `source:`, or `path:`).
    pub source: PolicySource,
    /// Case table run before every swap; default `<path without .wasm>.cases.yaml` beside a
    /// file if present, the artifact's own table for a registry source.
    pub cases: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
struct RawSlotConfig {
    #[serde(alias = "path")]
    source: String,
    #[serde(default)]
    cases: Option<PathBuf>,
}

impl TryFrom<RawSlotConfig> for SlotConfig {
    type Error = String;
    fn try_from(raw: RawSlotConfig) -> Result<Self, String> {
        Ok(SlotConfig {
            source: PolicySource::parse(&raw.source)?,
            cases: raw.cases,
        })
    }
}

fn default_cache_dir() -> Option<PathBuf> {
    Some(PathBuf::from(DEFAULT_CACHE_DIR))
}

fn default_artifact_dir() -> PathBuf {
    PathBuf::from(DEFAULT_ARTIFACT_DIR)
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            slots: BTreeMap::new(),
            limits: SandboxLimits::default(),
            compile: CompileLimits::default(),
            cache_dir: default_cache_dir(),
            artifact_dir: default_artifact_dir(),
            allow_tags: false,
            file: None,
            env_slots: BTreeMap::new(),
        }
    }
}

impl SlotConfig {
    /// A slot served by the component file at `path` (its table found beside it).
    pub fn file(path: impl Into<PathBuf>) -> Self {
        SlotConfig {
            source: PolicySource::File(path.into()),
            cases: None,
        }
    }

    /// The component file, for a file source.
    pub fn path(&self) -> Option<&Path> {
        match &self.source {
            PolicySource::File(path) => Some(path),
            PolicySource::Oci(_) => None,
        }
    }

    /// The case table file that guards swaps of this slot's component, if one exists (a
    /// registry source's own table travels in the artifact).
    pub fn cases_path(&self) -> Option<PathBuf> {
        if let Some(cases) = &self.cases {
            return Some(cases.clone());
        }
        let beside = self.path()?.with_extension("cases.yaml");
        beside.exists().then_some(beside)
    }
}

/// A configuration value the daemon cannot start with.
#[derive(Debug, thiserror::Error)]
#[error("{variable}: {problem}")]
pub struct ConfigError {
    pub variable: String,
    pub problem: String,
}

/// The policy engine's settings. Unset values keep the configuration file's (`VK_POLICY_CONFIG`),
/// else the built-in defaults; a set value overrides the file.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Policies")]
pub struct PolicyArgs {
    /// The policy configuration file (slots, limits, cache; watched: a changed slot is loaded)
    #[arg(long, env = "VK_POLICY_CONFIG", value_name = "FILE")]
    pub policy_config: Option<PathBuf>,
    /// Component of slot snapshot-before-destroy: a .wasm path or oci://HOST/REPO@sha256:… (unset: the file's, else built in)
    #[arg(long, env = "VK_POLICY_SNAPSHOT_BEFORE_DESTROY", value_name = "SOURCE")]
    pub policy_snapshot_before_destroy: Option<String>,
    /// Component of slot bring-up (as above)
    #[arg(long, env = "VK_POLICY_BRING_UP", value_name = "SOURCE")]
    pub policy_bring_up: Option<String>,
    /// Component of slot cpu-class-admission (as above)
    #[arg(long, env = "VK_POLICY_CPU_CLASS_ADMISSION", value_name = "SOURCE")]
    pub policy_cpu_class_admission: Option<String>,
    /// Component of slot resource-translation (as above)
    #[arg(long, env = "VK_POLICY_RESOURCE_TRANSLATION", value_name = "SOURCE")]
    pub policy_resource_translation: Option<String>,
    /// Component of slot guest-fixup (as above)
    #[arg(long, env = "VK_POLICY_GUEST_FIXUP", value_name = "SOURCE")]
    pub policy_guest_fixup: Option<String>,
    /// Cache of compiled components; set but empty disables it (unset: the file's, else /var/lib/cocoon/vk-policy-cache)
    #[arg(long, env = "VK_POLICY_CACHE_DIR", value_name = "DIR")]
    pub policy_cache_dir: Option<String>,
    /// Pulled policy artifacts, kept by digest (unset: the file's, else /var/lib/cocoon/vk-policy-artifacts)
    #[arg(long, env = "VK_POLICY_ARTIFACT_DIR", value_name = "DIR")]
    pub policy_artifact_dir: Option<PathBuf>,
    /// Allow oci://…:TAG sources, resolved once per load (unset: the file's, else false)
    #[arg(long, env = "VK_POLICY_ALLOW_TAGS", value_name = "BOOL",
          value_parser = parser("VK_POLICY_ALLOW_TAGS", "true or false", settings::boolean))]
    pub policy_allow_tags: Option<bool>,
    /// Per-decision deadline in ms, 1-60000 (unset: the file's, else 100)
    #[arg(long, env = "VK_POLICY_TIMEOUT_MS", value_name = "MS",
          value_parser = parser("VK_POLICY_TIMEOUT_MS", "a whole number between 1 and 60000", |v| within(v, 1, 60_000)))]
    pub policy_timeout_ms: Option<u64>,
    /// Per-decision memory limit in MiB, 1-4096 (unset: the file's, else 32)
    #[arg(long, env = "VK_POLICY_MEMORY_MIB", value_name = "MIB",
          value_parser = parser("VK_POLICY_MEMORY_MIB", "a whole number between 1 and 4096", |v| within(v, 1, 4096)))]
    pub policy_memory_mib: Option<u64>,
    /// Decisions running at once (the instance pool), 1-1024 (unset: the file's, else 32)
    #[arg(long, env = "VK_POLICY_MAX_CONCURRENT", value_name = "COUNT",
          value_parser = parser("VK_POLICY_MAX_CONCURRENT", "a whole number between 1 and 1024", |v| within(v, 1, 1024)))]
    pub policy_max_concurrent: Option<u64>,
    /// Core instances one policy component may create, 1-1024 (unset: the file's, else 64)
    #[arg(long, env = "VK_POLICY_MAX_CORE_INSTANCES", value_name = "COUNT",
          value_parser = parser("VK_POLICY_MAX_CORE_INSTANCES", "a whole number between 1 and 1024", |v| within(v, 1, 1024)))]
    pub policy_max_core_instances: Option<u64>,
    /// Linear memories one policy component may define, 1-64 (unset: the file's, else 4)
    #[arg(long, env = "VK_POLICY_MAX_MEMORIES", value_name = "COUNT",
          value_parser = parser("VK_POLICY_MAX_MEMORIES", "a whole number between 1 and 64", |v| within(v, 1, 64)))]
    pub policy_max_memories: Option<u64>,
    /// Tables one policy component may define, 1-256 (unset: the file's, else 16)
    #[arg(long, env = "VK_POLICY_MAX_TABLES", value_name = "COUNT",
          value_parser = parser("VK_POLICY_MAX_TABLES", "a whole number between 1 and 256", |v| within(v, 1, 256)))]
    pub policy_max_tables: Option<u64>,
    /// Elements one table of a policy component may hold, 1-10000000 (unset: the file's, else 65536)
    #[arg(long, env = "VK_POLICY_MAX_TABLE_ELEMENTS", value_name = "COUNT",
          value_parser = parser("VK_POLICY_MAX_TABLE_ELEMENTS", "a whole number between 1 and 10000000", |v| within(v, 1, 10_000_000)))]
    pub policy_max_table_elements: Option<u64>,
    /// Decisions of large components (Python, JavaScript) running at once, 1-1024 (unset: the file's, else 4)
    #[arg(long, env = "VK_POLICY_MAX_CONCURRENT_LARGE", value_name = "COUNT",
          value_parser = parser("VK_POLICY_MAX_CONCURRENT_LARGE", "a whole number between 1 and 1024", |v| within(v, 1, 1024)))]
    pub policy_max_concurrent_large: Option<u64>,
    /// Seconds one component's compile may take, in its worker process, 1-3600 (unset: the file's, else 300)
    #[arg(long, env = "VK_POLICY_COMPILE_DEADLINE_S", value_name = "SECONDS",
          value_parser = parser("VK_POLICY_COMPILE_DEADLINE_S", "a whole number between 1 and 3600", |v| within(v, *DEADLINE_RANGE_S.start(), *DEADLINE_RANGE_S.end())))]
    pub policy_compile_deadline_s: Option<u64>,
    /// Address space of the compile worker in MiB, 256-1048576 (unset: the file's, else 4096)
    #[arg(long, env = "VK_POLICY_COMPILE_ADDRESS_SPACE_MIB", value_name = "MIB",
          value_parser = parser("VK_POLICY_COMPILE_ADDRESS_SPACE_MIB", "a whole number between 256 and 1048576", |v| within(v, *ADDRESS_SPACE_RANGE_MIB.start(), *ADDRESS_SPACE_RANGE_MIB.end())))]
    pub policy_compile_address_space_mib: Option<u64>,
}

fn within(text: &str, min: u64, max: u64) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err("out of range".into()),
    }
}

impl PolicyArgs {
    /// The `VK_POLICY_<SLOT>` values by slot.
    fn slot_sources(&self) -> [(Slot, Option<&str>); Slot::ALL.len()] {
        Slot::ALL.map(|slot| {
            let value = match slot {
                Slot::SnapshotBeforeDestroy => &self.policy_snapshot_before_destroy,
                Slot::BringUp => &self.policy_bring_up,
                Slot::CpuClassAdmission => &self.policy_cpu_class_admission,
                Slot::ResourceTranslation => &self.policy_resource_translation,
                Slot::GuestFixup => &self.policy_guest_fixup,
            };
            (slot, value.as_deref())
        })
    }
}

impl PolicyConfig {
    /// The configuration: the file named by `VK_POLICY_CONFIG` (if set), then the settings that
    /// override it.
    pub fn from_args(args: &PolicyArgs) -> Result<Self, ConfigError> {
        let mut config = match &args.policy_config {
            Some(path) => Self::from_file(path)?,
            None => PolicyConfig::default(),
        };
        for (slot, text) in args.slot_sources() {
            if let Some(text) = text {
                let source = PolicySource::parse(text).map_err(|problem| ConfigError {
                    variable: slot.env_var(),
                    problem,
                })?;
                let slot_config = SlotConfig { source, cases: None };
                config.env_slots.insert(slot, slot_config.clone());
                config.slots.insert(slot, slot_config);
            }
        }
        if let Some(dir) = &args.policy_cache_dir {
            config.cache_dir = (!dir.trim().is_empty()).then(|| PathBuf::from(dir.trim()));
        }
        if let Some(dir) = &args.policy_artifact_dir {
            config.artifact_dir = dir.clone();
        }
        if let Some(allow) = args.policy_allow_tags {
            config.allow_tags = allow;
        }
        if let Some(ms) = args.policy_timeout_ms {
            config.limits.timeout = Duration::from_millis(ms);
        }
        if let Some(mib) = args.policy_memory_mib {
            config.limits.memory_bytes = usize::try_from(mib << 20).unwrap_or(usize::MAX);
        }
        if let Some(n) = args.policy_max_concurrent {
            config.limits.max_concurrent = u32::try_from(n).unwrap_or(u32::MAX);
        }
        let count = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        if let Some(n) = args.policy_max_core_instances {
            config.limits.max_core_instances = count(n);
        }
        if let Some(n) = args.policy_max_memories {
            config.limits.max_memories = count(n);
        }
        if let Some(n) = args.policy_max_tables {
            config.limits.max_tables = count(n);
        }
        if let Some(n) = args.policy_max_table_elements {
            config.limits.max_table_elements = count(n);
        }
        if let Some(n) = args.policy_max_concurrent_large {
            config.limits.max_concurrent_large = count(n);
        }
        if let Some(seconds) = args.policy_compile_deadline_s {
            config.compile.deadline = Duration::from_secs(seconds);
        }
        if let Some(mib) = args.policy_compile_address_space_mib {
            config.compile.address_space_mib = mib;
        }
        Ok(config)
    }

    /// Reads the variables through `lookup` (the rules of the environment), then the file.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, String> {
        let args = settings::parse_lookup::<PolicyArgs>(lookup)?;
        Self::from_args(&args).map_err(|e| e.to_string())
    }

    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let problem = |problem: String| ConfigError {
            variable: "VK_POLICY_CONFIG".into(),
            problem,
        };
        let text = fs::read_to_string(path).map_err(|e| problem(format!("cannot read {}: {e}", path.display())))?;
        let mut config: PolicyConfig =
            serde_yaml_ng::from_str(&text).map_err(|e| problem(format!("{} is malformed: {e}", path.display())))?;
        // Relative component paths are relative to the configuration file.
        let base = path.parent().unwrap_or(Path::new("."));
        for slot in config.slots.values_mut() {
            if let PolicySource::File(file) = &mut slot.source {
                *file = base.join(&*file);
            }
            slot.cases = slot.cases.as_ref().map(|c| base.join(c));
        }
        config.artifact_dir = base.join(&config.artifact_dir);
        if let Some(wrong) = config.compile.problem() {
            return Err(problem(format!("{}: {wrong}", path.display())));
        }
        config.file = Some(path.to_path_buf());
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |key| pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| v.to_string())
    }

    #[test]
    fn defaults_without_any_configuration() {
        let config = PolicyConfig::from_env(env(&[])).unwrap();
        assert!(config.slots.is_empty());
        assert_eq!(config.cache_dir.as_deref(), Some(Path::new(DEFAULT_CACHE_DIR)));
        assert_eq!(config.limits, SandboxLimits::default());
        assert_eq!(config.compile, CompileLimits::default());
        assert_eq!(config.compile.deadline, Duration::from_secs(300));
    }

    #[test]
    fn the_component_shape_limits_come_from_the_file_and_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("p.yaml");
        fs::write(
            &file,
            "limits: {max-core-instances: 40, max-memories: 3, max-concurrent-large: 2}\n",
        )
        .unwrap();
        let config = PolicyConfig::from_env(env(&[
            ("VK_POLICY_CONFIG", file.to_str().unwrap()),
            ("VK_POLICY_MAX_MEMORIES", "6"),
            ("VK_POLICY_MAX_TABLES", "5"),
            ("VK_POLICY_MAX_TABLE_ELEMENTS", "20000"),
        ]))
        .unwrap();
        let limits = config.limits;
        assert_eq!(
            (limits.max_core_instances, limits.max_memories, limits.max_tables),
            (40, 6, 5)
        );
        assert_eq!((limits.max_table_elements, limits.max_concurrent_large), (20_000, 2));
        let err = PolicyConfig::from_env(env(&[("VK_POLICY_MAX_CORE_INSTANCES", "0")])).unwrap_err();
        assert!(
            err.contains("VK_POLICY_MAX_CORE_INSTANCES") && err.contains("between 1 and 1024"),
            "{err}"
        );
    }

    #[test]
    fn file_then_environment_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("policies.yaml");
        fs::write(
            &file,
            "slots:\n  bring-up: {path: bring-up.wasm}\nlimits: {timeout: 20}\ncache-dir: null\n\
             compile: {deadline-seconds: 60, address-space-mib: 2048}\n",
        )
        .unwrap();
        let file_str = file.to_str().unwrap();
        let config = PolicyConfig::from_env(env(&[
            ("VK_POLICY_CONFIG", file_str),
            ("VK_POLICY_CPU_CLASS_ADMISSION", "/etc/admit.wasm"),
            ("VK_POLICY_GUEST_FIXUP", "/etc/fixup.wasm"),
            ("VK_POLICY_MEMORY_MIB", "8"),
            ("VK_POLICY_COMPILE_ADDRESS_SPACE_MIB", "8192"),
        ]))
        .unwrap();
        assert_eq!(
            config.slots[&Slot::BringUp],
            SlotConfig::file(dir.path().join("bring-up.wasm"))
        );
        assert_eq!(
            config.slots[&Slot::CpuClassAdmission],
            SlotConfig::file("/etc/admit.wasm")
        );
        assert_eq!(config.slots[&Slot::GuestFixup], SlotConfig::file("/etc/fixup.wasm"));
        assert_eq!(config.file.as_deref(), Some(file.as_path()));
        assert_eq!(config.env_slots.len(), 2);
        assert_eq!(config.limits.timeout, Duration::from_millis(20));
        assert_eq!(config.limits.memory_bytes, 8 << 20);
        assert_eq!(config.compile.deadline, Duration::from_secs(60), "the file's");
        assert_eq!(
            config.compile.address_space_mib, 8192,
            "the environment's over the file's"
        );
        assert_eq!(config.cache_dir, None);
    }

    #[test]
    fn the_example_configuration_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/policies.yaml");
        let config = PolicyConfig::from_file(&path).unwrap();
        assert_eq!(
            config.slots[&Slot::BringUp].path(),
            Some(path.parent().unwrap().join("policies/bring-up.wasm").as_path())
        );
        assert!(!config.allow_tags);
        assert_eq!(config.artifact_dir, PathBuf::from(DEFAULT_ARTIFACT_DIR));
        assert_eq!(
            config.compile,
            CompileLimits::default(),
            "the example shows the defaults"
        );
    }

    #[test]
    fn registry_sources_in_the_file_and_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("policies.yaml");
        let digest = format!("sha256:{}", "ab".repeat(32));
        fs::write(
            &file,
            format!("slots:\n  bring-up: {{source: 'oci://127.0.0.1:5000/p/bring-up@{digest}'}}\nallow-tags: true\n"),
        )
        .unwrap();
        let config = PolicyConfig::from_env(env(&[
            ("VK_POLICY_CONFIG", file.to_str().unwrap()),
            ("VK_POLICY_GUEST_FIXUP", "oci://127.0.0.1:5000/p/fixup:v1"),
        ]))
        .unwrap();
        let PolicySource::Oci(reference) = &config.slots[&Slot::BringUp].source else {
            panic!("a registry source")
        };
        assert_eq!(reference.digest(), Some(digest.as_str()));
        assert!(config.allow_tags);
        assert!(matches!(&config.slots[&Slot::GuestFixup].source, PolicySource::Oci(r) if r.digest().is_none()));
        assert_eq!(config.artifact_dir, PathBuf::from(DEFAULT_ARTIFACT_DIR));
        let err =
            PolicyConfig::from_env(env(&[("VK_POLICY_BRING_UP", "oci://127.0.0.1:5000/p@sha256:12")])).unwrap_err();
        assert!(
            err.contains("VK_POLICY_BRING_UP") && err.contains("64 lower-case hex"),
            "{err}"
        );
    }

    #[test]
    fn every_slot_has_its_variable() {
        use clap::Args;
        let cmd = PolicyArgs::augment_args(clap::Command::new("t"));
        for slot in Slot::ALL {
            let var = slot.env_var();
            assert!(
                cmd.get_arguments()
                    .any(|a| a.get_env().is_some_and(|e| e == var.as_str())),
                "{var} is declared"
            );
        }
    }

    #[test]
    fn bad_values_name_the_variable_and_the_accepted_range() {
        let err = PolicyConfig::from_env(env(&[("VK_POLICY_TIMEOUT_MS", "soon")])).unwrap_err();
        assert!(
            err.contains("VK_POLICY_TIMEOUT_MS=\"soon\"") && err.contains("between 1 and 60000"),
            "{err}"
        );
        let err = PolicyConfig::from_env(env(&[("VK_POLICY_COMPILE_ADDRESS_SPACE_MIB", "64")])).unwrap_err();
        assert!(
            err.contains("VK_POLICY_COMPILE_ADDRESS_SPACE_MIB=\"64\"") && err.contains("between 256 and 1048576"),
            "{err}"
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("policies.yaml");
        fs::write(&file, "compile: {deadline-seconds: 0}\n").unwrap();
        let err = PolicyConfig::from_env(env(&[("VK_POLICY_CONFIG", file.to_str().unwrap())])).unwrap_err();
        assert!(
            err.contains("VK_POLICY_CONFIG")
                && err.contains("compile.deadline-seconds is 0; accepted: a whole number between 1 and 3600"),
            "{err}"
        );
        let err = PolicyConfig::from_env(env(&[("VK_POLICY_CONFIG", "/nonexistent/p.yaml")])).unwrap_err();
        assert!(err.to_string().contains("VK_POLICY_CONFIG") && err.to_string().contains("/nonexistent/p.yaml"));
    }
}
