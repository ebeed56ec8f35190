//! Pure pieces of CreatePod and DeletePod: evidence from lookups, CLI specs from a policy's
//! plan, image routing, the backend assertion, which MACs own DHCP leases. No I/O.

use std::collections::BTreeMap;

use crate::policy::decision::{CloneOptions, CpuPolicy as PolicyCpu};
use crate::policy::facts::{EvidenceSource, HibernateEvidence, LocalSnapshot};
use crate::runtime::{Backend, CloneSource, CloneSpec, CpuPolicy, RestoreMode, RuntimeError, SnapshotRecord, VmRecord};

pub use vk_policy_support::naming::{
    DEFAULT_SNAPSHOT_TAG, HIBERNATE_SNAPSHOT_TAG, fork_snapshot_name, local_snapshot_name, parse_ref,
};

/// Manifest annotation recording the image a snapshot was taken from.
pub const BASE_IMAGE_ANNOTATION: &str = "cocoonstack.snapshot.baseimage";
/// Artifact types (behaviour spec §4b).
pub const CLOUD_IMAGE_TYPES: [&str; 2] = [
    "application/vnd.cocoonstack.os-image.v1+json",
    "application/vnd.cocoonstack.windows-image.v1+json",
];
pub const SNAPSHOT_TYPES: [&str; 2] = [
    "application/vnd.cocoonstack.snapshot.v1+json",
    "application/vnd.cocoonstack.snapshot.v2+json",
];

/// Local name a `:hibernate` pull is imported under.
pub fn hibernate_import_name(vm: &str) -> String {
    format!("{vm}-hibernate-import")
}

/// `vm.cocoonstack.io/hibernate: "true"` on the pod: the operator wants the guest parked.
pub fn hibernate_requested(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::model::annotations::HIBERNATE))
        .is_some_and(|v| v == "true")
}

/// `cocoonset.cocoonstack.io/managed: "true"`: vk-cocoon owns this pod's VM.
pub fn is_managed_pod(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(crate::model::annotations::MANAGED))
        .is_some_and(|v| v == "true")
}

/// `dropNIC`: a cloud-hypervisor Windows guest hibernates without its NIC and wakes with a
/// fresh one (exact strings, as cocoon-common compares them).
pub fn drop_nic(spec: &crate::model::VmSpec) -> bool {
    spec.backend == "cloud-hypervisor" && spec.os == "windows"
}

/// `isClonedBoot`: the VM came from a snapshot (an explicit clone source, or any mode but run).
pub fn is_cloned_boot(spec: &crate::model::VmSpec) -> bool {
    !spec.clone_from_dir.trim().is_empty() || !spec.fork_from.is_empty() || !spec.mode.eq_ignore_ascii_case("run")
}

/// `cmd /c ipconfig <verb>` in a Windows guest (`/release` before its NIC goes, `/renew` after).
pub fn ipconfig(verb: &str) -> crate::runtime::ExecSpec {
    crate::runtime::ExecSpec {
        argv: vec!["cmd".into(), "/c".into(), "ipconfig".into(), verb.into()],
        ..Default::default()
    }
}

pub fn is_http(reference: &str) -> bool {
    reference.starts_with("http://") || reference.starts_with("https://")
}

/// Evidence from the registry's `<vm>:hibernate` lookup: `Ok(None)` is the typed "tag absent".
pub fn registry_evidence<E: std::fmt::Display>(
    lookup: Result<Option<&BTreeMap<String, String>>, E>,
) -> HibernateEvidence {
    match lookup {
        Ok(None) => HibernateEvidence::None,
        Ok(Some(annotations)) => HibernateEvidence::Found {
            source: EvidenceSource::Registry,
            recorded_image: annotations.get(BASE_IMAGE_ANNOTATION).cloned().unwrap_or_default(),
        },
        Err(e) => HibernateEvidence::Unavailable { error: e.to_string() },
    }
}

