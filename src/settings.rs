//! How settings are read. Every setting of `vk-cocoon run` is a clap argument with an
//! environment variable (`#[arg(long, env = "VK_…")]`), declared in a `clap::Args` struct by the
//! module that owns the concern (`kubelet::config::KubeletArgs`, `registry::config::RegistryArgs`,
//! …) and flattened into `RunArgs`: `vk-cocoon run --help` lists every variable with its default,
//! and a value that does not parse stops the start with the variable and what it accepts.
//!
//! Two rules hold for every variable: surrounding whitespace is ignored, and an empty value counts
//! as unset (an `EnvironmentFile` line `VK_NODE_IP=` means "the default") — except the variables
//! in [`EMPTY_IS_A_VALUE`], whose empty value is a setting of its own ("off").

use clap::{Args, Command, FromArgMatches};

/// Variables whose empty value means "off" rather than "unset".
pub const EMPTY_IS_A_VALUE: &[&str] = &["VK_COCOON_NET_CONTROL_SOCKET", "VK_POLICY_CACHE_DIR"];

/// Whether `value` of `var` counts as unset (the default applies).
pub fn counts_as_unset(var: &str, value: &str) -> bool {
    value.trim().is_empty() && !EMPTY_IS_A_VALUE.contains(&var)
}

/// `cmd` (and its subcommands) reading the process environment with the blank-is-unset rule:
/// an argument whose variable is set but blank forgets the variable, so its default applies.
pub fn without_blank_env(cmd: Command) -> Command {
    cmd.mut_args(|arg| {
        let blank = arg.get_env().is_some_and(|var| {
            std::env::var_os(var).is_some_and(|value| counts_as_unset(&var.to_string_lossy(), &value.to_string_lossy()))
        });
        if blank { arg.env(None::<&'static str>) } else { arg }
    })
    .mut_subcommands(without_blank_env)
}

/// Parses the settings `A` declares from `lookup` (variable → value) instead of the process
/// environment, with the same rules: each variable becomes its flag. For tests and anything else
/// that holds settings in a map.
pub fn parse_lookup<A: Args + FromArgMatches>(lookup: impl Fn(&str) -> Option<String>) -> Result<A, SettingsError> {
    let cmd = A::augment_args(Command::new("vk-cocoon-settings"));
    let mut argv = vec!["vk-cocoon-settings".to_string()];
    for arg in cmd.get_arguments() {
        let (Some(var), Some(long)) = (arg.get_env().and_then(|v| v.to_str()), arg.get_long()) else {
            continue;
        };
        if let Some(value) = lookup(var).filter(|v| !counts_as_unset(var, v)) {
            argv.push(format!("--{long}={value}"));
        }
    }
    // Only `lookup` counts: the process environment is not read.
    let cmd = cmd.mut_args(|arg| arg.env(None::<&'static str>));
    let matches = cmd.try_get_matches_from(argv)?;
    Ok(A::from_arg_matches(&matches)?)
}

/// A setting that does not parse. clap's message names the variable (as its flag), the value and
/// what is accepted ([`parser`]), so it is shown as it is.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct SettingsError(#[from] clap::Error);

// The settings of modules that still report a refusal as text take it with `?`.
impl From<SettingsError> for String {
    fn from(e: SettingsError) -> Self {
        e.to_string()
    }
}

/// A clap value parser for `var`: the value is trimmed and handed to `parse`; a refusal names
/// the variable, the value and what is accepted.
pub fn parser<T, E, F>(
    var: &'static str,
    accepted: &'static str,
    parse: F,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: Clone + Send + Sync + 'static,
    E: std::fmt::Display,
    F: Fn(&str) -> Result<T, E> + Clone + Send + Sync + 'static,
{
    move |raw: &str| parse(raw.trim()).map_err(|problem| format!("{var}={raw:?}: {problem}; accepted: {accepted}"))
}

/// `true`/`false` (also `1`/`0`, `yes`/`no`, any case).
pub fn boolean(text: &str) -> Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err("not a boolean".into()),
    }
}

/// A whole number of at least 1.
pub fn positive<T: std::str::FromStr + PartialOrd + Default>(text: &str) -> Result<T, String> {
    match text.parse::<T>() {
        Ok(n) if n > T::default() => Ok(n),
        _ => Err("not a positive whole number".into()),
    }
}

/// An absolute path.
pub fn absolute_path(text: &str) -> Result<std::path::PathBuf, String> {
    let path = std::path::PathBuf::from(text);
    if path.is_absolute() {
        Ok(path)
    } else {
        Err("not an absolute path".into())
    }
}

/// A Go-style duration (`4h`, `30s`, `1h30m`, `500ms`, `4h0m0s`), as the kubelet's flags take.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty".into());
    }
    if s == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let mut total = std::time::Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(|| format!("{s:?}: a number without a unit (use h, m, s or ms)"))?;
        if digits == 0 {
            return Err(format!("{s:?}: expected a number at {rest:?}"));
        }
        let value: f64 = rest[..digits]
            .parse()
            .map_err(|_| format!("{s:?}: {:?} is not a number", &rest[..digits]))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 0.001,
            "us" | "µs" => 0.000_001,
            "ns" => 0.000_000_001,
            other => return Err(format!("{s:?}: unknown unit {other:?} (use h, m, s or ms)")),
        };
        rest = &rest[unit_len..];
        total += std::time::Duration::from_secs_f64(value * unit);
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, clap::Args)]
    struct Sample {
        /// A count.
        #[arg(long, env = "SAMPLE_COUNT", default_value = "3", value_parser = parser("SAMPLE_COUNT", "a number of at least 1", positive::<u32>))]
        count: u32,
        /// Off when empty.
        #[arg(long, env = "VK_POLICY_CACHE_DIR")]
        cache: Option<String>,
    }

    #[test]
    fn lookups_follow_the_environment_rules() {
        let parse = |pairs: &[(&str, &str)]| {
            let owned: Vec<(String, String)> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            parse_lookup::<Sample>(|k| owned.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
        };
        let s = parse(&[]).unwrap();
        assert_eq!((s.count, s.cache), (3, None), "defaults");
        assert_eq!(parse(&[("SAMPLE_COUNT", " 7 ")]).unwrap().count, 7, "trimmed");
        assert_eq!(parse(&[("SAMPLE_COUNT", "  ")]).unwrap().count, 3, "blank is unset");
        assert_eq!(
            parse(&[("VK_POLICY_CACHE_DIR", "")]).unwrap().cache.as_deref(),
            Some(""),
            "an empty value that means off is kept"
        );
        let e = parse(&[("SAMPLE_COUNT", "-2")]).unwrap_err().to_string();
        assert!(
            e.contains("SAMPLE_COUNT=\"-2\"") && e.contains("accepted: a number of at least 1"),
            "{e}"
        );
    }

    #[test]
    fn booleans() {
        for (text, value) in [
            ("true", true),
            ("1", true),
            ("Yes", true),
            ("false", false),
            ("0", false),
            ("NO", false),
        ] {
            assert_eq!(boolean(text), Ok(value), "{text}");
        }
        assert!(boolean("maybe").is_err());
    }

    #[test]
    fn go_durations() {
        for (text, secs) in [
            ("4h", 14400.0),
            ("4h0m0s", 14400.0),
            ("30s", 30.0),
            ("1h30m", 5400.0),
            ("500ms", 0.5),
            ("1.5s", 1.5),
            ("0", 0.0),
        ] {
            assert_eq!(
                parse_duration(text).unwrap(),
                std::time::Duration::from_secs_f64(secs),
                "{text}"
            );
        }
        for bad in ["", "4", "h", "4x", "1h30", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
