//! Operator configuration of the policy engine: which component serves each slot, the sandbox
//! limits, and the compile cache. From a YAML file (`VK_POLICY_CONFIG`) and environment
//! overrides; see `deploy/policies.yaml` and `deploy/vk-cocoon.env.example`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::engine::SandboxLimits;
use super::slots::Slot;

/// Default location of the compiled-policy cache.
pub const DEFAULT_CACHE_DIR: &str = "/var/lib/cocoon/vk-policy-cache";

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct PolicyConfig {
    /// Slots served by an operator's component; the others use the built-in defaults.
    #[serde(default)]
    pub slots: BTreeMap<Slot, SlotConfig>,
    #[serde(default)]
    pub limits: SandboxLimits,
    /// Compiled components are cached here; `null` disables the cache.
    #[serde(default = "default_cache_dir")]
    pub cache_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct SlotConfig {
    /// The `.wasm` component. Watched: a new version is validated and swapped in.
    pub path: PathBuf,
    /// Case table run before every swap; default `<path without .wasm>.cases.yaml` if present.
    #[serde(default)]
    pub cases: Option<PathBuf>,
}

fn default_cache_dir() -> Option<PathBuf> {
    Some(PathBuf::from(DEFAULT_CACHE_DIR))
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            slots: BTreeMap::new(),
            limits: SandboxLimits::default(),
            cache_dir: default_cache_dir(),
        }
    }
}

impl SlotConfig {
    /// The case table that guards swaps of this slot's component, if one exists.
    pub fn cases_path(&self) -> Option<PathBuf> {
        if let Some(cases) = &self.cases {
            return Some(cases.clone());
        }
        let beside = self.path.with_extension("cases.yaml");
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

impl PolicyConfig {
    /// Reads the configuration: the YAML file named by `VK_POLICY_CONFIG` (if set), then the
    /// environment overrides `VK_POLICY_<SLOT>` (a component path), `VK_POLICY_CACHE_DIR`
    /// (empty disables the cache), `VK_POLICY_TIMEOUT_MS`, `VK_POLICY_MEMORY_MIB` and
    /// `VK_POLICY_MAX_CONCURRENT`. `env` is the variable lookup (the process environment in
    /// the daemon).
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let mut config = match env("VK_POLICY_CONFIG").filter(|v| !v.is_empty()) {
            Some(path) => Self::from_file(Path::new(&path))?,
            None => PolicyConfig::default(),
        };
        for slot in Slot::ALL {
            let variable = slot.env_var();
            if let Some(path) = env(&variable).filter(|v| !v.is_empty()) {
                config.slots.insert(
                    slot,
                    SlotConfig {
                        path: PathBuf::from(path),
                        cases: None,
                    },
                );
            }
        }
        if let Some(dir) = env("VK_POLICY_CACHE_DIR") {
            config.cache_dir = (!dir.is_empty()).then(|| PathBuf::from(dir));
        }
        let number = |variable: &str, min: u64, max: u64| -> Result<Option<u64>, ConfigError> {
            let Some(text) = env(variable).filter(|v| !v.is_empty()) else {
                return Ok(None);
            };
            match text.trim().parse::<u64>() {
                Ok(n) if (min..=max).contains(&n) => Ok(Some(n)),
                _ => Err(ConfigError {
                    variable: variable.into(),
                    problem: format!("{text:?} is not a whole number between {min} and {max}"),
                }),
            }
        };
        if let Some(ms) = number("VK_POLICY_TIMEOUT_MS", 1, 60_000)? {
            config.limits.timeout = Duration::from_millis(ms);
        }
        if let Some(mib) = number("VK_POLICY_MEMORY_MIB", 1, 4096)? {
            config.limits.memory_bytes = usize::try_from(mib << 20).unwrap_or(usize::MAX);
        }
        if let Some(n) = number("VK_POLICY_MAX_CONCURRENT", 1, 1024)? {
            config.limits.max_concurrent = u32::try_from(n).unwrap_or(u32::MAX);
        }
        Ok(config)
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
            slot.path = base.join(&slot.path);
            slot.cases = slot.cases.as_ref().map(|c| base.join(c));
        }
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
    }

    #[test]
    fn file_then_environment_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("policies.yaml");
        fs::write(
            &file,
            "slots:\n  bring-up: {path: bring-up.wasm}\nlimits: {timeout: 20}\ncache-dir: null\n",
        )
        .unwrap();
        let file_str = file.to_str().unwrap();
        let config = PolicyConfig::from_env(env(&[
            ("VK_POLICY_CONFIG", file_str),
            ("VK_POLICY_CPU_CLASS_ADMISSION", "/etc/admit.wasm"),
            ("VK_POLICY_GUEST_FIXUP", "/etc/fixup.wasm"),
            ("VK_POLICY_MEMORY_MIB", "8"),
        ]))
        .unwrap();
        assert_eq!(config.slots[&Slot::BringUp].path, dir.path().join("bring-up.wasm"));
        assert_eq!(
            config.slots[&Slot::CpuClassAdmission].path,
            PathBuf::from("/etc/admit.wasm")
        );
        assert_eq!(config.slots[&Slot::GuestFixup].path, PathBuf::from("/etc/fixup.wasm"));
        assert_eq!(config.limits.timeout, Duration::from_millis(20));
        assert_eq!(config.limits.memory_bytes, 8 << 20);
        assert_eq!(config.cache_dir, None);
    }

    #[test]
    fn bad_values_name_the_variable_and_the_accepted_range() {
        let err = PolicyConfig::from_env(env(&[("VK_POLICY_TIMEOUT_MS", "soon")])).unwrap_err();
        assert_eq!(err.variable, "VK_POLICY_TIMEOUT_MS");
        assert!(err.to_string().contains("between 1 and 60000"), "{err}");
        let err = PolicyConfig::from_env(env(&[("VK_POLICY_CONFIG", "/nonexistent/p.yaml")])).unwrap_err();
        assert!(err.to_string().contains("VK_POLICY_CONFIG") && err.to_string().contains("/nonexistent/p.yaml"));
    }
}
