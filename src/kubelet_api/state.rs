//! What every route shares.

use std::sync::Arc;

use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use tokio_util::sync::CancellationToken;

use super::source::PodSource;
use super::streaming::Streaming;
use crate::runtime::CocoonRuntime;
use crate::stats::{HostPaths, Sampler};

/// `cocoon_vk_kubelet_api_*`: requests by endpoint and status, follows and streaming
/// sessions in flight.
#[derive(Clone)]
pub struct ApiMetrics {
    pub requests: IntCounterVec,
    pub log_follows: IntGauge,
    /// Open exec / attach / portforward sessions, by `kind`.
    pub streams: IntGaugeVec,
}

impl ApiMetrics {
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
        })
    }

    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = Self::build()?;
        registry.register(Box::new(m.requests.clone()))?;
        registry.register(Box::new(m.log_follows.clone()))?;
        registry.register(Box::new(m.streams.clone()))?;
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
