//! The policy artifact: an OCI image manifest of artifact type [`ARTIFACT_TYPE`] whose first
//! layer is the component (`application/wasm`) and whose optional second layer is its case table;
//! the manifest's annotations name the slot and the contract version, and a small JSON config
//! repeats them for tools that only read configs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::registry::{ArtifactLayer, ArtifactUpload, PulledArtifact};

use super::super::slots::Slot;

pub const ARTIFACT_TYPE: &str = "application/vnd.cocoonstack.vk-policy.v1";
pub const CONFIG_MEDIA_TYPE: &str = "application/vnd.cocoonstack.vk-policy.config.v1+json";
/// The component layer: the media type the WebAssembly OCI artifact layout uses for a wasm blob.
pub const COMPONENT_MEDIA_TYPE: &str = "application/wasm";
pub const CASES_MEDIA_TYPE: &str = "application/vnd.cocoonstack.vk-policy.cases.v1+yaml";
pub const ANN_SLOT: &str = "cocoonstack.vk-policy.slot";
pub const ANN_CONTRACT: &str = "cocoonstack.vk-policy.contract";
pub const ANN_TITLE: &str = "org.opencontainers.image.title";
pub const ANN_CREATED: &str = "org.opencontainers.image.created";

/// Components and tables larger than this are refused on push and on pull (a default Rust
/// component is ~40 KiB; componentize-py's CPython one 18.4 MB, the SpiderMonkey JavaScript
/// one 12 MB: room for those with a margin, while a pull still reads its layers into memory).
pub const MAX_LAYER_BYTES: u64 = 64 << 20;

/// The config blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyArtifactConfig {
    pub slot: Slot,
    /// `cocoonstack:vk-policy@X.Y.Z`.
    pub contract: String,
    /// `sha256:…` of the component layer.
    pub component: String,
}

/// A component with its slot, contract and optional case table, as pushed and as pulled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyArtifact {
    pub slot: Slot,
    pub contract: String,
    pub component: Vec<u8>,
    pub cases: Option<Vec<u8>>,
}

impl PolicyArtifact {
    /// What `policy push` uploads. `name` is the component's file name (the layer title).
    pub fn upload(&self, name: &str, created: &str) -> ArtifactUpload {
        let config = PolicyArtifactConfig {
            slot: self.slot,
            contract: self.contract.clone(),
            component: crate::registry::manifest::sha256_digest(&self.component),
        };
        let titled = |title: String| BTreeMap::from([(ANN_TITLE.to_string(), title)]);
        let mut layers = vec![ArtifactLayer {
            media_type: COMPONENT_MEDIA_TYPE.into(),
            bytes: self.component.clone(),
            annotations: titled(name.to_string()),
        }];
        if let Some(cases) = &self.cases {
            let stem = name.strip_suffix(".wasm").unwrap_or(name);
            layers.push(ArtifactLayer {
                media_type: CASES_MEDIA_TYPE.into(),
                bytes: cases.clone(),
                annotations: titled(format!("{stem}.cases.yaml")),
            });
        }
        ArtifactUpload {
            artifact_type: ARTIFACT_TYPE.into(),
            config_media_type: CONFIG_MEDIA_TYPE.into(),
            config: serde_json::to_vec(&config).expect("JSON of the policy config"),
            layers,
            annotations: BTreeMap::from([
                (ANN_SLOT.to_string(), self.slot.to_string()),
                (ANN_CONTRACT.to_string(), self.contract.clone()),
                (ANN_CREATED.to_string(), created.to_string()),
            ]),
        }
    }

    /// Reads a pulled artifact: the artifact type, the slot annotation and exactly one
    /// component layer are required; a case table layer is optional.
    pub fn from_pulled(pulled: &PulledArtifact) -> Result<PolicyArtifact, String> {
        let m = &pulled.manifest;
        let artifact_type = m.artifact_type.as_deref().unwrap_or(m.config.media_type.as_str());
        if artifact_type != ARTIFACT_TYPE && m.config.media_type != CONFIG_MEDIA_TYPE {
            return Err(format!(
                "it is not a policy artifact (artifact type {artifact_type:?}, expected {ARTIFACT_TYPE}); push policies with `vk-cocoon policy push`"
            ));
        }
        let annotations: BTreeMap<String, String> = m.annotations.clone().unwrap_or_default().into_iter().collect();
        let slot_text = annotations
            .get(ANN_SLOT)
            .ok_or_else(|| format!("its manifest has no {ANN_SLOT} annotation"))?;
        let slot: Slot = slot_text
            .parse()
            .map_err(|e| format!("its {ANN_SLOT} annotation: {e}"))?;
        let of_type = |media: &'static str| pulled.layers.iter().filter(move |l| l.media_type == media);
        let mut components = of_type(COMPONENT_MEDIA_TYPE);
        let component = match (components.next(), components.next()) {
            (Some(layer), None) => layer.bytes.clone(),
            (None, _) => return Err(format!("it has no {COMPONENT_MEDIA_TYPE} layer")),
            (Some(_), Some(_)) => return Err(format!("it has more than one {COMPONENT_MEDIA_TYPE} layer")),
        };
        let cases = of_type(CASES_MEDIA_TYPE).next().map(|l| l.bytes.clone());
        Ok(PolicyArtifact {
            slot,
            contract: annotations.get(ANN_CONTRACT).cloned().unwrap_or_default(),
            component,
            cases,
        })
    }
}
