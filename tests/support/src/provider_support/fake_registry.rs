//! An in-memory `SnapshotRegistry` for the provider tests that do not need a real registry:
//! artifacts keyed by (repo, tag), injected unavailability, and a log of deletes.

use super::*;
use vk_cocoon::registry::PushLabels;

pub const SNAPSHOT_V1: &str = "application/vnd.cocoonstack.snapshot.v1+json";

struct Stored {
    artifact: Artifact,
    meta: SnapshotMeta,
    tar: Vec<u8>,
}

/// An in-memory OCI registry behind the provider's port, with fault knobs.
#[derive(Default)]
pub struct FakeRegistry {
    store: Mutex<HashMap<(String, String), Stored>>,
    /// Every call answers "unavailable".
    pub down: AtomicBool,
    /// The next N pushes fail.
    pub failing_pushes: AtomicU32,
    pub pulls: AtomicU32,
    /// Every manifest lookup so far, as `repo:tag` (the run path's classification of an image,
    /// the evidence lookups of `<vm>:hibernate`).
    pub manifest_lookups: Mutex<Vec<String>>,
    /// `repo:tag` → how many more of its manifest lookups fail as a registry answering 5xx would.
    pub failing_manifests: Mutex<HashMap<String, u32>>,
    pub pushes: Mutex<Vec<(String, String, String)>>,
    pub deletes: Mutex<Vec<(String, String)>>,
    /// Every tag that came (`true`: a push finished) or went (`false`), with when, on the
    /// simulator's monotonic clock: a crash test orders it with the simulator's journal.
    pub journal: Mutex<Vec<(u64, String, String, bool)>>,
}

impl FakeRegistry {
    fn check(&self) -> Result<(), RegistryError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(unavailable("registry.test", "connection refused"));
        }
        Ok(())
    }

    pub fn has(&self, repo: &str, tag: &str) -> bool {
        self.store.lock().unwrap().contains_key(&(repo.into(), tag.into()))
    }

    pub fn annotations(&self, repo: &str, tag: &str) -> Option<BTreeMap<String, String>> {
        self.store
            .lock()
            .unwrap()
            .get(&(repo.into(), tag.into()))
            .map(|s| s.artifact.annotations.clone())
    }
}

impl FakeRegistry {
    /// Seeds the fake as a daemon would push: `cocoon snapshot export <local>` into `repo:tag`.
    pub async fn push_snapshot(
        &self,
        rt: &dyn CocoonRuntime,
        local: &str,
        repo: &str,
        tag: &str,
        base_image: &str,
    ) -> Result<PushReport, TransferError> {
        Transfers::new().push(rt, self, local, repo, tag, base_image).await
    }
}

fn unavailable(artifact: &str, detail: &str) -> RegistryError {
    RegistryError::Unavailable {
        op: "talking to".into(),
        artifact: artifact.into(),
        registry: "registry.test".into(),
        detail: detail.into(),
        cause: None,
    }
}

/// The export tar's `snapshot.json` config (the fake's "config blob").
fn snapshot_meta_of(tar: &[u8]) -> Result<SnapshotMeta, String> {
    let mut a = tar::Archive::new(tar);
    for e in a.entries().map_err(|e| e.to_string())? {
        let mut e = e.map_err(|e| e.to_string())?;
        if e.path().map_err(|e| e.to_string())?.to_string_lossy() == "snapshot.json" {
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut b).map_err(|e| e.to_string())?;
            let v: serde_json::Value = serde_json::from_slice(&b).map_err(|e| e.to_string())?;
            let s = |k: &str| v["config"][k].as_str().unwrap_or_default().to_string();
            return Ok(SnapshotMeta {
                snapshot_id: s("id"),
                image: s("image"),
                hypervisor: s("hypervisor").into(),
            });
        }
    }
    Err("the export has no snapshot.json".into())
}

#[async_trait]
impl SnapshotRegistry for FakeRegistry {
    async fn manifest(&self, repo: &str, tag: &str) -> Result<Option<Artifact>, RegistryError> {
        let reference = format!("{repo}:{tag}");
        self.manifest_lookups.lock().unwrap().push(reference.clone());
        if let Some(left) = self
            .failing_manifests
            .lock()
            .unwrap()
            .get_mut(&reference)
            .filter(|n| **n > 0)
        {
            *left -= 1;
            return Err(unavailable(&reference, "503 Service Unavailable"));
        }
        self.check()?;
        Ok(self
            .store
            .lock()
            .unwrap()
            .get(&(repo.into(), tag.into()))
            .map(|s| s.artifact.clone()))
    }

    async fn snapshot_meta(&self, repo: &str, tag: &str) -> Result<Option<SnapshotMeta>, RegistryError> {
        self.check()?;
        Ok(self
            .store
            .lock()
            .unwrap()
            .get(&(repo.into(), tag.into()))
            .map(|s| s.meta.clone()))
    }

