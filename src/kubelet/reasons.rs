//! The type and reason of every Kubernetes Event the daemon records, as types. Event reasons
//! are an interface: operators and the cocoon-operator match them, so [`EventReason::as_str`]
//! is the one place each string is spelled, and a unit test pins every one (a rename fails it).
//!
//! Pure: no I/O, no kube types (the recorder in [`super::events`] converts).

use std::fmt;

/// Whether an Event reports something that went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    /// The Event's `type` field.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// Every reason an Event of the daemon carries. The cases of a policy's refusal arrive as the
/// contract's own `event-reason` and become the case of the same name here (`From` in the
/// provider), so the host never re-chooses a policy's reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventReason {
    // ---- the policy contract's refusal reasons (its WIT documents these names) ----
    CreateBringUpFailed,
    InvalidVmSpec,
    HibernateEvidenceUnavailable,
    HibernateImageConflict,
    HibernateSourceConflict,
    HibernateSnapshotMissing,
    SnapshotBackendMismatch,
    SnapshotUnavailable,
    SnapshotCpuClassMismatch,
    ResourceTranslationRefused,
    PostCloneRefused,
    BringUpPolicyFailed,
    CpuClassAdmissionPolicyFailed,
    ResourceTranslationPolicyFailed,
    PostClonePolicyFailed,
    VmOwnedByAnotherPod,

    // ---- create and bring-up ----
    MissingVmName,
    ForkSnapshotFailed,
    ForkSourceMissing,
    SnapshotPullFailed,
    SnapshotInspectFailed,
    SnapshotAsImage,
    ImagePullFailed,
    MacOsImagePullFailed,
    CloudImageImportFailed,
    HibernateSnapshotExists,
    PeerRestoreFailed,
    CloneFailed,
    RunFailed,
    PolicyUnavailable,
    VmInspectFailed,
    VmStillCreating,
    StaleCreateFailed,
    MacOsVncPasswordInvalid,
    MacOsVncPortsExhausted,
    MacOsInspectFailed,
    MacOsImageInspectFailed,
    MacOsRunFailed,
    MacOsStartFailed,

    // ---- the guest after a clone or a wake ----
    PostCloneSucceeded,
    PostClonePolicyUnavailable,
    PostCloneExecAttemptFailed,
    PostCloneExecExhausted,
    PostCloneIpWaitTimeout,
    PostCloneSacDialFailed,
    PostCloneSacEnumFailed,
    PostCloneSacSetFailed,
    PostCloneSacVerifyFailed,
    WindowsStaticIpFailed,
    WakeIpWaitTimeout,
    WakeRefused,
    Woken,
    WakeVerifyFailed,
    WakeSourceFailed,
    WakeSourceMissing,
    WakePullFailed,
    WakeCloneFailed,

    // ---- hibernate and resume ----
    Hibernated,
    HibernateUnsupported,
    HibernateNetResizeFailed,
    HibernateSnapshotFailed,
    HibernatePushFailed,
    HibernateVmVanished,
    HibernateRemoveFailed,
    ResumeStartFailed,
    ResumedAfterRestart,
    ResumeHibernateFailed,
    ResumeClassifyFailed,

    // ---- a VM that stopped or went, delete ----
    VmRestarted,
    VmGone,
    RestartCooldown,
    VmInspectTimeout,
    RestartFailed,
    DeleteKeptVm,

    // ---- the pod controller's retries ----
    ProviderCreateFailed,
    ProviderUpdateFailed,
    ProviderDeleteFailed,
    PodDeleteFailed,
    PodStatusUpdateFailed,
    ProviderRequeueFailed,

    // ---- the Node: serving certificate and policy reloads ----
    CsrPending,
    CertificateIssued,
    CsrRefused,
    PolicyLoaded,
    PolicyRefused,
}

