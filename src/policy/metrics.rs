//! Prometheus metrics of the policy engine (`cocoon_vk_policy_*`).

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::slots::Slot;

/// Decision counts, failures, latency and reloads per slot.
#[derive(Clone)]
pub struct PolicyMetrics {
    decisions: IntCounterVec,
    failures: IntCounterVec,
    latency: HistogramVec,
    reloads: IntCounterVec,
    active: IntGaugeVec,
    decision_log_dropped: IntCounter,
}

impl PolicyMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let opts = |name: &str, help: &str| Opts::new(name, help).namespace("cocoon").subsystem("vk");
        let metrics = PolicyMetrics {
            decisions: IntCounterVec::new(
                opts(
                    "policy_decisions_total",
                    "Policy decisions by slot and outcome (a closed set per slot: admit, reject, refuse, clone, run, ...); fail-safe decisions count under their outcome and in policy_failures_total",
                ),
                &["slot", "outcome"],
            )?,
            failures: IntCounterVec::new(
                opts(
                    "policy_failures_total",
                    "Policy decisions that failed (timeout, out_of_memory, trap, invalid_decision, instantiate)",
                ),
                &["slot", "error"],
            )?,
            latency: HistogramVec::new(
                HistogramOpts::new(
                    "policy_decision_seconds",
                    "Wall time of one policy decision, instantiation included",
                )
                .namespace("cocoon")
                .subsystem("vk")
                .buckets(vec![10e-6, 20e-6, 50e-6, 100e-6, 250e-6, 1e-3, 5e-3, 25e-3, 100e-3]),
                &["slot"],
            )?,
            reloads: IntCounterVec::new(
                opts(
                    "policy_reloads_total",
                    "Policy file reloads by slot and result (ok, or why the new version was refused)",
                ),
                &["slot", "result"],
            )?,
            active: IntGaugeVec::new(
                opts(
                    "policy_active_info",
                    "1 for the component digest currently serving each slot",
                ),
                &["slot", "digest"],
            )?,
            decision_log_dropped: IntCounter::with_opts(opts(
                "policy_decision_log_dropped_total",
                "Decision records the decision log dropped because its queue was full (the disk could not keep up); decisions are never slowed by the log",
            ))?,
        };
        registry.register(Box::new(metrics.decisions.clone()))?;
        registry.register(Box::new(metrics.failures.clone()))?;
        registry.register(Box::new(metrics.latency.clone()))?;
        registry.register(Box::new(metrics.reloads.clone()))?;
        registry.register(Box::new(metrics.active.clone()))?;
        registry.register(Box::new(metrics.decision_log_dropped.clone()))?;
        Ok(metrics)
    }

    /// Metrics registered nowhere (CLI tools, tests).
    pub fn unregistered() -> Self {
        Self::register(&Registry::new()).expect("fresh registry accepts the policy metrics")
    }

    pub(crate) fn decision_log_dropped(&self) -> IntCounter {
        self.decision_log_dropped.clone()
    }

    pub(crate) fn count_decision(&self, slot: Slot, outcome: &'static str) {
        self.decisions.with_label_values(&[slot.name(), outcome]).inc();
    }

    pub(crate) fn count_failure(&self, slot: Slot, error: &'static str) {
        self.failures.with_label_values(&[slot.name(), error]).inc();
    }

    pub(crate) fn observe_latency(&self, slot: Slot, elapsed: Duration) {
        self.latency
            .with_label_values(&[slot.name()])
            .observe(elapsed.as_secs_f64());
    }

    pub(crate) fn count_reload(&self, slot: Slot, result: &'static str) {
        self.reloads.with_label_values(&[slot.name(), result]).inc();
    }

    pub(crate) fn set_active(&self, slot: Slot, digest: &str) {
        // One series per slot: drop the previous digest's.
        for metric in prometheus::core::Collector::collect(&self.active) {
            for m in metric.get_metric() {
                let labels = m.get_label();
                let is_slot = labels.iter().any(|l| l.name() == "slot" && l.value() == slot.name());
                if let (true, Some(old)) = (is_slot, labels.iter().find(|l| l.name() == "digest")) {
                    let _ = self.active.remove_label_values(&[slot.name(), old.value()]);
                }
            }
        }
        self.active.with_label_values(&[slot.name(), digest]).set(1);
    }

    /// Count of decisions for (slot, outcome), for tests and reports.
    pub fn decisions(&self, slot: Slot, outcome: &str) -> u64 {
        self.decisions.with_label_values(&[slot.name(), outcome]).get()
    }

    /// Count of failures for (slot, error label).
    pub fn failures(&self, slot: Slot, error: &str) -> u64 {
        self.failures.with_label_values(&[slot.name(), error]).get()
    }

    /// Count of reloads for (slot, result).
    pub fn reloads(&self, slot: Slot, result: &str) -> u64 {
        self.reloads.with_label_values(&[slot.name(), result]).get()
    }
}
