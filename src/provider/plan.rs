//! Pure pieces of CreatePod and DeletePod: evidence from lookups, CLI specs from a policy's
//! plan, image routing, the backend assertion, which MACs own DHCP leases. No I/O.

use super::ports::Artifact;
use crate::hypervisor::Hypervisor;
use crate::model::vm_spec;
use crate::policy::contract::bring_up::{
    CloneOptions, EvidenceSource, FoundEvidence, HibernateEvidence, LocalSnapshot, Outcome, Plan,
};
use crate::policy::contract::resource_translation::CpuPolicy as PolicyCpu;
use crate::policy::contract::types::{self as contract, EventReason, Refusal, RestoreMode as PolicyRestoreMode};
use crate::runtime::{Backend, CloneSource, CloneSpec, CpuPolicy, RestoreMode, RuntimeError, SnapshotRecord, VmRecord};

pub use vk_policy_support::naming::{
    DEFAULT_SNAPSHOT_TAG, HIBERNATE_SNAPSHOT_TAG, fork_snapshot_name, local_snapshot_name, parse_ref,
};

/// Manifest annotation recording the image a snapshot was taken from.
pub use crate::registry::media::ANN_BASEIMAGE as BASE_IMAGE_ANNOTATION;
/// Manifest annotation recording the pod (`<namespace>/<pod>`) whose VM state a push holds.
pub use crate::registry::media::ANN_OWNER as OWNER_ANNOTATION;

/// Local name a `:hibernate` pull is imported under.
pub fn hibernate_import_name(vm: &str) -> String {
    format!("{vm}-hibernate-import")
}

/// Which DHCP a guest's lease comes from (`VK_NETWORK_MODE`, or the family of cocoon-net's pool).
/// A Windows guest's `ipconfig /release` and `/renew` only touch its DHCPv4 lease: on an IPv6-only
/// network they would leave the DHCPv6 lease held across a NIC drop, and a renew nudge would
/// never ask for the address the daemon waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NetworkMode {
    #[default]
    Ipv4,
    Ipv6Only,
}

/// A `VK_NETWORK_MODE` other than `ipv4` or `ipv6-only` (the setting's parser names both).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a network mode")]
pub struct NotANetworkMode;

impl NetworkMode {
    pub fn parse(text: &str) -> Result<Self, NotANetworkMode> {
        match text.trim().to_ascii_lowercase().as_str() {
            "ipv4" => Ok(Self::Ipv4),
            "ipv6-only" => Ok(Self::Ipv6Only),
            _ => Err(NotANetworkMode),
        }
    }
}

/// What a Windows guest's DHCP client is asked to do with its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseStep {
    /// Before its NIC goes: the lease is handed back so cocoon-net may give it out again.
    Release,
    /// After a NIC comes back, or when no lease has shown up: ask again.
    Renew,
}

/// `cmd /c ipconfig /release|/renew` in a Windows guest, or `/release6|/renew6` on an
/// IPv6-only network (the plain verbs only touch the DHCPv4 lease).
pub fn ipconfig(step: LeaseStep, mode: NetworkMode) -> crate::runtime::ExecSpec {
    let verb = match (step, mode) {
        (LeaseStep::Release, NetworkMode::Ipv4) => "/release",
        (LeaseStep::Renew, NetworkMode::Ipv4) => "/renew",
        (LeaseStep::Release, NetworkMode::Ipv6Only) => "/release6",
        (LeaseStep::Renew, NetworkMode::Ipv6Only) => "/renew6",
    };
    crate::runtime::ExecSpec {
        argv: vec!["cmd".into(), "/c".into(), "ipconfig".into(), verb.into()],
        ..Default::default()
    }
}

pub fn is_http(reference: &str) -> bool {
    reference.starts_with("http://") || reference.starts_with("https://")
}

/// Evidence from the registry's `<vm>:hibernate` lookup: `Ok(None)` is the typed "tag absent".
pub fn registry_evidence<E: std::fmt::Display>(lookup: Result<Option<&Artifact>, E>) -> HibernateEvidence {
    match lookup {
        Ok(None) => HibernateEvidence::None,
        Ok(Some(Artifact { annotations, .. })) => HibernateEvidence::Found(FoundEvidence {
            source: EvidenceSource::Registry,
            recorded_image: annotations.get(BASE_IMAGE_ANNOTATION).cloned().unwrap_or_default(),
            recorded_owner: annotations.get(OWNER_ANNOTATION).cloned().unwrap_or_default(),
        }),
        Err(e) => HibernateEvidence::Unavailable(e.to_string()),
    }
}

