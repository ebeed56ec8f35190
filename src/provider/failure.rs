//! Why a bring-up step failed: the Event reason, the message for the pod, and what a retry
//! can do (the refusal kinds of the policy contract: the kubelet retries `RetryLater` with
//! backoff, re-checks `NeedsOperator` at its slowest pace, and publishes `Permanent` as Failed).

use crate::kubelet::{EventReason, ProviderError};
use crate::policy::contract::types::{EventReason as ContractReason, Refusal, RefusalKind};

/// The message is any error's text (`Display`): the typed error a step failed with becomes the
/// pod's message as it reads.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    pub reason: EventReason,
    pub message: String,
    pub kind: RefusalKind,
}

impl Failure {
    pub fn transient(reason: EventReason, message: impl std::fmt::Display) -> Self {
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
        reason: EventReason,
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

    pub fn permanent(reason: EventReason, message: impl std::fmt::Display) -> Self {
        Self {
            reason,
            message: message.to_string(),
            kind: RefusalKind::Permanent,
        }
    }

    /// A policy's refusal: its kind, its Event reason, its message.
    pub fn refused(refusal: Refusal, message: String) -> Self {
        Self {
            reason: refusal.event.into(),
            message,
            kind: refusal.kind,
        }
    }

    pub fn to_provider_error(&self) -> ProviderError {
        match self.kind {
            RefusalKind::RetryLater => ProviderError::Transient(format!("{}: {}", self.reason, self.message)),
            RefusalKind::NeedsOperator => ProviderError::NeedsOperator {
                reason: self.reason,
                message: self.message.clone(),
            },
            RefusalKind::Permanent => ProviderError::Rejected {
                reason: self.reason,
                message: self.message.clone(),
            },
        }
    }
}

/// A policy's refusal reason becomes the host's reason of the same name (the contract's WIT
/// documents each string): the host carries the policy's choice, it never picks another.
impl From<ContractReason> for EventReason {
    fn from(event: ContractReason) -> Self {
        match event {
            ContractReason::CreateBringUpFailed => Self::CreateBringUpFailed,
            ContractReason::InvalidVmSpec => Self::InvalidVmSpec,
            ContractReason::HibernateEvidenceUnavailable => Self::HibernateEvidenceUnavailable,
            ContractReason::HibernateImageConflict => Self::HibernateImageConflict,
            ContractReason::HibernateSourceConflict => Self::HibernateSourceConflict,
            ContractReason::HibernateSnapshotMissing => Self::HibernateSnapshotMissing,
            ContractReason::SnapshotBackendMismatch => Self::SnapshotBackendMismatch,
            ContractReason::SnapshotUnavailable => Self::SnapshotUnavailable,
            ContractReason::SnapshotCpuClassMismatch => Self::SnapshotCpuClassMismatch,
            ContractReason::ResourceTranslationRefused => Self::ResourceTranslationRefused,
            ContractReason::PostCloneRefused => Self::PostCloneRefused,
            ContractReason::BringUpPolicyFailed => Self::BringUpPolicyFailed,
            ContractReason::CpuClassAdmissionPolicyFailed => Self::CpuClassAdmissionPolicyFailed,
            ContractReason::ResourceTranslationPolicyFailed => Self::ResourceTranslationPolicyFailed,
            ContractReason::PostClonePolicyFailed => Self::PostClonePolicyFailed,
            ContractReason::VmOwnedByAnotherPod => Self::VmOwnedByAnotherPod,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_becomes_its_own_provider_error() {
        let refusal = |kind| Refusal {
            kind,
            event: ContractReason::HibernateImageConflict,
        };
        let f = Failure::refused(refusal(RefusalKind::RetryLater), "m".into());
        assert!(matches!(f.to_provider_error(), ProviderError::Transient(e) if e == "HibernateImageConflict: m"));
        let f = Failure::refused(refusal(RefusalKind::NeedsOperator), "m".into());
        assert_eq!(
            f.to_provider_error(),
            ProviderError::NeedsOperator {
                reason: EventReason::HibernateImageConflict,
                message: "m".into()
            }
        );
        let f = Failure::refused(refusal(RefusalKind::Permanent), "m".into());
        assert!(matches!(f.to_provider_error(), ProviderError::Rejected { .. }));
    }
}
