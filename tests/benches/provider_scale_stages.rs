//! The per-stage profile of CreatePod for `provider_scale`: when, from the create's entry, each
//! of its stages starts and ends. Three sources feed one recorder:
//!
//! - the provider's own stage spans (`create.*`, `bring_up.*`, `boot.*`, `policy.*` (debug level; a span's creation is its start, its close
//!   its end), through the [`StageLayer`] tracing layer installed by the bench;
//! - each cocoon CLI call, from the bench's timed runtime;
//! - each apiserver write, from the bench's [`TimedPatcher`] around the real patcher.
//!
//! The profiled creates run one at a time, after every earlier pod's Ready was published
//! ([`until_ready_count`]), and each waits until its own Ready is published before the next
//! starts: every cocoon call and stage span recorded while one is [`active`] is its own (the
//! guest work a create leaves behind in the background included: it is what publishes Ready).
//! Apiserver writes are recorded for its pod only.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Pod;
use tracing::span::{Attributes, Id};
use tracing::{Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context, Filter, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use vk_cocoon::kubelet::ProviderPodStatus;
use vk_cocoon::provider::ports::{PatchOutcome, PodPatcher};

/// One stage of one create: its label and its start and end, from the create's entry.
#[derive(Debug, Clone)]
pub struct Mark {
    pub label: String,
    pub start: Duration,
    pub end: Duration,
}

/// What one profiled create recorded.
pub struct Recorder {
    /// The pod's name.
    pod: String,
    entry: Instant,
    marks: Mutex<Vec<Mark>>,
    ready: tokio::sync::Notify,
}

impl Recorder {
    pub fn new(pod: &str) -> Arc<Self> {
        Arc::new(Self {
            pod: pod.to_string(),
            entry: Instant::now(),
            marks: Mutex::new(Vec::new()),
            ready: tokio::sync::Notify::new(),
        })
    }
    pub fn now(&self) -> Duration {
        self.entry.elapsed()
    }
    pub fn push(&self, label: impl Into<String>, start: Duration, end: Duration) {
        self.marks.lock().unwrap().push(Mark {
            label: label.into(),
            start,
            end,
        });
    }
    pub fn marks(&self) -> Vec<Mark> {
        self.marks.lock().unwrap().clone()
    }
    /// Returns once the `ready` lifecycle annotation landed (the pod's Ready published).
    pub async fn until_ready(&self) {
        self.ready.notified().await;
    }
}

/// How many `lifecycle-state=ready` writes landed, of any pod.
static READY_WRITES: LazyLock<tokio::sync::watch::Sender<usize>> = LazyLock::new(|| tokio::sync::watch::channel(0).0);

/// Returns once `n` `lifecycle-state=ready` writes were made (of any pod).
pub async fn until_ready_count(n: usize) {
    let mut seen = READY_WRITES.subscribe();
    seen.wait_for(|c| *c >= n)
        .await
        .expect("the counter lives as long as the process");
}

/// The create being profiled (none outside the profile pass: nothing is recorded then).
static ACTIVE: Mutex<Option<Arc<Recorder>>> = Mutex::new(None);

pub fn active() -> Option<Arc<Recorder>> {
    ACTIVE.lock().unwrap().clone()
}

pub fn set_active(rec: Option<Arc<Recorder>>) {
    *ACTIVE.lock().unwrap() = rec;
}

/// Records a future's run as a stage of the active create.
pub async fn timed<T>(label: impl FnOnce() -> String, f: impl std::future::Future<Output = T>) -> T {
    let Some(rec) = active() else { return f.await };
    let start = rec.now();
    let r = f.await;
    rec.push(label(), start, rec.now());
    r
}

/// The provider's stage spans: `create.*`, `bring_up.*`, `boot.*` and `policy.*` (see
/// `src/provider/create.rs`).
fn is_stage(meta: &Metadata<'_>) -> bool {
    const PREFIXES: [&str; 4] = ["create.", "bring_up.", "boot.", "policy."];
    meta.is_span() && meta.target().starts_with("vk_cocoon") && PREFIXES.iter().any(|p| meta.name().starts_with(p))
}

/// Only the stage spans reach the layer (every other callsite of the process is never asked
/// again), and only while a create is profiled.
struct StageFilter;

impl<S> Filter<S> for StageFilter {
    fn enabled(&self, meta: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        is_stage(meta) && ACTIVE.lock().unwrap().is_some()
    }
    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        if is_stage(meta) {
            tracing::subscriber::Interest::sometimes()
        } else {
            tracing::subscriber::Interest::never()
        }
    }
}