/// Evidence on a registry-less node: a local snapshot named after the VM; `holder` is who holds
/// that VM name here (`<namespace>/<pod>`, "" when nobody).
pub fn local_evidence(lookup: &Result<SnapshotRecord, RuntimeError>, holder: String) -> HibernateEvidence {
    match lookup {
        Ok(_) => HibernateEvidence::Found(FoundEvidence {
            source: EvidenceSource::LocalSnapshot,
            recorded_image: String::new(),
            recorded_owner: holder,
        }),
        Err(e) if e.is_snapshot_not_found() || e.is_not_found() => HibernateEvidence::None,
        Err(e) => HibernateEvidence::Unavailable(e.to_string()),
    }
}

pub fn local_snapshot_fact(s: &SnapshotRecord) -> LocalSnapshot {
    LocalSnapshot {
        name: s.name.clone(),
        id: s.id.clone(),
        image: s.image.clone(),
        image_digest: s.image_digest.clone(),
        hypervisor: vm_spec::backend_of(&s.hypervisor),
    }
}

/// `hibernate_evidence_total{verdict}` of a bring-up outcome, when it is about hibernate
/// evidence: read from the typed plan and refusal, never from the reason token.
pub fn evidence_verdict(outcome: &Outcome) -> Option<&'static str> {
    Some(match outcome {
        Outcome::Proceed(Plan::RestoreFromHibernate(_)) => "restored",
        Outcome::Refuse(Refusal { event, .. }) => match event {
            EventReason::HibernateImageConflict => "image_conflict",
            EventReason::HibernateSourceConflict => "source_conflict",
            EventReason::HibernateEvidenceUnavailable => "unavailable",
            _ => return None,
        },
        Outcome::Proceed(_) => return None,
    })
}

/// cgroup flags for cocoon from the translation policy's answer.
pub fn cpu_policy(p: &PolicyCpu) -> CpuPolicy {
    CpuPolicy {
        weight: u32::try_from(p.cpu_weight).unwrap_or(10_000),
        quota_us: p.cpu_quota_us.unwrap_or(0),
        period_us: p.cpu_period_us.unwrap_or(0),
    }
}

/// A decided backend this node cannot boot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("backend {0:?} is not one this node boots")]
pub struct UnknownBackend(pub String);

/// The runtime's backend for a decided one: unspecified is cocoon's default (cloud-hypervisor,
/// no flag). An unknown backend never gets here (the host refuses such a decision as invalid),
/// but if it did it is an error, not a guess.
pub fn backend(backend: &contract::Backend) -> Result<Backend, UnknownBackend> {
    match backend {
        contract::Backend::Unspecified | contract::Backend::CloudHypervisor => Ok(Backend::CloudHypervisor),
        contract::Backend::Firecracker => Ok(Backend::Firecracker),
        contract::Backend::Unknown(raw) => Err(UnknownBackend(raw.clone())),
    }
}

fn restore_mode(mode: PolicyRestoreMode) -> RestoreMode {
    match mode {
        PolicyRestoreMode::Copy => RestoreMode::Copy,
        PolicyRestoreMode::Ondemand => RestoreMode::OnDemand,
        PolicyRestoreMode::Mmap => RestoreMode::Mmap,
    }
}

/// The `vm clone` invocation of a plan's clone options.
pub fn clone_spec(
    options: &CloneOptions,
    source: CloneSource,
    pull: bool,
    cpu: CpuPolicy,
    nics: Option<u32>,
) -> Result<CloneSpec, UnknownBackend> {
    Ok(CloneSpec {
        name: Some(options.vm_name.clone()),
        network: (!options.network.is_empty()).then(|| options.network.clone()),
        no_direct_io: options.no_direct_io,
        pull,
        restore_mode: options.restore_mode.map(restore_mode),
        nics,
        cpu_policy: cpu,
        backend: backend(&options.backend)?,
        source,
    })
}

/// A snapshot taken on one backend, asked to boot on another.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("snapshot {snapshot} was taken with {recorded} but CocoonSet requests {wanted}")]
pub struct BackendMismatch {
    pub snapshot: String,
    pub recorded: String,
    pub wanted: String,
}

/// `assertSnapshotBackend`: a CH snapshot is never cloned onto FC and vice versa. `recorded` is
/// what cocoon recorded for the snapshot, decoded as every backend is.
pub fn assert_backend(
    snapshot: &str,
    recorded: &Hypervisor,
    wanted: &contract::Backend,
) -> Result<(), BackendMismatch> {
    let recorded_backend = vm_spec::backend_of(recorded);
    if recorded_backend == contract::Backend::Unspecified
        || *wanted == contract::Backend::Unspecified
        || recorded_backend == *wanted
    {
        Ok(())
    } else {
        let wanted = match wanted {
            contract::Backend::CloudHypervisor => "cloud-hypervisor",
            contract::Backend::Firecracker => "firecracker",
            contract::Backend::Unknown(raw) => raw.as_str(),
            contract::Backend::Unspecified => "",
        };
        Err(BackendMismatch {
            snapshot: snapshot.to_string(),
            recorded: recorded.as_str().to_string(),
            wanted: wanted.to_string(),
        })
    }
}

