//! The provider's ports: what it needs from the registry, cocoon-net and the apiserver, as small
//! object-safe traits. Production adapters live next to their systems; tests use in-memory fakes.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::kubelet::{EventReason, EventType, ProviderPodStatus};
use crate::registry::{CloudImageSource, Progress, PullReport, PushLabels, PushReport, RegistryError, SnapshotSource};

/// A manifest's identity: artifact type and annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Artifact {
    pub digest: String,
    pub artifact_type: String,
    pub annotations: BTreeMap<String, String>,
}

/// The snapshot config blob fields the provider reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotMeta {
    pub snapshot_id: String,
    pub image: String,
    pub hypervisor: crate::hypervisor::Hypervisor,
}

/// What a cloud-image ensure did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudImageResult {
    /// Imported (or already present) under this local name.
    Imported(String),
    /// The ref is not a cloud image: pull it the ordinary way.
    NotACloudImage,
}

/// The OCI registry operations the provider uses (the snapshot repo is the VM name). A pure adapter:
/// pushes read a snapshot export from a reader, pulls write an import stream into a writer; running
/// `cocoon snapshot export / import` is `transfer`'s job. Errors are typed ([`RegistryError`]).
#[async_trait]
pub trait SnapshotRegistry: Send + Sync {
    /// `Ok(None)` only for the typed "tag absent".
    async fn manifest(&self, repo: &str, tag: &str) -> Result<Option<Artifact>, RegistryError>;
    /// The config of a snapshot artifact; `Ok(None)` when the tag is absent.
    async fn snapshot_meta(&self, repo: &str, tag: &str) -> Result<Option<SnapshotMeta>, RegistryError>;
    /// What `repo:tag` says its snapshot is — its config (snapshot id, the `snapshot.json`
    /// envelope) and each file's size, sparse map and blob digests — from one resolution of the
    /// tag: what a peer restore checks its peer's copy against. `Ok(None)` when the tag is
    /// absent, or when this adapter cannot say (the wake then skips the peer tier).
    async fn snapshot_content(
        &self,
        repo: &str,
        tag: &str,
    ) -> Result<Option<crate::registry::content::SnapshotContent>, RegistryError> {
        let _ = (repo, tag);
        Ok(None)
    }
    /// Uploads the export tar (`snapshot export -o -`) read from `export` as `repo:tag`, recording
    /// the `labels`.
    async fn push_snapshot(
        &self,
        export: Box<dyn AsyncRead + Send + Unpin>,
        repo: &str,
        tag: &str,
        labels: PushLabels<'_>,
        progress: Arc<Progress>,
    ) -> Result<PushReport, RegistryError>;
    /// Resolves `repo:tag` for a pull, before anything is imported (`NotFound` when the tag is absent).
    async fn open_snapshot(&self, repo: &str, tag: &str) -> Result<SnapshotSource, RegistryError>;
    /// Writes the import tar (for `snapshot import`) of `src`, its snapshot named `local_name`, into `sink`.
    async fn write_snapshot(
        &self,
        src: &SnapshotSource,
        local_name: &str,
        sink: &mut (dyn AsyncWrite + Send + Unpin),
        progress: &Progress,
    ) -> Result<PullReport, RegistryError>;
    /// Resolves a run image: `None` when it is not a cloud image (pull it the ordinary way).
    async fn open_cloud_image(&self, reference: &str) -> Result<Option<CloudImageSource>, RegistryError>;
    /// Writes the disk bytes of `src` into `sink`.
    async fn write_cloud_image(
        &self,
        src: &CloudImageSource,
        sink: &mut (dyn AsyncWrite + Send + Unpin),
        progress: &Progress,
    ) -> Result<u64, RegistryError>;
    /// Deletes the tag `repo:tag` (an absent tag counts as deleted).
    async fn delete_manifest(&self, repo: &str, tag: &str) -> Result<(), RegistryError>;
}

/// A cocoon-net lease lookup failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    #[error("no cocoon-net lease for the requested MAC")]
    NoLease,
    /// The file could not be read or parsed: the io or JSON error is kept as the source.
    #[error("reading the cocoon-net lease file: {}: {cause}", path.display())]
    Unreadable {
        path: std::path::PathBuf,
        #[source]
        cause: crate::registry::errors::Cause,
    },
}

/// IP by MAC from cocoon-net's lease file.
pub trait LeaseSource: Send + Sync {
    fn lookup(&self, mac: &str) -> Result<String, LeaseError>;
}

