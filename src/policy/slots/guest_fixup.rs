//! Slot `guest-fixup`: after a clone, fork, clone-from-dir, wake or run, which commands must run
//! in the guest, and which static addresses must be set through its serial console, before it
//! is usable?

use wasmtime::Store;

use super::super::contract::guest_fixup::{BootOrigin, Decision, Facts, Fixup, FixupKind, Nic, Outcome, Pre, World};
use super::super::contract::types::{Backend, EventReason, Refusal, RefusalKind};
use super::super::contract::v0_1::guest_fixup as v0_1;
use super::super::contract::v0_2::guest_fixup as v0_2;
use super::super::limits::{MAX_ARGV_BYTES, MAX_HINT_BYTES, MAX_REASON_LEN};
use super::super::sandbox::Sandbox;
use super::{POLICY_FAILED, PodInput, PolicySlot, Slot, Summary, is_token, legacy, world_pre};
use crate::model::RuntimeAnnotations;

use v0_1::exports::cocoonstack::vk_policy::guest_fixup as old;

pub struct GuestFixup;

world_pre! {
    Pre<Sandbox> => World,
    v0_1::GuestFixupPolicyPre<Sandbox> => v0_1::GuestFixupPolicy,
    v0_2::GuestFixupPolicyPre<Sandbox> => v0_2::GuestFixupPolicy,
}

/// `cocoon_vk_postclone_total{kind}`.
pub fn kind_label(kind: FixupKind) -> &'static str {
    match kind {
        FixupKind::Windows => "windows",
        FixupKind::LinuxFc => "linux_fc",
        FixupKind::LinuxStatic => "linux_static",
        FixupKind::Other => "other",
    }
}

/// What the host answers for a component built before 0.3.0 after a `run`: it was never asked
/// there, and nothing ran (as before).
fn not_asked_before_0_3() -> Decision {
    Decision {
        outcome: Outcome::None,
        reason: "not-needed".into(),
        message: "a policy built before contract 0.3.0 is not asked after a run: nothing to do in the guest".into(),
    }
}

impl PolicySlot for GuestFixup {
    const SLOT: Slot = Slot::GuestFixup;
    const NAME: &'static str = "guest-fixup";
    const FAIL_SAFE_RULE: &'static str = "run nothing in the guest, mark the lifecycle failed and never publish Ready (the pod stays Running / Not Ready)";

    type Facts = Facts;
    type Decision = Decision;
    type Pre = Pre<Sandbox>;
    type V0_1Pre = v0_1::GuestFixupPolicyPre<Sandbox>;
    type V0_2Pre = v0_2::GuestFixupPolicyPre<Sandbox>;

