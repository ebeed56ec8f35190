//! Pod status: pure construction from the provider's view, and its publication on the status
//! subresource (plus annotation patches) with a `metadata.uid` precondition, so a write meant for
//! one incarnation of a pod never lands on the next one with the same name.

use super::provider::{AgentState, ProviderPodStatus};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod,
    PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The single container status name that stands for the VM.
pub const AGENT_CONTAINER: &str = "agent";

fn condition(type_: &str, ok: bool, message: Option<&str>, now: &Time, previous: Option<&PodStatus>) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    // Keep the transition time while the status is unchanged (as the kubelet does).
    let transition = previous
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_ && c.status == status))
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    PodCondition {
        type_: type_.into(),
        status: status.into(),
        message: message.map(str::to_string),
        last_transition_time: Some(transition),
        ..Default::default()
    }
}

/// The Kubernetes `PodStatus` for the provider's view of a pod: phase, podIP, Ready and
/// Initialized conditions, one container status `agent`.
pub fn build_pod_status(pod: &Pod, s: &ProviderPodStatus, now: &Time) -> PodStatus {
    let previous = pod.status.as_ref();
    let image = pod
        .spec
        .as_ref()
        .and_then(|spec| spec.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    let state = match &s.agent {
        AgentState::Waiting { reason, message } => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(reason.clone()),
                message: message.clone(),
            }),
            ..Default::default()
        },
        AgentState::Running { started_at } => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: started_at.clone().or_else(|| s.start_time.clone()),
            }),
            ..Default::default()
        },
        AgentState::Terminated {
            exit_code,
            reason,
            message,
        } => ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: *exit_code,
                reason: Some(reason.clone()),
                message: message.clone(),
                finished_at: Some(now.clone()),
                container_id: s.container_id.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
    };
    let running = matches!(s.agent, AgentState::Running { .. });
    let start_time = s
        .start_time
        .clone()
        .or_else(|| previous.and_then(|p| p.start_time.clone()))
        .or_else(|| Some(now.clone()));
    PodStatus {
        phase: Some(s.phase.as_str().into()),
        reason: s.reason.clone(),
        message: s.message.clone(),
        pod_ip: s.pod_ip.clone(),
        pod_ips: s
            .pod_ip
            .as_ref()
            .map(|ip| vec![k8s_openapi::api::core::v1::PodIP { ip: ip.clone() }]),
        host_ip: previous.and_then(|p| p.host_ip.clone()),
        start_time,
        conditions: Some(vec![
            condition("Initialized", true, None, now, previous),
            condition("Ready", s.ready, s.ready_message.as_deref(), now, previous),
            condition("ContainersReady", s.ready, s.ready_message.as_deref(), now, previous),
            condition("PodScheduled", true, None, now, previous),
        ]),
        container_statuses: Some(vec![ContainerStatus {
            name: AGENT_CONTAINER.into(),
            image,
            image_id: String::new(),
            container_id: s.container_id.clone(),
            ready: s.ready,
            started: Some(running),
            restart_count: 0,
            state: Some(state),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

/// Whether the stored status already says what `s` says (phase, podIP, the Ready
/// condition and its message, Initialized, the `agent` container's readiness and state), so
/// publishing it again would only echo.
pub fn matches(current: Option<&PodStatus>, s: &ProviderPodStatus) -> bool {
    let Some(cur) = current else { return false };
    let condition = |t: &str| cur.conditions.as_ref().and_then(|cs| cs.iter().find(|c| c.type_ == t));
    let ready_ok = condition("Ready")
        .is_some_and(|c| c.status == if s.ready { "True" } else { "False" } && c.message == s.ready_message);
    let initialized_ok = condition("Initialized").is_some_and(|c| c.status == "True");
    let agent = cur
        .container_statuses
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.name == AGENT_CONTAINER));
    let agent_ok = agent.is_some_and(|a| {
        let state = a.state.as_ref();
        let kind_ok = match &s.agent {
            AgentState::Running { .. } => state.is_some_and(|st| st.running.is_some()),
            AgentState::Waiting { reason, .. } => state
                .and_then(|st| st.waiting.as_ref())
                .is_some_and(|w| w.reason.as_deref() == Some(reason)),
            AgentState::Terminated { reason, .. } => state
                .and_then(|st| st.terminated.as_ref())
                .is_some_and(|t| t.reason.as_deref() == Some(reason)),
        };
        a.ready == s.ready && kind_ok && a.container_id == s.container_id
    });
    cur.phase.as_deref() == Some(s.phase.as_str())
        && cur.pod_ip == s.pod_ip
        && cur.reason == s.reason
        && cur.message == s.message
        && ready_ok
        && initialized_ok
        && agent_ok
}

/// How a conditional write ended.
#[derive(Debug, Clone, PartialEq)]
pub enum WriteOutcome {
    /// Written; the object as the apiserver returned it.
    Applied(Box<Pod>),
    /// The incarnation we wrote for is gone: the apiserver answered NotFound, Invalid (the body's
    /// `metadata.uid` names another incarnation: the field is immutable) or Conflict. Not retried.
    Superseded { code: u16, message: String },
}

/// Whether an apiserver error means "this incarnation is gone" (superseded: another incarnation of the pod, or none, now holds its name).
pub fn superseded(err: &kube::Error) -> Option<(u16, String)> {
    match err {
        kube::Error::Api(s) if matches!(s.code, 404 | 409 | 422) => Some((s.code, s.message.clone())),
        _ => None,
    }
}

fn outcome(result: Result<Pod, kube::Error>) -> Result<WriteOutcome, kube::Error> {
    match result {
        Ok(p) => Ok(WriteOutcome::Applied(Box::new(p))),
        Err(e) => match superseded(&e) {
            Some((code, message)) => Ok(WriteOutcome::Superseded { code, message }),
            None => Err(e),
        },
    }
}

fn uid_of(pod: &Pod) -> Result<String, kube::Error> {
    pod.uid().ok_or_else(|| {
        kube::Error::Service(
            format!(
                "pod {}/{} has no metadata.uid; cannot write it conditionally",
                pod.namespace().unwrap_or_default(),
                pod.name_any()
            )
            .into(),
        )
    })
}

/// The merge patch of the status subresource, carrying `metadata.uid` as a precondition.
///
/// A merge patch keeps every field it leaves out, so a live pod that has no address any more
/// (its guest hibernated, its VM gone) names `podIP` / `podIPs` as null: otherwise the pod would
/// keep advertising an address cocoon-net may lease to another guest. A finished pod keeps the
/// address it last had, as the kubelet's does.
pub fn status_patch(uid: &str, status: &PodStatus) -> Value {
    let mut patch = json!({"metadata": {"uid": uid}, "status": status});
    let finished = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
    if status.pod_ip.is_none() && !finished {
        patch["status"]["podIP"] = Value::Null;
        patch["status"]["podIPs"] = Value::Null;
    }
    patch
}

/// Patches the pod's status subresource for exactly this incarnation (`pod.metadata.uid`).
pub async fn publish_status(pods: &Api<Pod>, pod: &Pod, status: &PodStatus) -> Result<WriteOutcome, kube::Error> {
    let uid = uid_of(pod)?;
    outcome(
        pods.patch_status(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(status_patch(&uid, status)),
        )
        .await,
    )
}

/// Sets (`Some`) or removes (`None`) annotations on exactly this incarnation of the pod
/// (strategic-merge patch with `metadata.uid`).
pub async fn patch_annotations(
    pods: &Api<Pod>,
    pod: &Pod,
    changes: &BTreeMap<String, Option<String>>,
) -> Result<WriteOutcome, kube::Error> {
    let uid = uid_of(pod)?;
    let annotations: serde_json::Map<String, Value> = changes.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    let patch = json!({"metadata": {"uid": uid, "annotations": annotations}});
    outcome(
        pods.patch(&pod.name_any(), &PatchParams::default(), &Patch::Strategic(patch))
            .await,
    )
}

#[cfg(test)]
mod tests {
    use super::super::provider::PodPhase;
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::jiff::Timestamp;

    fn pod() -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some("p".into());
        p.metadata.uid = Some("u1".into());
        p.spec = Some(PodSpec {
            containers: vec![Container {
                name: "agent".into(),
                image: Some("img:1".into()),
                ..Default::default()
            }],
            ..Default::default()
        });
        p
    }

    fn running(ready: bool) -> ProviderPodStatus {
        ProviderPodStatus {
            phase: PodPhase::Running,
            reason: None,
            message: None,
            pod_ip: Some("10.0.0.7".into()),
            ready,
            ready_message: Some(if ready { "ping ok" } else { "waiting for dhcp lease" }.into()),
            start_time: None,
            container_id: Some("cocoon://vm-1".into()),
            agent: AgentState::Running { started_at: None },
        }
    }

    #[test]
    fn running_pod_status() {
        let now = Time(Timestamp::from_second(100).unwrap());
        let st = build_pod_status(&pod(), &running(true), &now);
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(st.pod_ip.as_deref(), Some("10.0.0.7"));
        let conds = st.conditions.as_ref().unwrap();
        let ready = conds.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.message.as_deref()),
            ("True", Some("ping ok"))
        );
        assert_eq!(conds.iter().find(|c| c.type_ == "Initialized").unwrap().status, "True");
        let cs = st.container_statuses.as_ref().unwrap();
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].name, "agent");
        assert_eq!(cs[0].image, "img:1");
        assert!(cs[0].ready);
        assert!(cs[0].state.as_ref().unwrap().running.is_some());
        assert_eq!(st.start_time, Some(now));
    }

    #[test]
    fn transition_time_kept_while_unchanged_and_moved_on_flip() {
        let t0 = Time(Timestamp::from_second(100).unwrap());
        let t1 = Time(Timestamp::from_second(200).unwrap());
        let mut p = pod();
        p.status = Some(build_pod_status(&p, &running(false), &t0));
        let same = build_pod_status(&p, &running(false), &t1);
        let ready = |s: &PodStatus| {
            s.conditions
                .as_ref()
                .unwrap()
                .iter()
                .find(|c| c.type_ == "Ready")
                .unwrap()
                .clone()
        };
        assert_eq!(ready(&same).last_transition_time, Some(t0.clone()));
        let flipped = build_pod_status(&p, &running(true), &t1);
        assert_eq!(ready(&flipped).last_transition_time, Some(t1));
        assert_eq!(flipped.start_time, Some(t0), "start time is kept");
    }

    #[test]
    fn failed_and_deleted_statuses() {
        let now = Time(Timestamp::from_second(1).unwrap());
        let st = build_pod_status(
            &pod(),
            &ProviderPodStatus::failed("SnapshotCPUClassMismatch", "class icx != spr"),
            &now,
        );
        assert_eq!(st.phase.as_deref(), Some("Failed"));
        assert_eq!(st.reason.as_deref(), Some("SnapshotCPUClassMismatch"));
        let term = st.container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap();
        assert_eq!(
            (term.exit_code, term.reason.as_deref()),
            (1, Some("SnapshotCPUClassMismatch"))
        );
        let st = build_pod_status(&pod(), &ProviderPodStatus::deleted(), &now);
        assert_eq!(st.phase.as_deref(), Some("Succeeded"));
    }

    #[test]
    fn a_published_status_matches_itself_and_not_a_changed_one() {
        let now = Time(Timestamp::from_second(100).unwrap());
        let mut p = pod();
        assert!(!matches(None, &running(true)));
        p.status = Some(build_pod_status(&p, &running(false), &now));
        assert!(
            matches(p.status.as_ref(), &running(false)),
            "publishing it again would only echo"
        );
        assert!(!matches(p.status.as_ref(), &running(true)), "a Ready flip is a change");
        let mut moved = running(false);
        moved.pod_ip = Some("10.0.0.8".into());
        assert!(!matches(p.status.as_ref(), &moved), "a new pod IP is a change");
        let mut msg = running(false);
        msg.ready_message = Some("tcp probe 22: refused".into());
        assert!(!matches(p.status.as_ref(), &msg), "a new probe message is a change");
        assert!(!matches(
            p.status.as_ref(),
            &ProviderPodStatus::failed("VMGone", "vm no longer exists")
        ));
    }

    #[test]
    fn a_live_pod_without_an_address_has_it_removed_and_a_finished_one_keeps_it() {
        let now = Time(Timestamp::from_second(100).unwrap());
        let mut hibernated = running(false);
        hibernated.pod_ip = None;
        let patch = status_patch("u", &build_pod_status(&pod(), &hibernated, &now));
        assert_eq!(patch["status"]["podIP"], Value::Null, "{patch}");
        assert!(patch["status"].as_object().unwrap().contains_key("podIPs"), "{patch}");

        let with_ip = status_patch("u", &build_pod_status(&pod(), &running(true), &now));
        assert_eq!(with_ip["status"]["podIP"], "10.0.0.7");

        let mut failed = hibernated.clone();
        failed.phase = PodPhase::Failed;
        let patch = status_patch("u", &build_pod_status(&pod(), &failed, &now));
        assert!(
            !patch["status"].as_object().unwrap().contains_key("podIP"),
            "a finished pod keeps its last address: {patch}"
        );
    }

    #[test]
    fn the_patch_carries_the_uid() {
        let st = build_pod_status(&pod(), &running(true), &Time(Timestamp::UNIX_EPOCH));
        let patch = status_patch("u1", &st);
        assert_eq!(patch["metadata"]["uid"], "u1");
        assert_eq!(patch["status"]["phase"], "Running");
    }
}