/// Why a lease release through cocoon-net's control socket failed (best-effort: the lease then
/// runs out on its own).
#[derive(Debug, thiserror::Error)]
pub enum ReleaseError {
    #[error("invalid MAC address {0:?}")]
    InvalidMac(String),
    #[error("connect {}: {source} (is cocoon-net ≥ v0.2.2 running?)", path.display())]
    Connect {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("write: {0}")]
    Write(#[source] std::io::Error),
    #[error("read: {0}")]
    Read(#[source] std::io::Error),
    #[error("malformed response from cocoon-net: {0:?}")]
    Malformed(String),
    #[error("release lease {mac}: timed out after {after:?}")]
    TimedOut { mac: String, after: std::time::Duration },
    #[error("release lease {mac}: cocoon-net answered HTTP {code}")]
    Refused { mac: String, code: u16 },
    #[error("release lease {mac}: cocoon-net answered HTTP 500 twice")]
    FailedTwice { mac: String },
}

/// Releases DHCP leases through cocoon-net's control socket (best-effort).
#[async_trait]
pub trait LeaseReleaser: Send + Sync {
    async fn release(&self, mac: &str) -> Result<(), ReleaseError>;
}

/// How a conditional write on the pod ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchOutcome {
    Applied,
    /// The incarnation is gone (NotFound, uid Conflict, Invalid): never retried.
    Superseded(String),
}

/// Writes on the pod, always conditioned on its uid. An `Err` is the apiserver's answer when it
/// is neither success nor a superseded incarnation (retry later).
#[async_trait]
pub trait PodPatcher: Send + Sync {
    /// Sets (`Some`) or removes (`None`) annotations.
    async fn patch_annotations(
        &self,
        pod: &Pod,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<PatchOutcome, kube::Error>;
    /// Publishes the pod status (used to land the status before `lifecycle-state=ready`).
    async fn patch_status(&self, pod: &Pod, status: &ProviderPodStatus) -> Result<PatchOutcome, kube::Error>;
    /// Deletes the pod (graceful, uid precondition): an eviction. NotFound is `Superseded`.
    async fn delete_pod(&self, pod: &Pod) -> Result<PatchOutcome, kube::Error>;
    /// The pod as the apiserver has it now; `None` when it is gone or another incarnation owns the name.
    async fn get_pod(&self, pod: &Pod) -> Result<Option<Pod>, kube::Error>;
}

/// Kubernetes Events about a pod.
pub trait EventRecorder: Send + Sync {
    fn record(&self, pod: &Pod, type_: EventType, reason: EventReason, note: String);
}

/// Notifies the virtual node that a pod's status changed.
pub trait StatusNotifier: Send + Sync {
    fn notify(&self, key: &str);

    /// Asks the pod controller to call [`crate::kubelet::Provider::requeue_pod`] for the pod after
    /// the next wait of `after` (work owed outside a pod operation: a resumed hibernate).
    fn requeue(&self, key: &str, after: crate::retry::Schedule);
}

impl StatusNotifier for crate::kubelet::Notifier {
    fn notify(&self, key: &str) {
        crate::kubelet::Notifier::notify(self, key);
    }

    fn requeue(&self, key: &str, after: crate::retry::Schedule) {
        crate::kubelet::Notifier::requeue(self, key, Some(after));
    }
}

// ---- production adapters for the apiserver ------------------------------------------------

/// Uid-conditioned writes through `kubelet::status`.
pub struct KubePodPatcher {
    client: kube::Client,
}

impl KubePodPatcher {
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    fn api(&self, pod: &Pod) -> kube::Api<Pod> {
        kube::Api::namespaced(
            self.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or("default"),
        )
    }
}

fn outcome(r: Result<crate::kubelet::status::WriteOutcome, kube::Error>) -> Result<PatchOutcome, kube::Error> {
    match r {
        Ok(crate::kubelet::status::WriteOutcome::Applied(_)) => Ok(PatchOutcome::Applied),
        Ok(crate::kubelet::status::WriteOutcome::Superseded { code, message }) => {
            Ok(PatchOutcome::Superseded(format!("{code}: {message}")))
        }
        Err(e) => Err(e),
    }
}

#[async_trait]
impl PodPatcher for KubePodPatcher {
    async fn patch_annotations(
        &self,
        pod: &Pod,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<PatchOutcome, kube::Error> {
        outcome(crate::kubelet::status::patch_annotations(&self.api(pod), pod, changes).await)
    }

    async fn patch_status(&self, pod: &Pod, status: &ProviderPodStatus) -> Result<PatchOutcome, kube::Error> {
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
        let built = crate::kubelet::status::build_pod_status(pod, status, &now);
        outcome(crate::kubelet::status::publish_status(&self.api(pod), pod, &built).await)
    }

    async fn delete_pod(&self, pod: &Pod) -> Result<PatchOutcome, kube::Error> {
        let params = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        match self
            .api(pod)
            .delete(pod.metadata.name.as_deref().unwrap_or_default(), &params)
            .await
        {
            Ok(_) => Ok(PatchOutcome::Applied),
            Err(e) => match crate::kubelet::status::superseded(&e) {
                Some((code, message)) => Ok(PatchOutcome::Superseded(format!("{code}: {message}"))),
                None => Err(e),
            },
        }
    }

    async fn get_pod(&self, pod: &Pod) -> Result<Option<Pod>, kube::Error> {
        match self
            .api(pod)
            .get_opt(pod.metadata.name.as_deref().unwrap_or_default())
            .await
        {
            Ok(Some(current)) if current.metadata.uid == pod.metadata.uid => Ok(Some(current)),
            Ok(_) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl EventRecorder for crate::kubelet::events::EventSink {
    fn record(&self, pod: &Pod, type_: EventType, reason: EventReason, note: String) {
        crate::kubelet::events::EventSink::record(self, pod, type_, reason, "Sync", note);
    }
}