    fn default_component() -> &'static [u8] {
        policy_artifacts::defaults::GUEST_FIXUP
    }

    fn call(world: &World, store: &mut Store<Sandbox>, facts: &Facts) -> wasmtime::Result<Decision> {
        world.cocoonstack_vk_policy_guest_fixup().call_decide(store, facts)
    }

    /// A 0.1.0 fixup kind was a free `[a-z0-9_-]` token and a metric label: the three the
    /// default used keep their label, any other valid token counts as `other`, and a malformed
    /// one is invalid (as it was). A 0.1.0 refusal failed the lifecycle at once: permanent.
    fn call_v0_1(
        world: &v0_1::GuestFixupPolicy,
        store: &mut Store<Sandbox>,
        facts: &Facts,
    ) -> wasmtime::Result<Result<Decision, String>> {
        let old_facts = old::Facts {
            pod: legacy::pod(&facts.pod),
            spec: legacy::spec(&facts.pod, &facts.spec),
            vm_id: facts.vm_id.clone(),
            hypervisor: legacy::backend_text(&facts.hypervisor),
            nics: facts
                .nics
                .iter()
                .map(|n| old::Nic {
                    mac: n.mac.clone(),
                    ip: n.ip.clone(),
                    gateway: n.gateway.clone(),
                    prefix: n.prefix,
                })
                .collect(),
            origin: match facts.origin {
                BootOrigin::Clone => old::BootOrigin::Clone,
                BootOrigin::Fork => old::BootOrigin::Fork,
                BootOrigin::CloneFromDir => old::BootOrigin::CloneFromDir,
                BootOrigin::Wake => old::BootOrigin::Wake,
                BootOrigin::Run => return Ok(Ok(not_asked_before_0_3())),
            },
            source_image: facts.source_image.clone(),
            cloudimg_overlay: facts.cloudimg_overlay,
        };
        let d = world
            .cocoonstack_vk_policy_guest_fixup()
            .call_decide(store, &old_facts)?;
        let outcome = match d.outcome {
            old::Outcome::None => Outcome::None,
            old::Outcome::Refuse => Outcome::Refuse(Refusal {
                kind: RefusalKind::Permanent,
                event: EventReason::PostCloneRefused,
            }),
            old::Outcome::Run(f) => {
                if !is_token(&f.kind, b"_") {
                    return Ok(Err(format!(
                        "fixup kind {:?} is not a token of [a-z0-9_-] of at most {MAX_REASON_LEN} bytes",
                        f.kind
                    )));
                }
                let kind = match f.kind.as_str() {
                    "windows" => FixupKind::Windows,
                    "linux_fc" => FixupKind::LinuxFc,
                    "linux_static" => FixupKind::LinuxStatic,
                    _ => FixupKind::Other,
                };
                Outcome::Run(Fixup {
                    kind,
                    argv: f.argv,
                    hint: f.hint,
                    console_addresses: Vec::new(),
                })
            }
        };
        Ok(Ok(Decision {
            outcome,
            reason: d.reason,
            message: d.message,
        }))
    }

    /// A 0.2.0 fixup has no console addresses: it sets none.
    fn call_v0_2(
        world: &v0_2::GuestFixupPolicy,
        store: &mut Store<Sandbox>,
        facts: &Facts,
    ) -> wasmtime::Result<Result<Decision, String>> {
        if facts.origin == BootOrigin::Run {
            return Ok(Ok(not_asked_before_0_3()));
        }
        let d = world
            .cocoonstack_vk_policy_guest_fixup()
            .call_decide(store, &legacy::down(facts)?)?;
        let mut d = serde_json::to_value(&d).map_err(wasmtime::Error::msg)?;
        if let Some(fixup) = d.pointer_mut("/outcome/Run").and_then(|f| f.as_object_mut()) {
            fixup.insert("console_addresses".into(), serde_json::Value::Array(Vec::new()));
        }
        Ok(legacy::up(&d))
    }

    fn fail_safe(_facts: &Facts, message: String) -> Decision {
        Decision {
            outcome: Outcome::Refuse(Refusal {
                kind: RefusalKind::Permanent,
                event: EventReason::PostClonePolicyFailed,
            }),
            reason: POLICY_FAILED.into(),
            message,
        }
    }

    /// A fixup the host can exec: the argv becomes `cocoon vm exec` arguments (a NUL cannot
    /// pass through exec), the hint an annotation, the console addresses SAC commands (dotted
    /// IPv4, a prefix the mask can express; the NIC's index is checked against the facts by the
    /// host).
    fn check(decision: &Decision) -> Result<(), String> {
        let Outcome::Run(fixup) = &decision.outcome else {
            return Ok(());
        };
        if fixup.argv.is_empty() && fixup.console_addresses.is_empty() {
            return Err("a run fixup needs a non-empty argv or console addresses".into());
        }
        for (i, a) in fixup.console_addresses.iter().enumerate() {
            if a.ip.parse::<std::net::Ipv4Addr>().is_err() {
                return Err(format!(
                    "console-addresses[{i}].ip {:?} is not a dotted IPv4 address",
                    a.ip
                ));
            }
            if !a.gateway.is_empty() && a.gateway.parse::<std::net::Ipv4Addr>().is_err() {
                return Err(format!(
                    "console-addresses[{i}].gateway {:?} is not a dotted IPv4 address",
                    a.gateway
                ));
            }
            if !(1..=32).contains(&a.prefix) {
                return Err(format!("console-addresses[{i}].prefix {} is not 1..=32", a.prefix));
            }
        }
        if let Some(i) = fixup.argv.iter().position(|arg| arg.contains('\0')) {
            return Err(format!("fixup argv[{i}] contains a NUL byte"));
        }
        let argv_bytes: usize = fixup.argv.iter().map(String::len).sum();
        if argv_bytes > MAX_ARGV_BYTES {
            return Err(format!("fixup argv is {argv_bytes} bytes, more than {MAX_ARGV_BYTES}"));
        }
        if fixup.hint.len() > MAX_HINT_BYTES {
            return Err(format!(
                "fixup hint is {} bytes, more than {MAX_HINT_BYTES}",
                fixup.hint.len()
            ));
        }
        Ok(())
    }

    fn summary(decision: &Decision) -> Summary<'_> {
        Summary {
            reason: &decision.reason,
            message: &decision.message,
            outcome: match decision.outcome {
                Outcome::None => "none",
                Outcome::Run(_) => "run",
                Outcome::Refuse(_) => "refuse",
            },
        }
    }

    /// A clone with no NICs and no cloud-image overlay; the VM id from the pod's
    /// `vm.cocoonstack.io/id` (the host writes it before any guest work); the hypervisor the
    /// pod's backend names, cloud-hypervisor (cocoon's default) when it names none.
    fn default_facts(pod: PodInput<'_>) -> Facts {
        let hypervisor = match &pod.spec.backend {
            Backend::Unspecified => Backend::CloudHypervisor,
            other => other.clone(),
        };
        Facts {
            vm_id: RuntimeAnnotations::of_pod(pod.pod).vm_id,
            pod: pod.facts,
            spec: pod.spec,
            hypervisor,
            nics: Vec::<Nic>::new(),
            origin: BootOrigin::Clone,
            source_image: String::new(),
            cloudimg_overlay: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::contract::guest_fixup::ConsoleAddress;
    use super::*;

    fn run(argv: &[&str], hint: &str) -> Decision {
        Decision {
            outcome: Outcome::Run(Fixup {
                kind: FixupKind::LinuxStatic,
                argv: argv.iter().map(|a| a.to_string()).collect(),
                hint: hint.into(),
                console_addresses: Vec::new(),
            }),
            reason: "linux-static".into(),
            message: "m".into(),
        }
    }

    #[test]
    fn fixups_the_host_cannot_exec_are_invalid() {
        assert_eq!(GuestFixup::check(&run(&["sh", "-c", "true"], "")), Ok(()));
        let big = "x".repeat((64 << 10) + 1);
        let half = "x".repeat(32 << 10);
        let bad = [
            (run(&[], ""), "non-empty argv or console addresses"),
            (run(&["sh", "-c", "a\0b"], ""), "argv[2] contains a NUL"),
            (run(&["sh", &half, &half], ""), "more than 65536"),
            (run(&["sh"], &big), "hint is 65537 bytes"),
        ];
        for (decision, expected) in bad {
            let error = GuestFixup::check(&decision).unwrap_err();
            assert!(error.contains(expected), "{error} should mention {expected:?}");
        }
        let console = |ip: &str, prefix: u32, gateway: &str| {
            let mut d = run(&[], "");
            if let Outcome::Run(f) = &mut d.outcome {
                f.console_addresses = vec![ConsoleAddress {
                    nic: 0,
                    ip: ip.into(),
                    prefix,
                    gateway: gateway.into(),
                }];
            }
            d
        };
        assert_eq!(
            GuestFixup::check(&console("10.0.0.2", 24, "10.0.0.1")),
            Ok(()),
            "addresses alone"
        );
        assert_eq!(GuestFixup::check(&console("10.0.0.2", 24, "")), Ok(()), "no gateway");
        for (d, expected) in [
            (console("10.0.0.2\ni 1 6.6.6.6", 24, ""), "is not a dotted IPv4"),
            (console("10.0.0.2", 24, "gw"), "gateway \"gw\""),
            (console("10.0.0.2", 0, ""), "prefix 0"),
        ] {
            let error = GuestFixup::check(&d).unwrap_err();
            assert!(error.contains(expected), "{error} should mention {expected:?}");
        }
        let mut bad_reason = run(&["sh"], "");
        bad_reason.reason = "linux_fc".into();
        assert!(
            super::super::validate::<GuestFixup>(&bad_reason)
                .unwrap_err()
                .contains("lower-kebab-case")
        );
    }

    #[test]
    fn a_failed_guest_fixup_policy_runs_nothing_and_fails_for_good() {
        let d = GuestFixup::fail_safe(
            &GuestFixup::default_facts(PodInput {
                pod: &Default::default(),
                facts: crate::model::pod_facts(&Default::default()),
                spec: crate::model::vm_spec::decode(&Default::default()),
            }),
            "policy guest-fixup trapped".into(),
        );
        assert_eq!(
            d.outcome,
            Outcome::Refuse(Refusal {
                kind: RefusalKind::Permanent,
                event: EventReason::PostClonePolicyFailed
            })
        );
        assert_eq!(d.reason, POLICY_FAILED);
    }
}