    async fn push_snapshot(
        &self,
        mut export: Box<dyn AsyncRead + Send + Unpin>,
        repo: &str,
        tag: &str,
        labels: PushLabels<'_>,
        progress: Arc<Progress>,
    ) -> Result<PushReport, RegistryError> {
        let base_image = labels.base_image;
        self.check()?;
        let artifact = format!("{repo}:{tag}");
        if self
            .failing_pushes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(unavailable(&artifact, "503 Service Unavailable"));
        }
        let mut tar = Vec::new();
        export.read_to_end(&mut tar).await.map_err(|e| RegistryError::Source {
            artifact: artifact.clone(),
            detail: e.to_string(),
            cause: Some(vk_cocoon::registry::errors::Cause::new(e)),
        })?;
        progress.advance(tar.len() as u64);
        let meta = snapshot_meta_of(&tar).map_err(|detail| RegistryError::Source {
            artifact: artifact.clone(),
            detail,
            cause: None,
        })?;
        let digest = format!("sha256:{}", tar.len());
        let stored = Artifact {
            digest: digest.clone(),
            artifact_type: SNAPSHOT_V1.into(),
            annotations: BTreeMap::from([
                ("cocoonstack.snapshot.baseimage".to_string(), base_image.to_string()),
                ("cocoonstack.snapshot.owner".to_string(), labels.owner.to_string()),
            ]),
        };
        let size = tar.len() as u64;
        self.store.lock().unwrap().insert(
            (repo.into(), tag.into()),
            Stored {
                artifact: stored,
                meta,
                tar,
            },
        );
        self.pushes
            .lock()
            .unwrap()
            .push((repo.into(), tag.into(), base_image.into()));
        self.journal
            .lock()
            .unwrap()
            .push((cocoon_sim::util::monotonic_ns(), repo.into(), tag.into(), true));
        Ok(PushReport {
            repo: repo.into(),
            tag: tag.into(),
            manifest_digest: digest,
            manifest_bytes: 0,
            total_size: size,
            file_bytes: size,
            layer_count: 1,
            uploaded_bytes: size,
            v2: false,
        })
    }

    async fn open_snapshot(&self, repo: &str, tag: &str) -> Result<SnapshotSource, RegistryError> {
        self.check()?;
        let store = self.store.lock().unwrap();
        let s = store
            .get(&(repo.into(), tag.into()))
            .ok_or_else(|| RegistryError::NotFound {
                artifact: format!("{repo}:{tag}"),
                registry: "registry.test".into(),
                detail: String::new(),
            })?;
        Ok(SnapshotSource::described(
            repo,
            tag,
            &s.artifact.digest,
            &s.meta.snapshot_id,
            s.tar.len() as u64,
        ))
    }

    async fn write_snapshot(
        &self,
        src: &SnapshotSource,
        local_name: &str,
        sink: &mut (dyn AsyncWrite + Send + Unpin),
        progress: &Progress,
    ) -> Result<PullReport, RegistryError> {
        self.check()?;
        let tar = self
            .store
            .lock()
            .unwrap()
            .get(&(src.repo.clone(), src.tag.clone()))
            .map(|s| s.tar.clone())
            .ok_or_else(|| RegistryError::NotFound {
                artifact: format!("{}:{}", src.repo, src.tag),
                registry: "registry.test".into(),
                detail: " (deleted during the pull)".into(),
            })?;
        self.pulls.fetch_add(1, Ordering::SeqCst);
        sink.write_all(&tar).await.map_err(|e| RegistryError::Sink {
            artifact: format!("{}:{}", src.repo, src.tag),
            detail: e.to_string(),
            cause: Some(vk_cocoon::registry::errors::Cause::new(e)),
        })?;
        progress.advance(tar.len() as u64);
        Ok(PullReport {
            repo: src.repo.clone(),
            tag: src.tag.clone(),
            local_name: local_name.into(),
            manifest_digest: src.manifest_digest.clone(),
            snapshot_id: src.snapshot_id.clone(),
            tar_bytes: tar.len() as u64,
            layer_count: 1,
            shared: false,
        })
    }

    async fn open_cloud_image(&self, _reference: &str) -> Result<Option<CloudImageSource>, RegistryError> {
        self.check()?;
        Ok(None)
    }

    async fn write_cloud_image(
        &self,
        src: &CloudImageSource,
        _sink: &mut (dyn AsyncWrite + Send + Unpin),
        _progress: &Progress,
    ) -> Result<u64, RegistryError> {
        Err(RegistryError::InvalidRequest(format!(
            "the fake registry holds no cloud image {}",
            src.local_name
        )))
    }

    async fn delete_manifest(&self, repo: &str, tag: &str) -> Result<(), RegistryError> {
        self.check()?;
        // Stamped before the tag goes: the journal never shows it longer than it was there.
        let at = cocoon_sim::util::monotonic_ns();
        self.store.lock().unwrap().remove(&(repo.into(), tag.into()));
        self.deletes.lock().unwrap().push((repo.into(), tag.into()));
        self.journal.lock().unwrap().push((at, repo.into(), tag.into(), false));
        Ok(())
    }
}
