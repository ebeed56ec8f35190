//! Push a snapshot export (cocoon's A.6 tar, read from any reader) as an OCI artifact (contracts B.3/B.5).
//! The tar is read entry by entry on a blocking thread (the `tar` crate); each entry is spooled to a
//! temporary file while hashing, so its digest is known before the `HEAD`; missing blobs are uploaded
//! from that file in one streamed PUT. At most one entry is being spooled while the previous one uploads,
//! so memory stays bounded whatever the snapshot size. The manifest, with every annotation (created,
//! baseimage, from-node), is written last in one PUT, so a failed push never leaves a tag pointing at a
//! partial artifact.

use super::client::Registry;
use super::errors::RegistryError;
use super::manifest::{self, FileInfo, PushedLayer, SnapshotConfig};
use super::media;
use super::progress::Progress;
use super::tarfmt;
use oci_client::RegistryOperation;
use sha2::Digest as _;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Instant;
use tokio::io::AsyncRead;
use tokio::sync::mpsc;

/// What a push did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushReport {
    pub repo: String,
    pub tag: String,
    /// The digest of the manifest now under the tag.
    pub manifest_digest: String,
    pub manifest_bytes: u64,
    /// Bytes of all layers plus the config.
    pub total_size: u64,
    pub layer_count: usize,
    /// Bytes actually uploaded (blobs the registry already had were skipped).
    pub uploaded_bytes: u64,
}

/// Spool chunk: the unit of reads from the export and of PATCH bodies.
const CHUNK: usize = 4 << 20;

enum Spooled {
    Envelope(Vec<u8>),
    File {
        meta: tarfmt::EntryMeta,
        file: tempfile::NamedTempFile,
        digest: String,
    },
}