/// Evidence on a registry-less node: a local snapshot named after the VM.
pub fn local_evidence(lookup: &Result<SnapshotRecord, RuntimeError>) -> HibernateEvidence {
    match lookup {
        Ok(_) => HibernateEvidence::Found {
            source: EvidenceSource::LocalSnapshot,
            recorded_image: String::new(),
        },
        Err(e) if e.is_snapshot_not_found() || e.is_not_found() => HibernateEvidence::None,
        Err(e) => HibernateEvidence::Unavailable { error: e.to_string() },
    }
}

pub fn local_snapshot_fact(s: &SnapshotRecord) -> LocalSnapshot {
    LocalSnapshot {
        name: s.name.clone(),
        id: s.id.clone(),
        image: s.image.clone(),
        image_digest: s.image_digest.clone(),
        hypervisor: s.hypervisor.clone(),
    }
}

/// `hibernate_evidence_total{verdict}` for a bring-up decision reason, when it is one.
pub fn evidence_verdict(reason: &str) -> Option<&'static str> {
    Some(match reason {
        "restore-derived" | "restore-explicit" => "restored",
        "image-conflict" => "image_conflict",
        "source-conflict" => "source_conflict",
        "hibernate-evidence-unavailable" | "hibernate-evidence-not-checked" => "unavailable",
        _ => return None,
    })
}

/// A bring-up refusal that can clear up by itself (registry back, policy fixed): retried.
/// Everything else needs the operator to change the pod.
pub fn refusal_is_transient(reason: &str) -> bool {
    matches!(
        reason,
        "hibernate-evidence-unavailable" | "hibernate-evidence-not-checked" | "policy-failed" | "snapshot-unavailable"
    )
}

/// The Event reason of a bring-up refusal, by the policy's reason token.
pub fn refusal_event_reason(reason: &str) -> &'static str {
    match reason {
        "hibernate-evidence-unavailable" | "hibernate-evidence-not-checked" => "HibernateEvidenceUnavailable",
        "image-conflict" | "source-conflict" => "HibernateSnapshotConflict",
        "hibernate-snapshot-missing" => "HibernateSnapshotMissing",
        "policy-failed" => "BringUpPolicyFailed",
        "backend-mismatch" => "SnapshotBackendMismatch",
        _ => "CreateBringUpFailed",
    }
}

/// cgroup flags for cocoon from the translation policy's answer.
pub fn cpu_policy(p: &PolicyCpu) -> CpuPolicy {
    CpuPolicy {
        weight: u32::try_from(p.cpu_weight).unwrap_or(10_000),
        quota_us: p.cpu_quota_us.unwrap_or(0),
        period_us: p.cpu_period_us.unwrap_or(0),
    }
}

pub fn backend(name: &str) -> Backend {
    Backend::from_hypervisor(name)
}

/// The `vm clone` invocation of a plan's clone options.
pub fn clone_spec(
    options: &CloneOptions,
    source: CloneSource,
    pull: bool,
    cpu: CpuPolicy,
    nics: Option<u32>,
) -> CloneSpec {
    CloneSpec {
        name: Some(options.vm_name.clone()),
        network: (!options.network.is_empty()).then(|| options.network.clone()),
        no_direct_io: options.no_direct_io,
        pull,
        restore_mode: RestoreMode::parse(&options.restore_mode),
        nics,
        cpu_policy: cpu,
        backend: backend(&options.backend),
        source,
    }
}

