//! The thin I/O driver of the pod controller: pumps the pod watch into the sans-I/O core
//! ([`super::pods`]) and executes its actions on a bounded worker pool.

use super::config::Timings;
use super::events::EventSink;
use super::pod_copy;
use super::pods::{Action, CoreConfig, Input, OpKind, OpOutcome, PodKey, PodState, Rejection, Uid};
use super::provider::{Next, Provider, ProviderError, ProviderPodStatus};
use super::status::{WriteOutcome, build_pod_status, publish_status, superseded};
use crate::retry::Schedule;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::time::DelayQueue;

/// Lets the provider ask for a pod's status to be republished (its async `NotifyPods`).
#[derive(Clone, Debug)]
pub struct Notifier {
    tx: mpsc::UnboundedSender<Input>,
}

impl Notifier {
    /// Re-reads the provider's status of pod `namespace/name` and publishes it.
    pub fn notify(&self, key: impl Into<PodKey>) {
        let _ = self.tx.send(Input::Notify { key: key.into() });
    }

    /// Asks for the provider's requeue hook of pod `namespace/name`: at once (`None`), or after the
    /// next wait of `after`.
    pub fn requeue(&self, key: impl Into<PodKey>, after: Option<Schedule>) {
        let _ = self.tx.send(Input::Requeue { key: key.into(), after });
    }
}

/// The last status this controller wrote per pod (key → uid, status): a publish is skipped only
/// when both the watched object and our own last write already say the same thing, so a
/// snapshot that lags our last write never hides a change.
#[derive(Default)]
struct Written(std::sync::Mutex<std::collections::HashMap<PodKey, (Uid, ProviderPodStatus)>>);

impl Written {
    fn unchanged(&self, key: &str, uid: &str, pod: &Pod, status: &ProviderPodStatus) -> bool {
        let last = self
            .0
            .lock()
            .expect("written statuses")
            .get(key)
            .filter(|(u, _)| u == uid)
            .map(|(_, s)| s.clone());
        super::status::matches(pod.status.as_ref(), status) && last.is_none_or(|l| l == *status)
    }

    fn record(&self, key: &str, uid: &str, status: &ProviderPodStatus) {
        self.0
            .lock()
            .expect("written statuses")
            .insert(PodKey::from(key), (Uid::from(uid), status.clone()));
    }

    /// The pod object is gone: nothing to compare against any more.
    fn forget(&self, key: &str) {
        self.0.lock().expect("written statuses").remove(key);
    }
}

/// The pod controller of one node.
pub(crate) struct PodController<P: Provider> {
    pub client: Client,
    pub provider: Arc<P>,
    pub node_name: String,
    pub timings: Timings,
    pub events: EventSink,
    pub tx: mpsc::UnboundedSender<Input>,
    pub rx: mpsc::UnboundedReceiver<Input>,
}

pub(crate) fn channel() -> (mpsc::UnboundedSender<Input>, mpsc::UnboundedReceiver<Input>, Notifier) {
    let (tx, rx) = mpsc::unbounded_channel();
    let notifier = Notifier { tx: tx.clone() };
    (tx, rx, notifier)
}

/// The kept copy of a pod from the watch, shown to the provider first (see [`Provider::observed`]).
fn observed<P: Provider>(provider: &P, pod: Pod) -> Arc<Pod> {
    let pod = pod_copy::keep(pod);
    provider.observed(&pod);
    pod
}

fn map_provider(result: Result<Next, ProviderError>) -> OpOutcome {
    match result {
        Ok(Next::Done) => OpOutcome::Done,
        Ok(Next::Requeue(after)) => OpOutcome::Requeue { after },
        Err(ProviderError::Rejected { reason, message }) => OpOutcome::Rejected { reason, message },
        Err(ProviderError::NeedsOperator { reason, message }) => OpOutcome::AwaitingOperator { reason, message },
        Err(e @ (ProviderError::Transient(_) | ProviderError::NotFound(_))) => {
            OpOutcome::Failed { error: e.to_string() }
        }
    }
}

