//! The pod status from what the provider knows, as a pure function:
//! Ready = the probe answered ∧ the lifecycle intent is `ready`.

use super::lifecycle::{Intent, LifecycleState};
use super::probe::ProbeResult;
use crate::kubelet::{AgentState, PodPhase, ProviderPodStatus};
use crate::runtime::VmRecord;

/// Everything the status of one tracked pod depends on.
pub struct View<'a> {
    pub vm: Option<&'a VmRecord>,
    /// No VM because the guest is hibernated.
    pub hibernated: bool,
    /// The VM's resolved IP ("" while none).
    pub ip: &'a str,
    pub intent: Option<&'a Intent>,
    pub probe: Option<&'a ProbeResult>,
    /// Ready from the probe alone: the status published just before `lifecycle-state=ready`.
    pub bypass_lifecycle: bool,
}

pub fn build(v: &View<'_>) -> ProviderPodStatus {
    let failed = v
        .intent
        .filter(|i| i.state == LifecycleState::Failed)
        .map(|i| i.message.clone());
    let Some(vm) = v.vm else {
        if v.hibernated {
            // The pod stays alive, so no controller recreates it: Running, its guest parked in a
            // snapshot.
            let waking = v.intent.is_some_and(|i| i.state == LifecycleState::Creating);
            let (reason, message) = match (&failed, waking) {
                (Some(m), _) => ("Hibernated", m.clone()),
                (None, true) => ("Waking", "restoring the guest from its hibernate snapshot".to_string()),
                (None, false) => (
                    "Hibernated",
                    "guest state saved in its hibernate snapshot; clear vm.cocoonstack.io/hibernate to wake it"
                        .to_string(),
                ),
            };
            return ProviderPodStatus {
                phase: PodPhase::Running,
                reason: None,
                message: None,
                pod_ip: None,
                ready: false,
                ready_message: Some(message.clone()),
                start_time: None,
                container_id: None,
                agent: AgentState::Waiting {
                    reason: reason.into(),
                    message: Some(message),
                },
            };
        }
        return ProviderPodStatus::pending("ContainerCreating", failed);
    };
    let probe_ready = v.probe.is_some_and(|p| p.ready);
    let probe_message = v
        .probe
        .map(|p| p.message.clone())
        .unwrap_or_else(|| "not probed yet".into());
    let lifecycle_ready = v.intent.is_some_and(|i| i.state == LifecycleState::Ready);
    let ready_message = match (v.intent, &failed) {
        (_, Some(m)) => m.clone(),
        (Some(i), None) if !lifecycle_ready && !v.bypass_lifecycle => {
            format!("lifecycle {}; probe: {probe_message}", i.state.as_str())
        }
        (None, None) if !v.bypass_lifecycle => format!("lifecycle unknown; probe: {probe_message}"),
        _ => probe_message,
    };
    ProviderPodStatus {
        phase: PodPhase::Running,
        reason: None,
        message: None,
        pod_ip: (!v.ip.is_empty()).then(|| v.ip.to_string()),
        ready: probe_ready && (lifecycle_ready || v.bypass_lifecycle),
        ready_message: Some(ready_message),
        start_time: None,
        container_id: Some(format!("cocoon://{}", vm.id)),
        agent: AgentState::Running { started_at: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(state: LifecycleState, message: &str) -> Intent {
        Intent {
            uid: "u".into(),
            state,
            generation: 0,
            message: message.into(),
        }
    }

    fn probe(ready: bool) -> ProbeResult {
        ProbeResult {
            ready,
            message: if ready { "ping ok" } else { "ping failed: timeout" }.into(),
            last_seen: None,
        }
    }

    fn view<'a>(vm: Option<&'a VmRecord>, intent: Option<&'a Intent>, probe: Option<&'a ProbeResult>) -> View<'a> {
        View {
            vm,
            hibernated: false,
            ip: "10.0.0.5",
            intent,
            probe,
            bypass_lifecycle: false,
        }
    }

    #[test]
    fn ready_needs_both_the_probe_and_the_lifecycle() {
        let vm = VmRecord {
            id: "id1".into(),
            ..Default::default()
        };
        let ready = intent(LifecycleState::Ready, "");
        let creating = intent(LifecycleState::Creating, "");
        let (up, down) = (probe(true), probe(false));
        assert!(build(&view(Some(&vm), Some(&ready), Some(&up))).ready);
        let s = build(&view(Some(&vm), Some(&ready), Some(&down)));
        assert!(!s.ready);
        assert_eq!(s.ready_message.as_deref(), Some("ping failed: timeout"));
        let s = build(&view(Some(&vm), Some(&creating), Some(&up)));
        assert!(!s.ready, "early reachability cannot expose a clone");
        assert_eq!(s.ready_message.as_deref(), Some("lifecycle creating; probe: ping ok"));
        assert!(
            !build(&view(Some(&vm), Some(&ready), None)).ready,
            "no probe yet, not ready"
        );
        let s = build(&View {
            bypass_lifecycle: true,
            ..view(Some(&vm), Some(&creating), Some(&up))
        });
        assert!(
            s.ready,
            "the status landed before the ready annotation carries the probe's verdict"
        );
        assert_eq!(
            (s.phase, s.pod_ip.as_deref(), s.container_id.as_deref()),
            (PodPhase::Running, Some("10.0.0.5"), Some("cocoon://id1"))
        );
    }

    #[test]
    fn a_failed_lifecycle_shows_its_message_and_is_never_ready() {
        let vm = VmRecord {
            id: "id1".into(),
            ..Default::default()
        };
        let failed = intent(LifecycleState::Failed, "post-clone exhausted");
        let up = probe(true);
        let s = build(&view(Some(&vm), Some(&failed), Some(&up)));
        assert!(!s.ready);
        assert_eq!(
            (s.phase, s.ready_message.as_deref()),
            (PodPhase::Running, Some("post-clone exhausted"))
        );
        let s = build(&view(None, Some(&failed), None));
        assert_eq!(s.phase, PodPhase::Pending);
        assert_eq!(s.ready_message.as_deref(), Some("post-clone exhausted"));
    }

    #[test]
    fn a_hibernated_pod_stays_running_without_a_vm() {
        let hibernated = intent(LifecycleState::Hibernated, "");
        let s = build(&View {
            hibernated: true,
            ..view(None, Some(&hibernated), None)
        });
        assert_eq!((s.phase, s.ready, s.pod_ip.clone()), (PodPhase::Running, false, None));
        assert!(matches!(s.agent, AgentState::Waiting { ref reason, .. } if reason == "Hibernated"));
        let waking = intent(LifecycleState::Creating, "");
        let s = build(&View {
            hibernated: true,
            ..view(None, Some(&waking), None)
        });
        assert!(matches!(s.agent, AgentState::Waiting { ref reason, .. } if reason == "Waking"));
        let s = build(&view(None, None, None));
        assert_eq!(s.phase, PodPhase::Pending, "a pod whose VM is not up yet is Pending");
    }
}
