//! The snapshot config blob (`manifest.SnapshotConfig`, camelCase): what a pull reads to learn each
//! file's mode, sparse map and chunk order, and what a push builds from the cocoon envelope.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

use crate::hypervisor::Hypervisor;

/// One file of the snapshot in the config blob.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FileInfo {
    #[serde(default)]
    pub mode: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sparse_map: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sparse_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<String>,
}

/// The config blob (`manifest.SnapshotConfig`, camelCase).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotConfig {
    #[serde(default)]
    pub schema_version: String,
    #[serde(default)]
    pub snapshot_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_digest: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_type: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub image_blob_ids: BTreeMap<String, Value>,
    #[serde(default, skip_serializing_if = "Hypervisor::is_unspecified")]
    pub hypervisor: Hypervisor,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cpu: i64,
    #[serde(default, skip_serializing_if = "is_zero_u")]
    pub memory: u64,
    #[serde(default, skip_serializing_if = "is_zero_u")]
    pub storage: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nics: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub windows: bool,
    #[serde(default)]
    pub files: BTreeMap<String, FileInfo>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub created_at: String,
    /// The complete original `snapshot.json` config object, so unknown keys survive the round trip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<Value>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}
fn is_zero_u(v: &u64) -> bool {
    *v == 0
}

/// A `snapshot.json` envelope that is not cocoon's.
#[derive(Debug, thiserror::Error)]
pub enum EnvelopeError {
    #[error("snapshot.json is not valid JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("snapshot.json has no \"config\" object")]
    NoConfig,
}

impl SnapshotConfig {
    /// Builds the config from the export's `snapshot.json` envelope (`{"version":1,"config":{snake_case}}`).
    pub fn from_envelope(envelope: &[u8], created_at: String) -> Result<SnapshotConfig, EnvelopeError> {
        let v: Value = serde_json::from_slice(envelope).map_err(EnvelopeError::NotJson)?;
        let c = v
            .get("config")
            .and_then(Value::as_object)
            .ok_or(EnvelopeError::NoConfig)?;
        let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let i = |k: &str| c.get(k).and_then(Value::as_i64).unwrap_or_default();
        let u = |k: &str| c.get(k).and_then(Value::as_u64).unwrap_or_default();
        Ok(SnapshotConfig {
            schema_version: "v1".into(),
            snapshot_id: s("id"),
            description: s("description"),
            image: s("image"),
            image_digest: s("image_digest"),
            image_type: s("image_type"),
            image_blob_ids: c
                .get("image_blob_ids")
                .and_then(Value::as_object)
                .map(|m| m.clone().into_iter().collect())
                .unwrap_or_default(),
            hypervisor: Hypervisor::from(s("hypervisor")),
            cpu: i("cpu"),
            memory: u("memory"),
            storage: u("storage"),
            nics: i("nics"),
            network: s("network"),
            windows: c.get("windows").and_then(Value::as_bool).unwrap_or(false),
            files: BTreeMap::new(),
            created_at,
            engine: Some(Value::Object(c.clone())),
        })
    }

    /// The `snapshot.json` envelope for `cocoon snapshot import`, with the name replaced by `local_name`.
    pub fn envelope(&self, local_name: &str) -> Vec<u8> {
        let mut c = match &self.engine {
            Some(Value::Object(m)) => m.clone(),
            _ => {
                let mut m = Map::new();
                let mut put = |k: &str, v: Value| {
                    let empty = matches!(&v, Value::String(s) if s.is_empty()) || v == 0 || v == Value::Bool(false);
                    if !empty {
                        m.insert(k.to_string(), v);
                    }
                };
                put("id", self.snapshot_id.clone().into());
                put("description", self.description.clone().into());
                put("image", self.image.clone().into());
                put("image_digest", self.image_digest.clone().into());
                put("image_type", self.image_type.clone().into());
                put("hypervisor", self.hypervisor.as_str().into());
                put("cpu", self.cpu.into());
                put("memory", self.memory.into());
                put("storage", self.storage.into());
                put("nics", self.nics.into());
                put("network", self.network.clone().into());
                put("windows", self.windows.into());
                if !self.image_blob_ids.is_empty() {
                    m.insert(
                        "image_blob_ids".into(),
                        Value::Object(self.image_blob_ids.clone().into_iter().collect()),
                    );
                }
                m
            }
        };
        c.insert("name".into(), Value::String(local_name.to_string()));
        serde_json::to_vec(&serde_json::json!({"version": 1, "config": c})).expect("JSON of a map")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_from_envelope_and_back() {
        let env = br#"{"version":1,"config":{"id":"SNAP1","name":"vm-a","image":"img:1","image_digest":"sha256:i","hypervisor":"cloud-hypervisor","cpu":2,"memory":1024,"future_key":"kept"}}"#;
        let c = SnapshotConfig::from_envelope(env, "2026-01-01T00:00:00Z".into()).unwrap();
        assert_eq!(
            (
                c.snapshot_id.as_str(),
                c.image.as_str(),
                c.image_digest.as_str(),
                c.hypervisor.as_str(),
                c.cpu
            ),
            ("SNAP1", "img:1", "sha256:i", "cloud-hypervisor", 2)
        );
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["snapshotId"], "SNAP1");
        assert_eq!(json["imageDigest"], "sha256:i");
        assert_eq!(json["schemaVersion"], "v1");
        let back: Value = serde_json::from_slice(&c.envelope("local-x")).unwrap();
        assert_eq!(back["version"], 1);
        assert_eq!(back["config"]["name"], "local-x");
        assert_eq!(back["config"]["future_key"], "kept");
        assert_eq!(back["config"]["id"], "SNAP1");
        // Without the engine copy the envelope is rebuilt from the typed fields.
        let mut c2 = c.clone();
        c2.engine = None;
        let back: Value = serde_json::from_slice(&c2.envelope("l")).unwrap();
        assert_eq!(
            (
                back["config"]["id"].as_str(),
                back["config"]["memory"].as_u64(),
                back["config"].get("storage")
            ),
            (Some("SNAP1"), Some(1024), None)
        );
        assert!(SnapshotConfig::from_envelope(b"{}", String::new()).is_err());
    }
}
