//! What every route shares.

use std::sync::Arc;

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio_util::sync::CancellationToken;

use super::source::PodSource;
use super::streaming::Streaming;
use crate::runtime::CocoonRuntime;
use crate::stats::{HostPaths, Sampler};

/// `cocoon_vk_kubelet_api_*`: requests by endpoint and status, follows and streaming
/// sessions in flight, panics caught.
#[derive(Clone)]
pub struct ApiMetrics {
    pub requests: IntCounterVec,
    pub log_follows: IntGauge,
    /// Open exec / attach / portforward sessions, by `kind`.
    pub streams: IntGaugeVec,
    /// Panics caught instead of ending a connection silently, by `where`: `handler` (a
    /// request's handler, answered 500) or `session` (a task of an upgraded session, which
    /// ends it).
    pub panics: IntCounterVec,
}

impl ApiMetrics {
    /// The counter of panics caught in streaming sessions' tasks.
    pub fn session_panics(&self) -> prometheus::IntCounter {
        self.panics.with_label_values(&["session"])
    }

    fn build() -> prometheus::Result<Self> {
        Ok(Self {
            requests: IntCounterVec::new(
                Opts::new("requests_total", "Kubelet API requests by endpoint and HTTP status.")
                    .namespace("cocoon")
                    .subsystem("vk_kubelet_api"),
                &["endpoint", "code"],
            )?,
            log_follows: IntGauge::with_opts(
                Opts::new("log_follows", "Log streams (follow=true) being served.")
                    .namespace("cocoon")
                    .subsystem("vk_kubelet_api"),
            )?,
            streams: IntGaugeVec::new(
                Opts::new("streams", "Open exec, attach and port-forward sessions.")
                    .namespace("cocoon")
                    .subsystem("vk_kubelet_api"),
                &["kind"],
            )?,
            panics: IntCounterVec::new(
                Opts::new(
                    "panics_total",
                    "Panics caught in the kubelet API (a handler answered 500, or a streaming session ended), by where.",
                )
                .namespace("cocoon")
                .subsystem("vk_kubelet_api"),
                &["where"],
            )?,
        })
    }

    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self::build()?;
        registry.register(Box::new(m.requests.clone()))?;
        registry.register(Box::new(m.log_follows.clone()))?;
        registry.register(Box::new(m.streams.clone()))?;
        registry.register(Box::new(m.panics.clone()))?;
        Ok(m)
    }

    pub fn unregistered() -> Self {
        Self::build().expect("metric definitions are valid")
    }
}

pub struct ApiState {
    pub node_name: String,
    pub pods: Arc<dyn PodSource>,
    pub runtime: Arc<dyn CocoonRuntime>,
    pub sampler: Arc<Sampler>,
    pub paths: HostPaths,
    pub metrics: ApiMetrics,
    /// exec / attach / port-forward: limits, session cap, console locks.
    pub streaming: Streaming,
    /// Ends streaming responses when the daemon stops.
    pub shutdown: CancellationToken,
}