impl EventReason {
    /// The Event's `reason`, exactly as users and the cocoon-operator match it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::CreateBringUpFailed => "CreateBringUpFailed",
            Self::InvalidVmSpec => "InvalidVMSpec",
            Self::HibernateEvidenceUnavailable => "HibernateEvidenceUnavailable",
            Self::HibernateImageConflict => "HibernateImageConflict",
            Self::HibernateSourceConflict => "HibernateSourceConflict",
            Self::HibernateSnapshotMissing => "HibernateSnapshotMissing",
            Self::SnapshotBackendMismatch => "SnapshotBackendMismatch",
            Self::SnapshotUnavailable => "SnapshotUnavailable",
            Self::SnapshotCpuClassMismatch => "SnapshotCPUClassMismatch",
            Self::ResourceTranslationRefused => "ResourceTranslationRefused",
            Self::PostCloneRefused => "PostCloneRefused",
            Self::BringUpPolicyFailed => "BringUpPolicyFailed",
            Self::CpuClassAdmissionPolicyFailed => "CPUClassAdmissionPolicyFailed",
            Self::ResourceTranslationPolicyFailed => "ResourceTranslationPolicyFailed",
            Self::PostClonePolicyFailed => "PostClonePolicyFailed",
            Self::VmOwnedByAnotherPod => "VMOwnedByAnotherPod",
            Self::MissingVmName => "MissingVMName",
            Self::ForkSnapshotFailed => "ForkSnapshotFailed",
            Self::ForkSourceMissing => "ForkSourceMissing",
            Self::SnapshotPullFailed => "SnapshotPullFailed",
            Self::SnapshotInspectFailed => "SnapshotInspectFailed",
            Self::SnapshotAsImage => "SnapshotAsImage",
            Self::ImagePullFailed => "ImagePullFailed",
            Self::MacOsImagePullFailed => "MacOSImagePullFailed",
            Self::CloudImageImportFailed => "CloudImageImportFailed",
            Self::HibernateSnapshotExists => "HibernateSnapshotExists",
            Self::PeerRestoreFailed => "PeerRestoreFailed",
            Self::CloneFailed => "CloneFailed",
            Self::RunFailed => "RunFailed",
            Self::PolicyUnavailable => "PolicyUnavailable",
            Self::VmInspectFailed => "VMInspectFailed",
            Self::VmStillCreating => "VMStillCreating",
            Self::StaleCreateFailed => "StaleCreateFailed",
            Self::MacOsVncPasswordInvalid => "MacOSVNCPasswordInvalid",
            Self::MacOsVncPortsExhausted => "MacOSVNCPortsExhausted",
            Self::MacOsInspectFailed => "MacOSInspectFailed",
            Self::MacOsImageInspectFailed => "MacOSImageInspectFailed",
            Self::MacOsRunFailed => "MacOSRunFailed",
            Self::MacOsStartFailed => "MacOSStartFailed",
            Self::PostCloneSucceeded => "PostCloneSucceeded",
            Self::PostClonePolicyUnavailable => "PostClonePolicyUnavailable",
            Self::PostCloneExecAttemptFailed => "PostCloneExecAttemptFailed",
            Self::PostCloneExecExhausted => "PostCloneExecExhausted",
            Self::PostCloneIpWaitTimeout => "PostCloneIPWaitTimeout",
            Self::PostCloneSacDialFailed => "PostCloneSACDialFailed",
            Self::PostCloneSacEnumFailed => "PostCloneSACEnumFailed",
            Self::PostCloneSacSetFailed => "PostCloneSACSetFailed",
            Self::PostCloneSacVerifyFailed => "PostCloneSACVerifyFailed",
            Self::WindowsStaticIpFailed => "WindowsStaticIPFailed",
            Self::WakeIpWaitTimeout => "WakeIPWaitTimeout",
            Self::WakeRefused => "WakeRefused",
            Self::Woken => "Woken",
            Self::WakeVerifyFailed => "WakeVerifyFailed",
            Self::WakeSourceFailed => "WakeSourceFailed",
            Self::WakeSourceMissing => "WakeSourceMissing",
            Self::WakePullFailed => "WakePullFailed",
            Self::WakeCloneFailed => "WakeCloneFailed",
            Self::Hibernated => "Hibernated",
            Self::HibernateUnsupported => "HibernateUnsupported",
            Self::HibernateNetResizeFailed => "HibernateNetResizeFailed",
            Self::HibernateSnapshotFailed => "HibernateSnapshotFailed",
            Self::HibernatePushFailed => "HibernatePushFailed",
            Self::HibernateVmVanished => "HibernateVMVanished",
            Self::HibernateRemoveFailed => "HibernateRemoveFailed",
            Self::ResumeStartFailed => "ResumeStartFailed",
            Self::ResumedAfterRestart => "ResumedAfterRestart",
            Self::ResumeHibernateFailed => "ResumeHibernateFailed",
            Self::ResumeClassifyFailed => "ResumeClassifyFailed",
            Self::VmRestarted => "VMRestarted",
            Self::VmGone => "VMGone",
            Self::RestartCooldown => "RestartCooldown",
            Self::VmInspectTimeout => "VMInspectTimeout",
            Self::RestartFailed => "RestartFailed",
            Self::DeleteKeptVm => "DeleteKeptVM",
            Self::ProviderCreateFailed => "ProviderCreateFailed",
            Self::ProviderUpdateFailed => "ProviderUpdateFailed",
            Self::ProviderDeleteFailed => "ProviderDeleteFailed",
            Self::PodDeleteFailed => "PodDeleteFailed",
            Self::PodStatusUpdateFailed => "PodStatusUpdateFailed",
            Self::ProviderRequeueFailed => "ProviderRequeueFailed",
            Self::CsrPending => "CSRPending",
            Self::CertificateIssued => "CertificateIssued",
            Self::CsrRefused => "CSRRefused",
            Self::PolicyLoaded => "PolicyLoaded",
            Self::PolicyRefused => "PolicyRefused",
        }
    }
}