/// `assertSnapshotBackend`: a CH snapshot is never cloned onto FC and vice versa.
pub fn assert_backend(snapshot: &str, recorded: &str, wanted: &str) -> Result<(), String> {
    if recorded.is_empty() || wanted.is_empty() || recorded == wanted {
        Ok(())
    } else {
        Err(format!(
            "snapshot {snapshot} was taken with {recorded} but CocoonSet requests {wanted}"
        ))
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

pub fn artifact_kind(artifact_type: &str) -> ArtifactKind {
    if CLOUD_IMAGE_TYPES.contains(&artifact_type) {
        ArtifactKind::CloudImage
    } else if SNAPSHOT_TYPES.contains(&artifact_type) {
        ArtifactKind::Snapshot
    } else {
        ArtifactKind::Other
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

    #[test]
    fn registry_evidence_reads_the_recorded_image() {
        let a = BTreeMap::from([(BASE_IMAGE_ANNOTATION.to_string(), "img:1".to_string())]);
        assert_eq!(
            registry_evidence::<String>(Ok(Some(&a))),
            HibernateEvidence::Found {
                source: EvidenceSource::Registry,
                recorded_image: "img:1".into()
            }
        );
        assert_eq!(registry_evidence::<String>(Ok(None)), HibernateEvidence::None);
        let legacy = BTreeMap::new();
        assert_eq!(
            registry_evidence::<String>(Ok(Some(&legacy))),
            HibernateEvidence::Found {
                source: EvidenceSource::Registry,
                recorded_image: String::new()
            }
        );
        assert!(matches!(registry_evidence(Err("503")), HibernateEvidence::Unavailable { error } if error == "503"));
    }

    #[test]
    fn local_evidence_fails_closed_on_inconclusive_errors() {
        let nf = Err(RuntimeError::SnapshotNotFound {
            verb: "snapshot inspect".into(),
            reference: "v".into(),
            stderr: String::new(),
        });
        assert_eq!(local_evidence(&nf), HibernateEvidence::None);
        let boom = Err(RuntimeError::Command {
            verb: "snapshot inspect".into(),
            code: Some(1),
            stderr: "db locked".into(),
        });
        assert!(matches!(local_evidence(&boom), HibernateEvidence::Unavailable { .. }));
        assert!(matches!(
            local_evidence(&Ok(SnapshotRecord::default())),
            HibernateEvidence::Found { .. }
        ));
    }

    #[test]
    fn backend_assertion_table() {
        assert!(assert_backend("s", "", "firecracker").is_ok());
        assert!(assert_backend("s", "cloud-hypervisor", "").is_ok());
        assert!(assert_backend("s", "cloud-hypervisor", "cloud-hypervisor").is_ok());
        let e = assert_backend("s", "cloud-hypervisor", "firecracker").unwrap_err();
        assert_eq!(
            e,
            "snapshot s was taken with cloud-hypervisor but CocoonSet requests firecracker"
        );
        assert!(assert_backend("s", "firecracker", "cloud-hypervisor").is_err());
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
            backend: "firecracker".into(),
            restore_mode: "mmap".into(),
            drop_own_fork_snapshot: true,
        };
        let cpu = cpu_policy(&PolicyCpu {
            cpu_weight: 20,
            cpu_quota_us: Some(200_000),
            cpu_period_us: Some(100_000),
        });
        let spec = clone_spec(&o, CloneSource::Snapshot("snap".into()), true, cpu, None);
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
    fn nic_drop_and_cloned_boots() {
        let spec = |backend: &str, os: &str, mode: &str| crate::model::VmSpec {
            backend: backend.into(),
            os: os.into(),
            mode: mode.into(),
            ..Default::default()
        };
        assert!(drop_nic(&spec("cloud-hypervisor", "windows", "")));
        assert!(!drop_nic(&spec("firecracker", "windows", "")));
        assert!(
            !drop_nic(&spec("", "windows", "")),
            "an unspecified backend never drops a NIC"
        );
        assert!(!drop_nic(&spec("cloud-hypervisor", "Windows", "")), "exact strings");
        assert!(is_cloned_boot(&spec("", "", "")));
        assert!(!is_cloned_boot(&spec("", "", "RUN")));
        let fork_run = crate::model::VmSpec {
            mode: "run".into(),
            fork_from: "main".into(),
            ..Default::default()
        };
        assert!(is_cloned_boot(&fork_run), "fork-from overrides mode=run");
    }

    #[test]
    fn naming_helpers() {
        assert_eq!(local_snapshot_name("myvm", "latest"), "myvm");
        assert_eq!(local_snapshot_name("myvm", "v2"), "myvm:v2");
        assert_eq!(parse_ref("repo:v2"), ("repo", "v2"));
        assert_eq!(fork_snapshot_name("vm"), "fork-vm");
        assert_eq!(hibernate_import_name("vm"), "vm-hibernate-import");
        assert_eq!(evidence_verdict("image-conflict"), Some("image_conflict"));
        assert!(refusal_is_transient("hibernate-evidence-unavailable"));
        assert!(!refusal_is_transient("image-conflict"));
    }
}
