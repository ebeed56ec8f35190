//! The live policies of all slots. Each slot holds its current policy behind an atomic pointer:
//! a reload swaps it without pausing decisions, and a decision in flight finishes on the
//! policy it started with.

use std::sync::Arc;
use std::time::Instant;

use tracing::{info, warn};

use super::cache::CompileCache;
use super::decision_log::DecisionLog;
use super::engine::PolicyEngine;
use super::error::{DecisionError, LoadError};
use super::loaded::LoadedPolicy;
use super::metrics::PolicyMetrics;
use super::slots::{PolicySlot, Slot, SlotCells, SlotVisitor, with_slot};
use super::status::{ActivePolicy, StatusBoard};

/// Every slot's current policy, and the engine they run on.
pub struct Policies {
    engine: PolicyEngine,
    cache: Option<CompileCache>,
    cells: SlotCells,
    metrics: PolicyMetrics,
    status: Arc<StatusBoard>,
    /// `VK_DECISION_LOG`; `None` (off) costs a decision one branch.
    log: Option<DecisionLog>,
}

impl Policies {
    /// Every slot on its built-in default.
    pub fn with_defaults(
        engine: PolicyEngine,
        cache: Option<CompileCache>,
        metrics: PolicyMetrics,
    ) -> Result<Self, LoadError> {
        let cells = SlotCells::builtin(&engine, cache.as_ref())?;
        let policies = Policies {
            engine,
            cache,
            cells,
            metrics,
            status: Arc::new(StatusBoard::default()),
            log: None,
        };
        for slot in Slot::ALL {
            policies.metrics.set_active(slot, &policies.digest(slot));
            policies.status.set_active(slot, policies.active(slot));
        }
        Ok(policies)
    }

    /// Logs every decision to `log` (one JSON line each), its dropped records counted in the
    /// policy metrics.
    pub fn with_decision_log(mut self, log: Option<DecisionLog>) -> Self {
        if let Some(log) = &log {
            log.count_drops_in(self.metrics.decision_log_dropped());
        }
        self.log = log;
        self
    }

    /// The decision log, when it is on.
    pub fn decision_log(&self) -> Option<&DecisionLog> {
        self.log.as_ref()
    }

    /// Waits until every decision so far is in the decision log (when it is on).
    pub fn flush_decision_log(&self) {
        if let Some(log) = &self.log {
            log.flush();
        }
    }

    pub fn engine(&self) -> &PolicyEngine {
        &self.engine
    }

    pub fn cache(&self) -> Option<&CompileCache> {
        self.cache.as_ref()
    }

    pub fn metrics(&self) -> &PolicyMetrics {
        &self.metrics
    }

    /// What the node runs, for the cluster to see.
    pub fn status(&self) -> &Arc<StatusBoard> {
        &self.status
    }

    /// The policy currently serving `S`.
    pub fn current<S: PolicySlot>(&self) -> Arc<LoadedPolicy<S>> {
        S::cell(&self.cells).load_full()
    }

    /// The digest of the component serving `slot`.
    pub fn digest(&self, slot: Slot) -> String {
        struct Digest<'a>(&'a Policies);
        impl SlotVisitor for Digest<'_> {
            type Output = String;
            fn visit<S: PolicySlot>(self) -> String {
                self.0.current::<S>().digest().to_string()
            }
        }
        with_slot(slot, Digest(self))
    }

    /// The component serving `slot`: digest, source and contract version.
    pub fn active(&self, slot: Slot) -> ActivePolicy {
        struct Active<'a>(&'a Policies);
        impl SlotVisitor for Active<'_> {
            type Output = ActivePolicy;
            fn visit<S: PolicySlot>(self) -> ActivePolicy {
                active_of(&self.0.current::<S>())
            }
        }
        with_slot(slot, Active(self))
    }

    /// Makes `policy` serve its slot from the next decision on; returns the one it replaces.
    pub fn install<S: PolicySlot>(&self, policy: LoadedPolicy<S>) -> Arc<LoadedPolicy<S>> {
        info!(slot = %S::SLOT, origin = %policy.origin(), digest = policy.digest(), contract = %policy.version(), "policy installed");
        self.metrics.set_active(S::SLOT, policy.digest());
        self.status.set_active(S::SLOT, active_of(&policy));
        S::cell(&self.cells).swap(Arc::new(policy))
    }

    /// Runs a decision on the slot's current policy. A failed policy yields the slot's
    /// fail-safe decision (never a permissive one), logged and counted.
    pub fn decide<S: PolicySlot>(&self, facts: &S::Facts) -> S::Decision {
        let slot = S::SLOT;
        let policy = self.current::<S>();
        let started = Instant::now();
        let mut result = policy.decide(&self.engine, facts);
        if let Err(DecisionError::Timeout { .. }) = result {
            // The deadline counts the deciding thread's CPU time, but a decision starved of a
            // core past the wall cap is stopped too. Decisions are pure, so one retry on a
            // fresh instance is safe; a policy that really loops costs two deadlines and then
            // fails safe.
            warn!(%slot, origin = %policy.origin(), "policy missed its deadline; retrying once");
            self.metrics.count_failure(slot, "timeout_retried");
            result = policy.decide(&self.engine, facts);
        }
        let elapsed = started.elapsed();
        self.metrics.observe_latency(slot, elapsed);
        let (decision, failure) = match result {
            Ok(decision) => (decision, None),
            Err(error) => {
                warn!(%slot, origin = %policy.origin(), %error, rule = S::FAIL_SAFE_RULE, "policy failed; taking the fail-safe decision");
                self.metrics.count_failure(slot, error.metric_label());
                (S::fail_safe(facts, fail_safe_message::<S>(&error)), Some(error))
            }
        };
        self.metrics.count_decision(slot, S::summary(&decision).outcome);
        if let Some(log) = &self.log {
            log.decision(&policy, facts, &decision, failure.as_ref(), elapsed);
        }
        decision
    }
}

fn active_of<S: PolicySlot>(policy: &LoadedPolicy<S>) -> ActivePolicy {
    ActivePolicy {
        digest: format!("sha256:{}", policy.digest()),
        source: policy.origin().source(),
        contract: policy.version().to_string(),
    }
}

/// The message of a fail-safe decision: what failed and what the host does instead.
pub fn fail_safe_message<S: PolicySlot>(error: &DecisionError) -> String {
    format!("policy {} failed ({error}); fail-safe: {}", S::SLOT, S::FAIL_SAFE_RULE)
}
