//! Kubernetes Events through kube-runtime's `Recorder` (`events.k8s.io/v1`, deduplicated into
//! series). Publishing never blocks or fails the caller: errors are logged.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Client;
use kube::Resource;
use kube::runtime::events::{Event, EventType as KubeEventType, Recorder, Reporter};

pub use super::reasons::{EventReason, EventType};
use tokio_util::task::TaskTracker;

/// The reporting component of every event.
pub const COMPONENT: &str = "vk-cocoon";

/// Publishes events about pods, as component `vk-cocoon` on instance `<node name>`.
#[derive(Clone)]
pub struct EventSink {
    recorder: Recorder,
    /// The publications in flight, shared by the clones ([`Self::flushed`] waits for them).
    tasks: TaskTracker,
}

impl EventSink {
    pub fn new(client: Client, node_name: &str) -> Self {
        Self {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: COMPONENT.into(),
                    instance: Some(node_name.into()),
                },
            ),
            tasks: TaskTracker::new(),
        }
    }

    /// Waits until every Event recorded so far (through this sink or a clone) is published or
    /// has failed; the sink still takes Events after (they are published as before).
    pub async fn flushed(&self) {
        self.tasks.close();
        self.tasks.wait().await;
        self.tasks.reopen();
    }

    /// Publishes in the background.
    pub fn record(&self, pod: &Pod, type_: EventType, reason: EventReason, action: &str, note: String) {
        self.record_on(pod.object_ref(&()), type_, reason, action, note);
    }

    /// Publishes an Event about any object (the Node, for policy reloads) in the background.
    pub fn record_on(
        &self,
        reference: ObjectReference,
        type_: EventType,
        reason: EventReason,
        action: &str,
        note: String,
    ) {
        let recorder = self.recorder.clone();
        let event = Event {
            type_: match type_ {
                EventType::Normal => KubeEventType::Normal,
                EventType::Warning => KubeEventType::Warning,
            },
            reason: reason.as_str().into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        self.tasks.spawn(async move {
            if let Err(error) = recorder.publish(&event, &reference).await {
                tracing::warn!(%error, reason = %event.reason, object = ?reference.name, "could not publish a Kubernetes event");
            }
        });
    }
}