/// What the clone path does about a snapshot's base image before `vm clone --pull`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BaseImage {
    /// Nothing: no image, or an http(s) URL cocoon's `--pull` fetches itself.
    Skip,
    /// Present if `image inspect <digest>` succeeds; otherwise ensure the image ref.
    CheckDigest { digest: String, image: String },
    /// Ensure the image ref.
    Ensure(String),
}

pub fn base_image(snapshot: &SnapshotRecord) -> BaseImage {
    if snapshot.image.is_empty() || is_http(&snapshot.image) {
        BaseImage::Skip
    } else if !snapshot.image_digest.is_empty() {
        BaseImage::CheckDigest {
            digest: snapshot.image_digest.clone(),
            image: snapshot.image.clone(),
        }
    } else {
        BaseImage::Ensure(snapshot.image.clone())
    }
}

/// What an OCI manifest's artifact type means for the run path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactKind {
    CloudImage,
    Snapshot,
    Other,
}

/// By the artifact type alone, as the registry's classification reads it: a cloud image is
/// imported, a snapshot refused for mode=run, anything else pulled by cocoon.
pub fn artifact_kind(artifact_type: &str) -> ArtifactKind {
    use crate::registry::media::{self, ArtifactKind as Oci};
    match media::classify(None, Some(artifact_type), None) {
        Oci::CloudImage => ArtifactKind::CloudImage,
        Oci::SnapshotV1 | Oci::SnapshotV2 => ArtifactKind::Snapshot,
        _ => ArtifactKind::Other,
    }
}

