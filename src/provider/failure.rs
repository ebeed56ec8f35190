//! Why a bring-up step failed: the Event reason, the message for the pod, and what a retry
//! can do (the refusal kinds of the policy contract: the kubelet retries `RetryLater` with
//! backoff, re-checks `NeedsOperator` at its slowest pace, and publishes `Permanent` as Failed).

use crate::kubelet::ProviderError;
use crate::policy::contract::types::{EventReason, Refusal, RefusalKind};

/// The message is any error's text (`Display`): the typed error a step failed with becomes the
/// pod's message as it reads.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub reason: &'static str,
    pub message: String,
    pub kind: RefusalKind,
}

impl Failure {
    pub fn transient(reason: &'static str, message: impl std::fmt::Display) -> Self {
        Self {
            reason,
            message: message.to_string(),
            kind: RefusalKind::RetryLater,
        }
    }

    /// A failed transfer from the registry: transient, unless the artifact itself is bad (corrupt,
    /// not in the shape it declares, a name outside the grammar) — then the same pull can only
    /// fail again, and the pod waits for an operator to re-push it or fix the reference.
    pub fn transfer(
        reason: &'static str,
        message: impl std::fmt::Display,
        error: &super::transfer::TransferError,
    ) -> Self {
        let kind = match error.registry() {
            Some(e) if e.is_bad_artifact() => RefusalKind::NeedsOperator,
            _ => RefusalKind::RetryLater,
        };
        Self {
            reason,
            message: message.to_string(),
            kind,
        }
    }

    pub fn permanent(reason: &'static str, message: impl std::fmt::Display) -> Self {
        Self {
            reason,
            message: message.to_string(),
            kind: RefusalKind::Permanent,
        }
    }

    /// A policy's refusal: its kind, its Event reason, its message.
    pub fn refused(refusal: Refusal, message: String) -> Self {
        Self {
            reason: event_reason(refusal.event),
            message,
            kind: refusal.kind,
        }
    }

    pub fn to_provider_error(&self) -> ProviderError {
        match self.kind {
            RefusalKind::RetryLater => ProviderError::Transient(format!("{}: {}", self.reason, self.message)),
            RefusalKind::NeedsOperator => ProviderError::NeedsOperator {
                reason: self.reason.into(),
                message: self.message.clone(),
            },
            RefusalKind::Permanent => ProviderError::Rejected {
                reason: self.reason.into(),
                message: self.message.clone(),
            },
        }
    }
}

/// The Kubernetes Event reason of each case of the contract's `event-reason` (the names its
/// WIT documents).
pub fn event_reason(event: EventReason) -> &'static str {
    match event {
        EventReason::CreateBringUpFailed => "CreateBringUpFailed",
        EventReason::InvalidVmSpec => "InvalidVMSpec",
        EventReason::HibernateEvidenceUnavailable => "HibernateEvidenceUnavailable",
        EventReason::HibernateImageConflict => "HibernateImageConflict",
        EventReason::HibernateSourceConflict => "HibernateSourceConflict",
        EventReason::HibernateSnapshotMissing => "HibernateSnapshotMissing",
        EventReason::SnapshotBackendMismatch => "SnapshotBackendMismatch",
        EventReason::SnapshotUnavailable => "SnapshotUnavailable",
        EventReason::SnapshotCpuClassMismatch => "SnapshotCPUClassMismatch",
        EventReason::ResourceTranslationRefused => "ResourceTranslationRefused",
        EventReason::PostCloneRefused => "PostCloneRefused",
        EventReason::BringUpPolicyFailed => "BringUpPolicyFailed",
        EventReason::CpuClassAdmissionPolicyFailed => "CPUClassAdmissionPolicyFailed",
        EventReason::ResourceTranslationPolicyFailed => "ResourceTranslationPolicyFailed",
        EventReason::PostClonePolicyFailed => "PostClonePolicyFailed",
        EventReason::VmOwnedByAnotherPod => super::ownership::VM_OWNED_BY_ANOTHER_POD,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_becomes_its_own_provider_error() {
        let refusal = |kind| Refusal {
            kind,
            event: EventReason::HibernateImageConflict,
        };
        let f = Failure::refused(refusal(RefusalKind::RetryLater), "m".into());
        assert!(matches!(f.to_provider_error(), ProviderError::Transient(e) if e == "HibernateImageConflict: m"));
        let f = Failure::refused(refusal(RefusalKind::NeedsOperator), "m".into());
        assert_eq!(
            f.to_provider_error(),
            ProviderError::NeedsOperator {
                reason: "HibernateImageConflict".into(),
                message: "m".into()
            }
        );
        let f = Failure::refused(refusal(RefusalKind::Permanent), "m".into());
        assert!(matches!(f.to_provider_error(), ProviderError::Rejected { .. }));
    }
}