impl fmt::Display for EventReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::EventReason::*;
    use super::*;

    /// Every reason with the string users match: renaming one fails this table (a new reason
    /// gets its row here when it is added).
    #[test]
    fn every_reason_keeps_its_published_string() {
        let pinned: &[(EventReason, &str)] = &[
            (CreateBringUpFailed, "CreateBringUpFailed"),
            (InvalidVmSpec, "InvalidVMSpec"),
            (HibernateEvidenceUnavailable, "HibernateEvidenceUnavailable"),
            (HibernateImageConflict, "HibernateImageConflict"),
            (HibernateSourceConflict, "HibernateSourceConflict"),
            (HibernateSnapshotMissing, "HibernateSnapshotMissing"),
            (SnapshotBackendMismatch, "SnapshotBackendMismatch"),
            (SnapshotUnavailable, "SnapshotUnavailable"),
            (SnapshotCpuClassMismatch, "SnapshotCPUClassMismatch"),
            (ResourceTranslationRefused, "ResourceTranslationRefused"),
            (PostCloneRefused, "PostCloneRefused"),
            (BringUpPolicyFailed, "BringUpPolicyFailed"),
            (CpuClassAdmissionPolicyFailed, "CPUClassAdmissionPolicyFailed"),
            (ResourceTranslationPolicyFailed, "ResourceTranslationPolicyFailed"),
            (PostClonePolicyFailed, "PostClonePolicyFailed"),
            (VmOwnedByAnotherPod, "VMOwnedByAnotherPod"),
            (MissingVmName, "MissingVMName"),
            (ForkSnapshotFailed, "ForkSnapshotFailed"),
            (ForkSourceMissing, "ForkSourceMissing"),
            (SnapshotPullFailed, "SnapshotPullFailed"),
            (SnapshotInspectFailed, "SnapshotInspectFailed"),
            (SnapshotAsImage, "SnapshotAsImage"),
            (ImagePullFailed, "ImagePullFailed"),
            (MacOsImagePullFailed, "MacOSImagePullFailed"),
            (CloudImageImportFailed, "CloudImageImportFailed"),
            (HibernateSnapshotExists, "HibernateSnapshotExists"),
            (PeerRestoreFailed, "PeerRestoreFailed"),
            (CloneFailed, "CloneFailed"),
            (RunFailed, "RunFailed"),
            (PolicyUnavailable, "PolicyUnavailable"),
            (VmInspectFailed, "VMInspectFailed"),
            (VmStillCreating, "VMStillCreating"),
            (StaleCreateFailed, "StaleCreateFailed"),
            (MacOsVncPasswordInvalid, "MacOSVNCPasswordInvalid"),
            (MacOsVncPortsExhausted, "MacOSVNCPortsExhausted"),
            (MacOsInspectFailed, "MacOSInspectFailed"),
            (MacOsImageInspectFailed, "MacOSImageInspectFailed"),
            (MacOsRunFailed, "MacOSRunFailed"),
            (MacOsStartFailed, "MacOSStartFailed"),
            (PostCloneSucceeded, "PostCloneSucceeded"),
            (PostClonePolicyUnavailable, "PostClonePolicyUnavailable"),
            (PostCloneExecAttemptFailed, "PostCloneExecAttemptFailed"),
            (PostCloneExecExhausted, "PostCloneExecExhausted"),
            (PostCloneIpWaitTimeout, "PostCloneIPWaitTimeout"),
            (PostCloneSacDialFailed, "PostCloneSACDialFailed"),
            (PostCloneSacEnumFailed, "PostCloneSACEnumFailed"),
            (PostCloneSacSetFailed, "PostCloneSACSetFailed"),
            (PostCloneSacVerifyFailed, "PostCloneSACVerifyFailed"),
            (WindowsStaticIpFailed, "WindowsStaticIPFailed"),
            (WakeIpWaitTimeout, "WakeIPWaitTimeout"),
            (WakeRefused, "WakeRefused"),
            (Woken, "Woken"),
            (WakeVerifyFailed, "WakeVerifyFailed"),
            (WakeSourceFailed, "WakeSourceFailed"),
            (WakeSourceMissing, "WakeSourceMissing"),
            (WakePullFailed, "WakePullFailed"),
            (WakeCloneFailed, "WakeCloneFailed"),
            (Hibernated, "Hibernated"),
            (HibernateUnsupported, "HibernateUnsupported"),
            (HibernateNetResizeFailed, "HibernateNetResizeFailed"),
            (HibernateSnapshotFailed, "HibernateSnapshotFailed"),
            (HibernatePushFailed, "HibernatePushFailed"),
            (HibernateVmVanished, "HibernateVMVanished"),
            (HibernateRemoveFailed, "HibernateRemoveFailed"),
            (ResumeStartFailed, "ResumeStartFailed"),
            (ResumedAfterRestart, "ResumedAfterRestart"),
            (ResumeHibernateFailed, "ResumeHibernateFailed"),
            (ResumeClassifyFailed, "ResumeClassifyFailed"),
            (VmRestarted, "VMRestarted"),
            (VmGone, "VMGone"),
            (RestartCooldown, "RestartCooldown"),
            (VmInspectTimeout, "VMInspectTimeout"),
            (RestartFailed, "RestartFailed"),
            (DeleteKeptVm, "DeleteKeptVM"),
            (ProviderCreateFailed, "ProviderCreateFailed"),
            (ProviderUpdateFailed, "ProviderUpdateFailed"),
            (ProviderDeleteFailed, "ProviderDeleteFailed"),
            (PodDeleteFailed, "PodDeleteFailed"),
            (PodStatusUpdateFailed, "PodStatusUpdateFailed"),
            (ProviderRequeueFailed, "ProviderRequeueFailed"),
            (CsrPending, "CSRPending"),
            (CertificateIssued, "CertificateIssued"),
            (CsrRefused, "CSRRefused"),
            (PolicyLoaded, "PolicyLoaded"),
            (PolicyRefused, "PolicyRefused"),
        ];
        for (reason, expected) in pinned {
            assert_eq!(reason.as_str(), *expected, "{reason:?}");
            assert_eq!(reason.to_string(), *expected);
        }
        let mut strings: Vec<&str> = pinned.iter().map(|(_, s)| *s).collect();
        strings.sort_unstable();
        strings.dedup();
        assert_eq!(strings.len(), pinned.len(), "two reasons share one string");
    }

    #[test]
    fn event_types_are_the_two_kubernetes_spells() {
        assert_eq!(EventType::Normal.as_str(), "Normal");
        assert_eq!(EventType::Warning.as_str(), "Warning");
    }
}