impl<P: Provider> PodController<P> {
    /// Runs until `stop.ops`: watch → core → actions; then drains (see [`Stopping`]).
    pub async fn run(mut self, stop: Stopping) {
        let mut state = PodState::new(CoreConfig {
            retry_base: self.timings.retry_base,
            retry_max: self.timings.retry_max,
            jitter_seed: None,
        });
        let owned = Owned {
            workers: Arc::new(Semaphore::new(self.timings.workers.max(1))),
            written: Arc::new(Written::default()),
            ops: TaskTracker::new(),
            stop: stop.clone(),
        };
        // Every wait before an operation is due again (retries, requeues), in one queue: no task
        // per pod in backoff. An entry that fell due is fed to the core like any input (the core
        // drops one its pod has moved past).
        let mut due: DelayQueue<Input> = DelayQueue::new();
        let pump = self.spawn_watch_pump(stop.ops.clone());
        loop {
            let input = tokio::select! {
                _ = stop.ops.cancelled() => break,
                input = self.rx.recv() => match input {
                    Some(input) => input,
                    None => break,
                },
                Some(expired) = due.next(), if !due.is_empty() => expired.into_inner(),
            };
            for action in state.on_event(input) {
                if let Some((delay, input)) = self.execute(action, &owned, false) {
                    due.insert(input, delay);
                }
            }
        }
        pump.abort();
        // Stop taking work: no new operation starts (the next daemon's startup reconcile and
        // watch deliver every pod again), queued ones give up their turn, pending waits end.
        stop.ops.cancel();
        drop(due);
        owned.ops.close();
        let running = owned.ops.len();
        tracing::info!(node = %self.node_name, running, "pod controller stopped taking work; draining the operations in flight");
        self.drain(&mut state, &owned).await;
        tracing::info!(node = %self.node_name, "pod controller stopped");
    }

    /// The operations in flight run to their end (or to `stop.abandon`), and what they report is
    /// still applied: their Events and the pods' statuses are published, so a pod a drained
    /// hibernate finished reads as such. Nothing else starts.
    async fn drain(&mut self, state: &mut PodState, owned: &Owned) {
        loop {
            tokio::select! {
                biased;
                _ = owned.stop.abandon.cancelled() => break,
                input = self.rx.recv() => {
                    let Some(input) = input else { break };
                    for action in state.on_event(input) {
                        // Draining: nothing is armed again.
                        let _ = self.execute(action, owned, true);
                    }
                }
                _ = owned.ops.wait() => if self.rx.is_empty() { break },
            }
        }
        if owned.stop.abandon.is_cancelled() && !owned.ops.is_empty() {
            tracing::warn!(
                node = %self.node_name,
                running = owned.ops.len(),
                "shutdown deadline: abandoning the pod operations still in flight at their current step (each is left as a crash would leave it; the next start resumes it)"
            );
        }
        // An abandoned operation ends at its next await point.
        owned.ops.wait().await;
    }