impl Registry {
    /// Pushes the snapshot export read from `export` to `repo:tag`, recording `base_image` (when not empty)
    /// and this node as `from-node` (when the client has a node name).
    pub async fn push_snapshot(
        &self,
        export: Box<dyn AsyncRead + Send + Unpin>,
        repo: &str,
        tag: &str,
        base_image: &str,
        progress: Arc<Progress>,
    ) -> Result<PushReport, RegistryError> {
        let artifact = format!("{repo}:{tag}");
        let started = Instant::now();
        let r = self.reference(repo, tag);
        self.authenticate(&r, RegistryOperation::Push, &artifact).await?;
        tracing::info!(%artifact, "pushing snapshot");

        let (tx, mut rx) = mpsc::channel::<Spooled>(1);
        let spool_dir = self.cfg.spool_dir.clone();
        let bridge = tokio_util::io::SyncIoBridge::new(export);
        let reader = tokio::task::spawn_blocking(move || spool_export(bridge, &spool_dir, tx));

        let mut envelope = None;
        let mut layers: Vec<PushedLayer> = Vec::new();
        let mut files: BTreeMap<String, FileInfo> = BTreeMap::new();
        let mut uploaded = 0u64;
        let mut total = 0u64;
        let mut upload_error = None;
        while let Some(item) = rx.recv().await {
            match item {
                Spooled::Envelope(b) => envelope = Some(b),
                Spooled::File { meta, file, digest } => {
                    total += meta.size;
                    progress.grow_total(meta.size);
                    match self
                        .upload_spooled(&r, &artifact, &meta, file, &digest, &progress)
                        .await
                    {
                        Ok(sent) => uploaded += sent,
                        Err(e) => {
                            upload_error = Some(e);
                            break;
                        }
                    }
                    files.insert(
                        meta.name.clone(),
                        FileInfo {
                            mode: meta.mode,
                            sparse_map: meta.sparse_map.clone(),
                            sparse_size: meta.sparse_size,
                            size: None,
                            chunks: vec![],
                        },
                    );
                    layers.push(PushedLayer {
                        media_type: media::layer_media_type(&meta.name).to_string(),
                        title: meta.name,
                        digest,
                        size: meta.size,
                        chunk: None,
                    });
                    tracing::info!(%artifact, layers = layers.len(), bytes = total, elapsed_s = started.elapsed().as_secs_f64(), "push progress");
                }
            }
        }
        drop(rx); // stops the reader (and so the export) if we broke out early
        let read_result = reader.await.map_err(|e| RegistryError::Io {
            artifact: artifact.clone(),
            step: "reading the snapshot stream".into(),
            detail: format!("reader thread: {e}"),
        })?;
        if let Some(e) = upload_error {
            return Err(e);
        }
        read_result.map_err(|e| match e {
            SpoolError::Source(detail) => RegistryError::Source {
                artifact: artifact.clone(),
                detail,
            },
            SpoolError::Spool(detail) => RegistryError::Io {
                artifact: artifact.clone(),
                step: "spooling the snapshot".into(),
                detail,
            },
        })?;
        let envelope = envelope.ok_or_else(|| RegistryError::Source {
            artifact: artifact.clone(),
            detail: "the export has no snapshot.json".into(),
        })?;

        let created = chrono::Utc::now();
        let mut cfg =
            SnapshotConfig::from_envelope(&envelope, created.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
                .map_err(|detail| RegistryError::InvalidArtifact {
                    artifact: artifact.clone(),
                    detail,
                })?;
        cfg.files = files;
        let cfg_bytes = serde_json::to_vec(&cfg).expect("config JSON");
        let cfg_digest = manifest::sha256_digest(&cfg_bytes);
        let exists = self
            .client
            .blob_exists(&r, &cfg_digest)
            .await
            .map_err(|e| self.oci_error("checking the config blob of", &artifact, e))?;
        if !exists {
            self.client
                .push_blob(&r, cfg_bytes.clone(), &cfg_digest)
                .await
                .map_err(|e| self.oci_error("uploading the config blob of", &artifact, e))?;
        }
        total += cfg_bytes.len() as u64;

        let mut annotations = BTreeMap::new();
        annotations.insert(
            media::ANN_CREATED.to_string(),
            created.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        );
        if !base_image.is_empty() {
            annotations.insert(media::ANN_BASEIMAGE.to_string(), base_image.to_string());
        }
        if !self.node_name.is_empty() {
            annotations.insert(media::ANN_FROM_NODE.to_string(), self.node_name.clone());
        }
        let body = manifest::snapshot_manifest(false, &cfg_digest, cfg_bytes.len() as u64, &layers, annotations);
        let manifest_digest = manifest::sha256_digest(&body);
        let manifest_bytes = body.len() as u64;
        self.client
            .push_manifest_raw(&r, body, media::OCI_MANIFEST.parse().expect("header value"))
            .await
            .map_err(|e| self.oci_error("writing the manifest of", &artifact, e))?;
        tracing::info!(%artifact, digest = %manifest_digest, layers = layers.len(), bytes = total, uploaded, elapsed_s = started.elapsed().as_secs_f64(), "snapshot pushed");
        Ok(PushReport {
            repo: repo.into(),
            tag: tag.into(),
            manifest_digest,
            manifest_bytes,
            total_size: total,
            layer_count: layers.len(),
            uploaded_bytes: uploaded,
        })
    }

    /// HEAD, then upload the spooled file unless present. Returns the bytes sent.
    async fn upload_spooled(
        &self,
        r: &oci_client::Reference,
        artifact: &str,
        meta: &tarfmt::EntryMeta,
        file: tempfile::NamedTempFile,
        digest: &str,
        progress: &Arc<Progress>,
    ) -> Result<u64, RegistryError> {
        let title = &meta.name;
        if self
            .client
            .blob_exists(r, digest)
            .await
            .map_err(|e| self.oci_error(&format!("checking blob {digest} ({title}) of"), artifact, e))?
        {
            tracing::debug!(%artifact, %title, %digest, "blob already present");
            progress.advance(meta.size);
            return Ok(0);
        }
        let f = tokio::fs::File::from_std(file.reopen().map_err(|e| RegistryError::Io {
            artifact: artifact.into(),
            step: format!("reopening the spool file of {title}"),
            detail: e.to_string(),
        })?);
        // Keep the path alive until the upload ends (the file is removed when `file` drops).
        let stream = tokio_util::io::ReaderStream::with_capacity(f, CHUNK);
        let progress = progress.clone();
        let stream = futures::StreamExt::map(stream, move |c| {
            if let Ok(c) = &c {
                progress.advance(c.len() as u64);
            }
            c.map_err(oci_client::errors::OciDistributionError::IoError)
        });
        if meta.size == 0 {
            self.client.push_blob(r, Vec::new(), digest).await
        } else {
            self.client.push_blob_stream(r, stream, digest, Some(meta.size)).await
        }
        .map_err(|e| {
            self.oci_error(
                &format!("uploading blob {digest} ({title}, {} bytes) of", meta.size),
                artifact,
                e,
            )
        })?;
        drop(file);
        Ok(meta.size)
    }
}

enum SpoolError {
    /// The stream is unreadable or not a cocoon export.
    Source(String),
    /// The spool directory failed.
    Spool(String),
}

/// Reads the export tar: `snapshot.json` is sent whole, every other entry is spooled to a temp file in
/// `dir` while hashing. Errors are texts naming the entry.
fn spool_export(input: impl Read, dir: &std::path::Path, tx: mpsc::Sender<Spooled>) -> Result<(), SpoolError> {
    let mut archive = tar::Archive::new(input);
    let mut buf = vec![0u8; CHUNK];
    let mut seen = std::collections::HashSet::new();
    for entry in archive
        .entries()
        .map_err(|e| SpoolError::Source(format!("the export is not a tar stream: {e}")))?
    {
        let mut entry = entry.map_err(|e| SpoolError::Source(format!("reading the next tar entry: {e}")))?;
        let meta =
            tarfmt::entry_meta(&mut entry).map_err(|e| SpoolError::Source(format!("reading a tar header: {e}")))?;
        if entry.header().entry_type() != tar::EntryType::Regular
            && entry.header().entry_type() != tar::EntryType::Continuous
        {
            return Err(SpoolError::Source(format!(
                "entry {:?} is not a regular file (cocoon exports are flat)",
                meta.name
            )));
        }
        if meta.name.contains('/') || meta.name.is_empty() {
            return Err(SpoolError::Source(format!(
                "entry {:?} is not a bare file name",
                meta.name
            )));
        }
        if !seen.insert(meta.name.clone()) {
            return Err(SpoolError::Source(format!("entry {:?} appears twice", meta.name)));
        }
        if meta.name == "snapshot.json" {
            let mut b = Vec::new();
            entry
                .by_ref()
                .take(manifest::MAX_CONFIG_BYTES)
                .read_to_end(&mut b)
                .map_err(|e| SpoolError::Source(format!("reading snapshot.json: {e}")))?;
            if tx.blocking_send(Spooled::Envelope(b)).is_err() {
                return Ok(()); // the uploader stopped; its error is reported
            }
            continue;
        }
        let mut file = tempfile::Builder::new()
            .prefix("vk-push-")
            .tempfile_in(dir)
            .map_err(|e| SpoolError::Spool(format!("creating a spool file in {}: {e}", dir.display())))?;
        let mut hasher = sha2::Sha256::new();
        let mut n = 0u64;
        loop {
            let k = entry
                .read(&mut buf)
                .map_err(|e| SpoolError::Source(format!("reading {} after {n} bytes: {e}", meta.name)))?;
            if k == 0 {
                break;
            }
            hasher.update(&buf[..k]);
            file.write_all(&buf[..k])
                .map_err(|e| SpoolError::Spool(format!("spooling {} to {}: {e}", meta.name, dir.display())))?;
            n += k as u64;
            if tx.is_closed() {
                return Ok(());
            }
        }
        if n != meta.size {
            return Err(SpoolError::Source(format!(
                "{}: {n} bytes instead of {}",
                meta.name, meta.size
            )));
        }
        file.flush()
            .map_err(|e| SpoolError::Spool(format!("spooling {}: {e}", meta.name)))?;
        let digest = format!("sha256:{}", hex::encode(hasher.finalize()));
        if tx.blocking_send(Spooled::File { meta, file, digest }).is_err() {
            return Ok(());
        }
    }
    // Drain to EOF: the export stream reports cocoon's exit status only there.
    std::io::copy(&mut archive.into_inner(), &mut std::io::sink())
        .map_err(|e| SpoolError::Source(format!("finishing the export stream: {e}")))?;
    Ok(())
}