struct Open {
    rec: Arc<Recorder>,
    label: &'static str,
    start: Duration,
}

/// Records each stage span of the active create from its creation to its close.
struct StageLayer;

impl<S> Layer<S> for StageLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let (Some(rec), Some(span)) = (active(), ctx.span(id)) else {
            return;
        };
        let start = rec.now();
        span.extensions_mut().insert(Open {
            rec,
            label: attrs.metadata().name(),
            start,
        });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        if let Some(open) = span.extensions_mut().remove::<Open>() {
            open.rec.push(open.label, open.start, open.rec.now());
        }
    }
}

/// Installs the stage layer as the process's subscriber (before anything logs).
pub fn install() {
    let subscriber = tracing_subscriber::registry().with(StageLayer.with_filter(StageFilter));
    tracing::subscriber::set_global_default(subscriber).expect("no other subscriber in the bench");
}

/// The real patcher, each write recorded as a stage of the active create.
pub struct TimedPatcher(pub Arc<dyn PodPatcher>);

/// A write's label: the lifecycle state it sets, else the annotation keys it touches.
fn annotations_label(changes: &BTreeMap<String, Option<String>>) -> String {
    if let Some(Some(state)) = changes.get("vm.cocoonstack.io/lifecycle-state") {
        return format!("apiserver: lifecycle-state={state}");
    }
    let keys: Vec<&str> = changes.keys().map(|k| k.rsplit('/').next().unwrap_or(k)).collect();
    format!("apiserver: annotations {}", keys.join("+"))
}

#[async_trait]
impl PodPatcher for TimedPatcher {
    async fn patch_annotations(
        &self,
        pod: &Pod,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<PatchOutcome, kube::Error> {
        let label = annotations_label(changes);
        let ready = label.ends_with("=ready");
        let rec = active().filter(|rec| pod.metadata.name.as_deref() == Some(rec.pod.as_str()));
        let Some(rec) = rec else {
            let r = self.0.patch_annotations(pod, changes).await;
            if ready {
                READY_WRITES.send_modify(|c| *c += 1);
            }
            return r;
        };
        let start = rec.now();
        let r = self.0.patch_annotations(pod, changes).await;
        rec.push(label, start, rec.now());
        if ready {
            READY_WRITES.send_modify(|c| *c += 1);
            rec.ready.notify_one();
        }
        r
    }
    async fn patch_status(&self, pod: &Pod, status: &ProviderPodStatus) -> Result<PatchOutcome, kube::Error> {
        let rec = active().filter(|rec| pod.metadata.name.as_deref() == Some(rec.pod.as_str()));
        let Some(rec) = rec else {
            return self.0.patch_status(pod, status).await;
        };
        let start = rec.now();
        let r = self.0.patch_status(pod, status).await;
        rec.push("apiserver: status", start, rec.now());
        r
    }
    async fn delete_pod(&self, pod: &Pod) -> Result<PatchOutcome, kube::Error> {
        self.0.delete_pod(pod).await
    }
    async fn get_pod(&self, pod: &Pod) -> Result<Option<Pod>, kube::Error> {
        self.0.get_pod(pod).await
    }
}

/// One row of the profile: a stage and its p50 start, end and duration over the creates that
/// had it.
pub struct Row {
    pub label: String,
    pub per_create: f64,
    pub start: Duration,
    pub end: Duration,
    pub took: Duration,
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The rows of `creates` (one recorder's marks each), in the order of their p50 start. A stage
/// that repeats within a create is numbered (`#2`, ...) in its order of start.
pub fn rows(creates: &[Vec<Mark>]) -> Vec<Row> {
    let mut by_label: BTreeMap<String, Vec<&Mark>> = BTreeMap::new();
    for marks in creates {
        let mut marks: Vec<&Mark> = marks.iter().collect();
        marks.sort_by_key(|m| m.start);
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for m in marks {
            let n = seen.entry(m.label.as_str()).or_default();
            *n += 1;
            let label = if *n == 1 {
                m.label.clone()
            } else {
                format!("{} #{n}", m.label)
            };
            by_label.entry(label).or_default().push(m);
        }
    }
    let mut rows: Vec<Row> = by_label
        .into_iter()
        .map(|(label, ms)| Row {
            label,
            per_create: ms.len() as f64 / creates.len() as f64,
            start: p50(ms.iter().map(|m| m.start).collect()),
            end: p50(ms.iter().map(|m| m.end).collect()),
            took: p50(ms.iter().map(|m| m.end - m.start).collect()),
        })
        .collect();
    rows.sort_by_key(|r| (r.start, r.end));
    rows
}
