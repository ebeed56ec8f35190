//! The hypervisor (cocoon's backend) of a VM or a snapshot, parsed once where its text enters
//! the daemon: cocoon's JSON (`vm inspect`/`list`/events, `snapshot inspect`) and a registry
//! snapshot's config. Every layer reads it, so it sits in the foundation, below the cocoon and
//! registry adapters that parse it.
//!
//! The text is kept exactly: cocoon names `cloud-hypervisor` and `firecracker`; an empty or
//! absent value is [`Hypervisor::Unspecified`]; any other value (a newer cocoon's backend, the
//! `qemu` of vk-cocoon's own macOS records) is [`Hypervisor::Other`] and is written back as it
//! came, so a record or a config round-trips unchanged. Code that needs a cocoon directory or
//! file name treats every value but `firecracker` as cloud-hypervisor, cocoon's default.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum Hypervisor {
    /// `cloud-hypervisor`, cocoon's default backend.
    CloudHypervisor,
    /// `firecracker`.
    Firecracker,
    /// Empty or absent.
    #[default]
    Unspecified,
    /// Any other text, kept as it came.
    Other(String),
}

impl Hypervisor {
    /// The exact text cocoon (or the registry config) carries.
    pub fn as_str(&self) -> &str {
        match self {
            Self::CloudHypervisor => "cloud-hypervisor",
            Self::Firecracker => "firecracker",
            Self::Unspecified => "",
            Self::Other(s) => s,
        }
    }

    pub fn is_unspecified(&self) -> bool {
        *self == Self::Unspecified
    }
}

impl From<String> for Hypervisor {
    fn from(s: String) -> Self {
        match s.as_str() {
            "cloud-hypervisor" => Self::CloudHypervisor,
            "firecracker" => Self::Firecracker,
            "" => Self::Unspecified,
            _ => Self::Other(s),
        }
    }
}

impl From<&str> for Hypervisor {
    fn from(s: &str) -> Self {
        Self::from(s.to_string())
    }
}

impl From<Hypervisor> for String {
    fn from(h: Hypervisor) -> String {
        match h {
            Hypervisor::Other(s) => s,
            known => known.as_str().to_string(),
        }
    }
}

impl std::fmt::Display for Hypervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_values_parse_and_anything_else_is_kept_as_it_came() {
        for (text, parsed) in [
            ("cloud-hypervisor", Hypervisor::CloudHypervisor),
            ("firecracker", Hypervisor::Firecracker),
            ("", Hypervisor::Unspecified),
            ("qemu", Hypervisor::Other("qemu".into())),
            ("Firecracker", Hypervisor::Other("Firecracker".into())),
        ] {
            assert_eq!(Hypervisor::from(text), parsed, "{text:?}");
            assert_eq!(parsed.as_str(), text);
            let json = serde_json::to_string(&parsed).unwrap();
            assert_eq!(json, serde_json::to_string(text).unwrap(), "written back exactly");
            assert_eq!(serde_json::from_str::<Hypervisor>(&json).unwrap(), parsed);
        }
    }

    #[test]
    fn an_absent_field_is_unspecified() {
        #[derive(Deserialize)]
        struct Record {
            #[serde(default)]
            hypervisor: Hypervisor,
        }
        let r: Record = serde_json::from_str("{}").unwrap();
        assert_eq!(r.hypervisor, Hypervisor::Unspecified);
    }
}