    fn spawn_watch_pump(&self, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={}", self.node_name));
        let backoff = Schedule::backoff(self.timings.watch_backoff_min, self.timings.watch_backoff_max).delays();
        let mut stream = watcher(pods, config).backoff(backoff).boxed();
        let tx = self.tx.clone();
        let node = self.node_name.clone();
        let provider = self.provider.clone();
        tokio::spawn(async move {
            loop {
                let item = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    item = stream.next() => item,
                };
                let input = match item {
                    None => return,
                    Some(Err(error)) => {
                        // 410 Gone makes the watcher relist; everything else is retried with backoff.
                        tracing::warn!(%node, %error, "pod watch error; the watcher recovers with backoff");
                        continue;
                    }
                    Some(Ok(event)) => match event {
                        watcher::Event::Init => Input::InitStarted,
                        watcher::Event::InitApply(p) => Input::InitApplied(observed(&*provider, p)),
                        watcher::Event::InitDone => Input::InitDone,
                        watcher::Event::Apply(p) => Input::Applied(observed(&*provider, p)),
                        watcher::Event::Delete(p) => Input::Deleted(pod_copy::keep(p)),
                    },
                };
                if tx.send(input).is_err() {
                    return;
                }
            }
        })
    }

    /// Executes one action of the core; returns the input to feed back after a wait (a retry
    /// or a requeue) for the caller's queue. `draining`: the controller stopped taking work, so
    /// only what reports on work already done runs (Events, status publications); the rest is
    /// left to the next start.
    #[must_use]
    fn execute(&self, action: Action, owned: &Owned, draining: bool) -> Option<(std::time::Duration, Input)> {
        match action {
            Action::Record {
                pod,
                type_,
                reason,
                note,
            } => self.events.record(&pod, type_, reason, "Sync", note),
            Action::RetryAfter { .. } | Action::RequeueAfter { .. } | Action::Run { .. }
                if draining && !reports(&action) =>
            {
                tracing::debug!(?action, "shutting down: not started");
            }
            Action::RetryAfter { key, uid, delay } => return Some((delay, Input::RetryDue { key, uid })),
            Action::RequeueAfter { key, uid, token, delay } => {
                return Some((delay, Input::RequeueDue { key, uid, token }));
            }
            Action::Run {
                op,
                pod,
                fingerprint,
                rejection,
            } => {
                let tx = self.tx.clone();
                let workers = owned.workers.clone();
                let provider = self.provider.clone();
                let client = self.client.clone();
                let written = owned.written.clone();
                let stop = owned.stop.clone();
                owned.ops.spawn(async move {
                    // A queued operation gives up its turn once the controller stops taking work
                    // (a status publication of the drain still runs).
                    let _permit = tokio::select! {
                        biased;
                        _ = stop.ops.cancelled(), if op != OpKind::PublishStatus => return,
                        _ = stop.abandon.cancelled() => return,
                        permit = workers.acquire_owned() => match permit {
                            Ok(permit) => permit,
                            Err(_) => return,
                        },
                    };
                    let key = PodKey::of(&pod);
                    let uid = Uid::of(&pod);
                    let span = tracing::info_span!("pod_op", pod = %key, %uid, op = ?op);
                    // Boxed once the permit is held: a task's allocation is sized for its largest
                    // state, and the provider's operations are large futures. A burst of events
                    // queues many tasks behind the permits, each small while it waits.
                    let running = Box::pin(tracing::Instrument::instrument(
                        run_op(op, &pod, rejection, provider.as_ref(), client, &written),
                        span,
                    ));
                    // At the shutdown deadline the operation stops at its current await point,
                    // as a crash there would stop it: every step leaves state the next start
                    // resumes from (the crash harness checks each cocoon call boundary).
                    let outcome = tokio::select! {
                        outcome = running => outcome,
                        _ = stop.abandon.cancelled() => {
                            tracing::warn!(pod = %key, %uid, ?op, "pod operation abandoned at the shutdown deadline");
                            return;
                        }
                    };
                    match &outcome {
                        OpOutcome::Done => tracing::debug!(pod = %key, %uid, ?op, "pod operation done"),
                        OpOutcome::Requeue { after } => {
                            tracing::debug!(pod = %key, %uid, ?op, ?after, "pod operation done; the provider asks to be asked again")
                        }
                        OpOutcome::Superseded => {
                            tracing::info!(pod = %key, %uid, ?op, "pod incarnation superseded on the apiserver; write dropped")
                        }
                        OpOutcome::Rejected { reason, message } => {
                            tracing::warn!(pod = %key, %uid, ?op, %reason, %message, "provider rejected the pod")
                        }
                        OpOutcome::Failed { error } => {
                            tracing::warn!(pod = %key, %uid, ?op, %error, "pod operation failed; will retry")
                        }
                        OpOutcome::AwaitingOperator { reason, message } => {
                            tracing::warn!(pod = %key, %uid, ?op, %reason, %message, "pod waits for an operator; re-checked at the slowest retry pace")
                        }
                    }
                    let _ = tx.send(Input::Finished {
                        key,
                        uid,
                        op,
                        fingerprint,
                        outcome,
                    });
                });
            }
        }
        None
    }
}

/// Whether a draining controller still runs `action`: it reports on work already done.
fn reports(action: &Action) -> bool {
    matches!(
        action,
        Action::Run {
            op: OpKind::PublishStatus,
            ..
        }
    )
}

