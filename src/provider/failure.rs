//! Why a bring-up step failed: the Event reason, the message for the pod, and whether a retry
//! may succeed (the kubelet retries a transient failure; a permanent one needs the operator).

use crate::kubelet::ProviderError;

#[derive(Debug)]
pub(super) struct Failure {
    pub reason: &'static str,
    pub message: String,
    pub transient: bool,
}

impl Failure {
    pub fn transient(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            transient: true,
        }
    }
    pub fn permanent(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            transient: false,
        }
    }

    pub fn to_provider_error(&self) -> ProviderError {
        if self.transient {
            ProviderError::Transient(format!("{}: {}", self.reason, self.message))
        } else {
            ProviderError::Rejected {
                reason: self.reason.into(),
                message: self.message.clone(),
            }
        }
    }
}
