//! What `cocoon-macos` prints back: the `vm inspect` record, the `image inspect` record, and the
//! classification of a failure from its stderr.

use serde::Deserialize;
use std::time::Duration;

/// `vm inspect NAME` (`{name, pid, mac, tap, disk, vnc}`; the CLI prints more).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MacVm {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub pid: i64,
    #[serde(default)]
    pub mac: String,
    #[serde(default)]
    pub tap: String,
    #[serde(default)]
    pub disk: String,
    /// VNC display; -1 or absent = off.
    #[serde(default)]
    pub vnc: Option<i64>,
}

impl MacVm {
    /// The VNC display, when on.
    pub fn vnc_display(&self) -> Option<u16> {
        self.vnc.filter(|d| *d >= 0).and_then(|d| u16::try_from(d).ok())
    }
}

/// `image inspect IMAGE`: cocoon's image record; `virtual_size` is the qcow2's (0 when the CLI
/// does not print it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct MacImage {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub virtual_size: u64,
}

/// Everything a `cocoon-macos` invocation can fail with. Only the `*NotFound` variants are
/// definitive; the rest are inconclusive (retry, never "gone").
#[derive(Debug, thiserror::Error)]
pub enum MacosError {
    #[error("cocoon-macos {verb}: vm {name:?} not found ({stderr})")]
    VmNotFound { verb: String, name: String, stderr: String },
    #[error("cocoon-macos {verb}: image {image:?} not found ({stderr})")]
    ImageNotFound {
        verb: String,
        image: String,
        stderr: String,
    },
    #[error("cocoon-macos {verb} failed (exit {code:?}): {stderr}")]
    Command {
        verb: String,
        code: Option<i32>,
        stderr: String,
    },
    #[error("cocoon-macos {verb} timed out after {after:?}; the process was stopped")]
    Timeout { verb: String, after: Duration },
    #[error(
        "cannot start `{bin}` for cocoon-macos {verb}: {source} (check VK_COCOON_MACOS_BIN and that the binary is executable)"
    )]
    Spawn {
        verb: String,
        bin: String,
        source: std::io::Error,
    },
    #[error("cocoon-macos {verb}: I/O error talking to the process: {source}")]
    Io { verb: String, source: std::io::Error },
    #[error("cocoon-macos {verb}: cannot decode output: {detail} (output starts with {head:?})")]
    Decode { verb: String, detail: String, head: String },
    #[error("invalid cocoon-macos request: {0}")]
    InvalidRequest(String),
}

impl MacosError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::VmNotFound { .. } | Self::ImageNotFound { .. })
    }
}

/// "Missing" as vk-cocoon has always read it: the output says `not found` or `no such` (any
/// case; the CLI's own texts are `read vm record: open …: no such file or directory` and
/// `image not found: REF`).
pub fn says_missing(output: &str) -> bool {
    let lower = output.to_ascii_lowercase();
    lower.contains("not found") || lower.contains("no such")
}

/// A failed verb, from its exit code and output.
pub fn classify(verb: &str, reference: &str, code: Option<i32>, stderr: &str) -> MacosError {
    let text = stderr.trim().to_string();
    if says_missing(&text) {
        if verb.starts_with("image") {
            return MacosError::ImageNotFound {
                verb: verb.into(),
                image: reference.into(),
                stderr: text,
            };
        }
        return MacosError::VmNotFound {
            verb: verb.into(),
            name: reference.into(),
            stderr: text,
        };
    }
    MacosError::Command {
        verb: verb.into(),
        code,
        stderr: text,
    }
}

pub fn parse_json<T: for<'de> Deserialize<'de>>(verb: &str, out: &str) -> Result<T, MacosError> {
    serde_json::from_str(out).map_err(|e| MacosError::Decode {
        verb: verb.into(),
        detail: e.to_string(),
        head: out.chars().take(80).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_is_read_from_the_real_texts_and_nothing_else() {
        let e = classify(
            "vm inspect",
            "m",
            Some(1),
            "Error: read vm record: open /var/lib/cocoon-macos/vms/m/vm.json: no such file or directory\n",
        );
        assert!(matches!(e, MacosError::VmNotFound { .. }), "{e}");
        let e = classify("image inspect", "x", Some(1), "Error: image not found: x");
        assert!(matches!(e, MacosError::ImageNotFound { .. }), "{e}");
        let e = classify("vm rm", "m", Some(1), "Error: VM Not Found");
        assert!(e.is_not_found());
        let e = classify("vm run", "m", Some(1), "Error: bind vnc port: address already in use");
        assert!(!e.is_not_found() && e.to_string().contains("bind vnc port"), "{e}");
    }

    #[test]
    fn the_inspect_record_and_its_display() {
        let vm: MacVm = parse_json(
            "vm inspect",
            r#"{"name":"m","pid":42,"mac":"52:54:00:aa:bb:cc","tap":"tap1","disk":"/d","vnc":3,"cpus":4}"#,
        )
        .unwrap();
        assert_eq!((vm.pid, vm.vnc_display()), (42, Some(3)));
        let off: MacVm = parse_json("vm inspect", r#"{"name":"m","vnc":-1}"#).unwrap();
        assert_eq!(off.vnc_display(), None);
        let absent: MacVm = parse_json("vm inspect", r#"{"name":"m"}"#).unwrap();
        assert_eq!(absent.vnc_display(), None);
        assert!(parse_json::<MacVm>("vm inspect", "m (pid 3)").is_err());
    }
}