/// How the controller is stopped: `ops` ends the intake (no new operation starts), `abandon`
/// ends the wait for the operations in flight (the shutdown deadline). One token for both stops
/// everything at once.
#[derive(Clone, Debug, Default)]
pub struct Stopping {
    pub ops: CancellationToken,
    pub abandon: CancellationToken,
}

impl Stopping {
    /// Stops taking work and abandons what runs, both at `token`.
    pub fn at_once(token: CancellationToken) -> Self {
        Self {
            ops: token.clone(),
            abandon: token,
        }
    }
}

/// What the controller's operations share, and who owns them (`ops`, drained at a stop).
struct Owned {
    workers: Arc<Semaphore>,
    written: Arc<Written>,
    ops: TaskTracker,
    stop: Stopping,
}

fn now() -> Time {
    Time(Timestamp::now())
}

/// Publishes a provider status; maps the result onto the core's outcomes.
async fn publish(pods: &Api<Pod>, pod: &Pod, status: &ProviderPodStatus) -> Result<(), OpOutcome> {
    let built = build_pod_status(pod, status, &now());
    match publish_status(pods, pod, &built).await {
        Ok(WriteOutcome::Applied(_)) => Ok(()),
        Ok(WriteOutcome::Superseded { .. }) => Err(OpOutcome::Superseded),
        Err(e) => Err(OpOutcome::Failed {
            error: format!("patching pod status: {e}"),
        }),
    }
}

async fn run_op<P: Provider>(
    op: OpKind,
    pod: &Arc<Pod>,
    rejection: Option<Rejection>,
    provider: &P,
    client: Client,
    written: &Written,
) -> OpOutcome {
    let (key, uid) = (PodKey::of(pod), Uid::of(pod));
    let pods: Api<Pod> = Api::namespaced(client, &pod.namespace().unwrap_or_default());
    let rejected = |r: &Rejection| ProviderPodStatus::failed(r.reason.as_str(), &r.message);
    match op {
        OpKind::Create => map_provider(provider.create_pod(pod).await),
        OpKind::Update => map_provider(provider.update_pod(pod).await),
        OpKind::Requeue => map_provider(provider.requeue_pod(pod).await),
        OpKind::Delete => match provider.delete_pod(pod).await {
            Ok(()) | Err(ProviderError::NotFound(_)) => OpOutcome::Done,
            Err(e) => OpOutcome::Failed { error: e.to_string() },
        },
        OpKind::PublishStatus => {
            let status = match (provider.pod_status(pod).await, &rejection) {
                (Err(e), _) => {
                    return OpOutcome::Failed {
                        error: format!("reading the provider's pod status: {e}"),
                    };
                }
                (Ok(_), Some(r)) => rejected(r),
                (Ok(Some(s)), None) => s,
                (Ok(None), None) => return OpOutcome::Done,
            };
            // Nothing new: a write would only echo through the watch (an update per patch).
            if written.unchanged(key.as_str(), uid.as_str(), pod, &status) {
                return OpOutcome::Done;
            }
            match publish(&pods, pod, &status).await {
                Ok(()) => {
                    written.record(key.as_str(), uid.as_str(), &status);
                    OpOutcome::Done
                }
                Err(outcome) => outcome,
            }
        }
        OpKind::Finalize => {
            let status = match (provider.pod_status(pod).await, &rejection) {
                (_, Some(r)) => rejected(r),
                (Ok(Some(s)), None) if s.phase.is_terminal() => s,
                _ => ProviderPodStatus::deleted(),
            };
            if let Err(outcome) = publish(&pods, pod, &status).await {
                return outcome;
            }
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: pod.uid(),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match pods.delete(&pod.name_any(), &params).await {
                Ok(_) => {
                    written.forget(key.as_str());
                    OpOutcome::Done
                }
                Err(e) if superseded(&e).is_some() => OpOutcome::Superseded,
                Err(e) => OpOutcome::Failed {
                    error: format!("deleting the pod object: {e}"),
                },
            }
        }
    }
}
