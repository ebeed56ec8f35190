//! What a snapshot's files are, as the registry records them: for each file its apparent size,
//! where its data lies (the sparse map) and the SHA-256 of each blob that carries that data. A
//! copy obtained elsewhere (the peer tier) is checked against this, so the registry stays the
//! root of trust for what a snapshot is whoever delivered the bytes.
//!
//! A blob's digest covers the bytes the registry stores. For a raw layer (v1, and v2 chunks
//! without compression) those are the file's data bytes themselves — the data segments of the
//! sparse map laid end to end, cut into the chunks in order — so a staged file can be hashed and
//! compared. A zstd layer's digest covers compressed bytes, which a copy of the file cannot
//! reproduce: such a snapshot is [`Unverifiable`] and must come from the registry.

use super::client::Registry;
use super::errors::RegistryError;
use super::manifest::{self, FilePlan, PlanError, SnapshotConfig};
use super::media::LayerEncoding;

/// One blob's share of a file's data: `length` bytes whose SHA-256 is `sha256`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentPart {
    pub length: u64,
    pub sha256: [u8; 32],
}

/// One file of the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileContent {
    pub name: String,
    /// The size the file has on disk (holes included).
    pub apparent_size: u64,
    /// Where its data lies, `(offset, length)` in order; every other byte is zero. The whole file
    /// when the config has no sparse map.
    pub segments: Vec<(u64, u64)>,
    /// The data segments laid end to end, cut into the blobs that carry them.
    pub parts: Vec<ContentPart>,
}

impl FileContent {
    /// Bytes of data the parts cover.
    pub fn data_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.length).sum()
    }
}

/// Why a snapshot's files cannot be checked against the registry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unverifiable(pub String);

/// A snapshot artifact as one registry answer gave it: its config and what its files must be.
#[derive(Debug, Clone)]
pub struct SnapshotContent {
    pub manifest_digest: String,
    pub config: SnapshotConfig,
    pub files: Result<Vec<FileContent>, Unverifiable>,
}

impl Registry {
    /// What `repo:tag` says its snapshot is, from one resolution of the tag (manifest, config and
    /// file digests agree with each other). `None` when the tag is absent; an artifact that is no
    /// valid snapshot is an error, as for a pull.
    pub async fn snapshot_content(&self, repo: &str, tag: &str) -> Result<Option<SnapshotContent>, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let Some(resolved) = self.fetch_resolved(repo, tag).await? else {
            return Ok(None);
        };
        let config = self.fetch_snapshot_config(repo, tag, &resolved.manifest).await?;
        let files = match manifest::snapshot_plan(&resolved.manifest, &config) {
            Ok(plans) => content_of(&plans),
            Err(PlanError::Invalid { detail, cause }) => {
                return Err(RegistryError::InvalidArtifact {
                    artifact,
                    detail,
                    cause,
                });
            }
            Err(PlanError::MediaType { title, media_type }) => {
                return Err(RegistryError::UnsupportedMediaType {
                    artifact,
                    title,
                    media_type,
                });
            }
        };
        Ok(Some(SnapshotContent {
            manifest_digest: resolved.digest,
            config,
            files,
        }))
    }
}

/// The files of a checked pull plan (`snapshot_plan` has validated sizes and sparse maps).
pub fn content_of(plans: &[FilePlan]) -> Result<Vec<FileContent>, Unverifiable> {
    plans.iter().map(file_content).collect()
}