/// MACs whose leases cocoon-net holds: NICs without a static address, lower-cased, de-duplicated.
pub fn dhcp_macs(vm: &VmRecord) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for nic in &vm.network_configs {
        if nic.network.as_ref().is_some_and(|n| !n.ip.is_empty()) {
            continue;
        }
        let mac = nic.mac.trim().to_ascii_lowercase();
        if !mac.is_empty() && !out.contains(&mac) {
            out.push(mac);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::parse::{Nic, NicNetwork};
    use std::collections::BTreeMap;

    #[test]
    fn registry_evidence_reads_the_recorded_image_and_owner() {
        let a = Artifact {
            annotations: BTreeMap::from([
                (BASE_IMAGE_ANNOTATION.to_string(), "img:1".to_string()),
                (OWNER_ANNOTATION.to_string(), "team-a/web-0".to_string()),
            ]),
            ..Artifact::default()
        };
        assert_eq!(
            registry_evidence::<String>(Ok(Some(&a))),
            HibernateEvidence::Found(FoundEvidence {
                source: EvidenceSource::Registry,
                recorded_image: "img:1".into(),
                recorded_owner: "team-a/web-0".into(),
            })
        );
        assert_eq!(registry_evidence::<String>(Ok(None)), HibernateEvidence::None);
        let legacy = Artifact::default();
        assert_eq!(
            registry_evidence::<String>(Ok(Some(&legacy))),
            HibernateEvidence::Found(FoundEvidence {
                source: EvidenceSource::Registry,
                recorded_image: String::new(),
                recorded_owner: String::new(),
            })
        );
        assert!(matches!(registry_evidence(Err("503")), HibernateEvidence::Unavailable(error) if error == "503"));
    }

    #[test]
    fn local_evidence_fails_closed_on_inconclusive_errors() {
        let nf = Err(RuntimeError::SnapshotNotFound {
            verb: "snapshot inspect".into(),
            reference: "v".into(),
            stderr: String::new(),
        });
        assert_eq!(local_evidence(&nf, String::new()), HibernateEvidence::None);
        let boom = Err(RuntimeError::Command {
            verb: "snapshot inspect".into(),
            code: Some(1),
            stderr: "db locked".into(),
        });
        assert!(matches!(
            local_evidence(&boom, String::new()),
            HibernateEvidence::Unavailable(_)
        ));
        assert!(matches!(
            local_evidence(&Ok(SnapshotRecord::default()), "ns/p".into()),
            HibernateEvidence::Found(FoundEvidence { recorded_owner, .. }) if recorded_owner == "ns/p"
        ));
    }

    #[test]
    fn backend_assertion_table() {
        use contract::Backend as B;
        assert!(assert_backend("s", &Hypervisor::Unspecified, &B::Firecracker).is_ok());
        assert!(assert_backend("s", &Hypervisor::CloudHypervisor, &B::Unspecified).is_ok());
        assert!(assert_backend("s", &Hypervisor::CloudHypervisor, &B::CloudHypervisor).is_ok());
        let e = assert_backend("s", &Hypervisor::CloudHypervisor, &B::Firecracker).unwrap_err();
        assert_eq!(
            e.to_string(),
            "snapshot s was taken with cloud-hypervisor but CocoonSet requests firecracker"
        );
        assert!(assert_backend("s", &Hypervisor::Firecracker, &B::CloudHypervisor).is_err());
        assert!(
            assert_backend("s", &"Firecracker".into(), &B::Firecracker).is_ok(),
            "recorded backends decode by the one rule"
        );
    }

    #[test]
    fn base_image_routes() {
        let snap = |image: &str, digest: &str| SnapshotRecord {
            image: image.into(),
            image_digest: digest.into(),
            ..Default::default()
        };
        assert_eq!(base_image(&snap("", "")), BaseImage::Skip);
        assert_eq!(base_image(&snap("https://x/img.qcow2", "sha256:1")), BaseImage::Skip);
        assert_eq!(
            base_image(&snap("ubuntu:24.04", "")),
            BaseImage::Ensure("ubuntu:24.04".into())
        );
        assert_eq!(
            base_image(&snap("ubuntu:24.04", "sha256:1")),
            BaseImage::CheckDigest {
                digest: "sha256:1".into(),
                image: "ubuntu:24.04".into()
            }
        );
    }

    #[test]
    fn artifact_kinds() {
        assert_eq!(
            artifact_kind("application/vnd.cocoonstack.os-image.v1+json"),
            ArtifactKind::CloudImage
        );
        assert_eq!(
            artifact_kind("application/vnd.cocoonstack.windows-image.v1+json"),
            ArtifactKind::CloudImage
        );
        assert_eq!(
            artifact_kind("application/vnd.cocoonstack.snapshot.v2+json"),
            ArtifactKind::Snapshot
        );
        assert_eq!(artifact_kind(""), ArtifactKind::Other);
    }

    #[test]
    fn clone_spec_carries_the_cgroup_flags_and_options() {
        let o = CloneOptions {
            vm_name: "vm1".into(),
            network: "".into(),
            no_direct_io: true,
            backend: contract::Backend::Firecracker,
            restore_mode: Some(PolicyRestoreMode::Mmap),
            drop_own_fork_snapshot: true,
        };
        let cpu = cpu_policy(&PolicyCpu {
            cpu_weight: 20,
            cpu_quota_us: Some(200_000),
            cpu_period_us: Some(100_000),
        });
        let spec = clone_spec(&o, CloneSource::Snapshot("snap".into()), true, cpu, None).unwrap();
        assert_eq!(spec.name.as_deref(), Some("vm1"));
        assert_eq!(spec.network, None);
        assert_eq!(spec.backend, Backend::Firecracker);
        assert_eq!(spec.restore_mode, Some(RestoreMode::Mmap));
        assert_eq!(
            spec.cpu_policy,
            CpuPolicy {
                weight: 20,
                quota_us: 200_000,
                period_us: 100_000
            }
        );
        let argv = crate::runtime::args::clone(&spec).join(" ");
        assert!(
            argv.contains("--cpu-weight 20 --cpu-quota-us 200000 --cpu-period-us 100000"),
            "{argv}"
        );
    }

    #[test]
    fn dhcp_macs_skip_static_nics_and_dedupe() {
        let nic = |mac: &str, ip: Option<&str>| Nic {
            mac: mac.into(),
            network: ip.map(|ip| NicNetwork {
                ip: ip.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let vm = VmRecord {
            network_configs: vec![
                nic("AA:BB:CC:00:00:01", None),
                nic("aa:bb:cc:00:00:01", None),
                nic("aa:bb:cc:00:00:02", Some("10.0.0.2")),
                nic(" aa:bb:cc:00:00:03 ", None),
            ],
            ..Default::default()
        };
        assert_eq!(dhcp_macs(&vm), vec!["aa:bb:cc:00:00:01", "aa:bb:cc:00:00:03"]);
    }

    #[test]
    fn naming_helpers() {
        assert_eq!(local_snapshot_name("myvm", "latest"), "myvm");
        assert_eq!(local_snapshot_name("myvm", "v2"), "myvm:v2");
        assert_eq!(parse_ref("repo:v2"), ("repo", "v2"));
        assert_eq!(fork_snapshot_name("vm"), "fork-vm");
        assert_eq!(hibernate_import_name("vm"), "vm-hibernate-import");
        let refused = |event| {
            Outcome::Refuse(Refusal {
                kind: contract::RefusalKind::NeedsOperator,
                event,
            })
        };
        assert_eq!(
            evidence_verdict(&refused(EventReason::HibernateImageConflict)),
            Some("image_conflict")
        );
        assert_eq!(evidence_verdict(&refused(EventReason::InvalidVmSpec)), None);
    }
}