fn file_content(p: &FilePlan) -> Result<FileContent, Unverifiable> {
    if let Some(part) = p.parts.iter().find(|part| part.encoding != LayerEncoding::Raw) {
        return Err(Unverifiable(format!(
            "file {:?} is stored zstd-compressed (blob {}): the registry's digests cover compressed bytes, which a copy of the file cannot be checked against",
            p.title, part.digest
        )));
    }
    let segments = match &p.sparse_map {
        Some(map) => {
            #[derive(serde::Deserialize)]
            struct Segment {
                o: u64,
                l: u64,
            }
            let parsed: Vec<Segment> = serde_json::from_str(map)
                .map_err(|e| Unverifiable(format!("file {:?}: its sparse map is not readable: {e}", p.title)))?;
            parsed.into_iter().filter(|s| s.l > 0).map(|s| (s.o, s.l)).collect()
        }
        None if p.size == 0 => Vec::new(),
        None => vec![(0, p.size)],
    };
    let apparent_size = match &p.sparse_map {
        Some(_) => p.sparse_size.unwrap_or(p.size),
        None => p.size,
    };
    let parts = p
        .parts
        .iter()
        .map(|part| {
            let hex = part
                .digest
                .strip_prefix("sha256:")
                .and_then(|h| hex::decode(h).ok())
                .and_then(|b| <[u8; 32]>::try_from(b).ok())
                .ok_or_else(|| {
                    Unverifiable(format!(
                        "file {:?}: blob {} is not a sha256 digest",
                        p.title, part.digest
                    ))
                })?;
            Ok(ContentPart {
                length: part.size,
                sha256: hex,
            })
        })
        .collect::<Result<Vec<_>, Unverifiable>>()?;
    let data: u64 = segments.iter().map(|(_, l)| l).sum();
    let carried: u64 = parts.iter().map(|part| part.length).sum();
    if data != carried {
        return Err(Unverifiable(format!(
            "file {:?}: its blobs carry {carried} bytes but its data is {data}",
            p.title
        )));
    }
    Ok(FileContent {
        name: p.title.clone(),
        apparent_size,
        segments,
        parts,
    })
}

#[cfg(test)]
mod tests {
    use super::super::manifest::BlobPart;
    use super::*;

    fn plan(title: &str, size: u64, sparse: Option<(&str, u64)>, parts: &[(&str, u64, LayerEncoding)]) -> FilePlan {
        FilePlan {
            title: title.into(),
            mode: 0o640,
            size,
            sparse_map: sparse.map(|(m, _)| m.to_string()),
            sparse_size: sparse.map(|(_, s)| s),
            parts: parts
                .iter()
                .map(|&(digest, size, encoding)| BlobPart {
                    digest: digest.into(),
                    size,
                    encoding,
                })
                .collect(),
        }
    }

    const D1: &str = "sha256:0101010101010101010101010101010101010101010101010101010101010101";
    const D2: &str = "sha256:0202020202020202020202020202020202020202020202020202020202020202";

    #[test]
    fn raw_layers_give_the_data_segments_and_their_digests() {
        let files = content_of(&[
            plan("config.json", 7, None, &[(D1, 7, LayerEncoding::Raw)]),
            plan(
                "cow.raw",
                1024,
                Some((r#"[{"o":0,"l":512},{"o":4096,"l":512}]"#, 8192)),
                &[(D1, 600, LayerEncoding::Raw), (D2, 424, LayerEncoding::Raw)],
            ),
            plan("empty", 0, None, &[(D2, 0, LayerEncoding::Raw)]),
        ])
        .unwrap();
        assert_eq!(files[0].segments, vec![(0, 7)]);
        assert_eq!((files[0].apparent_size, files[0].parts[0].sha256), (7, [1; 32]));
        assert_eq!(files[1].segments, vec![(0, 512), (4096, 512)]);
        assert_eq!(files[1].apparent_size, 8192);
        assert_eq!(files[1].parts.iter().map(|p| p.length).collect::<Vec<_>>(), [600, 424]);
        assert_eq!((files[2].apparent_size, files[2].segments.len()), (0, 0));
    }

    #[test]
    fn compressed_or_odd_layers_cannot_vouch_for_a_copy() {
        let zstd = content_of(&[plan("memory-ranges", 10, None, &[(D1, 4, LayerEncoding::Zstd)])]).unwrap_err();
        assert!(zstd.0.contains("zstd"), "{zstd}");
        let odd = content_of(&[plan("f", 10, None, &[("sha512:ab", 10, LayerEncoding::Raw)])]).unwrap_err();
        assert!(odd.0.contains("not a sha256"), "{odd}");
    }
}
