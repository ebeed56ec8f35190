//! The sandbox, proven with hostile guests built by the test suite: an infinite loop, a memory
//! bomb, a trap, a wrong signature, a WASI import and an unknown contract version are stopped or
//! refused, the decision fails safe, and the host keeps serving other decisions. `compat`: the
//! 0.1.0 builds of the defaults.

mod compat;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use policy_artifacts::hostile;
use vk_cocoon::policy::contract::bring_up;
use vk_cocoon::policy::contract::cpu_class_admission::{self as admission, Verdict};
use vk_cocoon::policy::contract::guest_fixup::{self as fixup, FixupKind, Nic};
use vk_cocoon::policy::contract::resource_translation as translation;
use vk_cocoon::policy::contract::types::{EventReason, Refusal, RefusalKind};
use vk_cocoon::policy::input::{DecisionInput, facts_for};
use vk_cocoon::policy::slots::{BringUp, CpuClassAdmission, GuestFixup, ResourceTranslation};
use vk_cocoon::policy::{
    ContractVersion, DecisionError, LoadError, LoadedPolicy, Origin, Policies, PolicyEngine, PolicyMetrics, PolicySlot,
    SandboxLimits, Slot, SlotVisitor, with_slot,
};

/// The deadline is generous enough that the memory bomb always reaches the memory limit first,
/// even on a loaded machine; the infinite loop still has to be stopped by it.
const DEADLINE: Duration = Duration::from_millis(250);

fn engine() -> PolicyEngine {
    PolicyEngine::new(SandboxLimits {
        memory_bytes: 16 << 20,
        timeout: DEADLINE,
        max_concurrent: 8,
        ..SandboxLimits::default()
    })
    .expect("engine")
}

fn load<S: PolicySlot>(engine: &PolicyEngine, name: &str, bytes: &[u8]) -> Result<LoadedPolicy<S>, LoadError> {
    LoadedPolicy::load(engine, None, Origin::File(name.into()), bytes)
}

fn facts<S: PolicySlot>(yaml: &str) -> S::Facts {
    let input: DecisionInput = serde_yaml_ng::from_str(yaml).expect("input yaml");
    facts_for::<S>(&input).expect("facts")
}

/// A classified pod on a node of another class: the default policy must reject it.
fn mismatched_pod() -> admission::Facts {
    facts::<CpuClassAdmission>(
        "pod: {metadata: {namespace: ns, name: p}, spec: {nodeSelector: {cocoonstack.io/snapshot-cpu-class: a}}, status: {phase: Running}}\nhost: {node-class: b}",
    )
}

/// A pod whose class matches: the default policy admits it.
fn matching_pod() -> admission::Facts {
    facts::<CpuClassAdmission>(
        "pod: {metadata: {namespace: ns, name: p}, spec: {nodeSelector: {cocoonstack.io/snapshot-cpu-class: a}}, status: {phase: Running}}\nhost: {node-class: a}",
    )
}

fn managed_pod<S: PolicySlot>() -> S::Facts {
    facts::<S>(
        "pod: {metadata: {namespace: ns, name: p, annotations: {vm.cocoonstack.io/name: vm1, cocoonset.cocoonstack.io/managed: 'true', cocoonset.cocoonstack.io/image: 'snap:v1'}}}",
    )
}

#[test]
fn an_infinite_loop_is_stopped_at_the_deadline() {
    let engine = engine();
    let spin = load::<CpuClassAdmission>(&engine, "spin.wasm", hostile::SPIN_FOREVER).expect("a loop is valid at load");
    // The epoch clock sleeps while no decision is in flight: the loop must still be stopped.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !engine.clock_parked() {
        assert!(std::time::Instant::now() < deadline, "the idle clock parks");
        thread::yield_now();
    }
    let cpu_before = vk_cocoon::host::cpu::thread_cpu_time().expect("a per-thread CPU clock");
    let error = spin.decide(&engine, &matching_pod()).unwrap_err();
    let cpu_used = vk_cocoon::host::cpu::thread_cpu_time().unwrap() - cpu_before;
    assert_eq!(
        error,
        DecisionError::Timeout {
            slot: Slot::CpuClassAdmission,
            limit: DEADLINE
        }
    );
    assert!(error.to_string().contains("deadline"), "{error}");
    // Stopped at its CPU budget (the count starts within a tick of the decision), not later at
    // the wall cap: CPU time, so a loaded machine does not move it.
    assert!(
        cpu_used >= DEADLINE && cpu_used < DEADLINE + Duration::from_millis(100),
        "the loop used {cpu_used:?} of CPU against a {DEADLINE:?} deadline"
    );
}

#[test]
fn a_memory_bomb_hits_the_memory_limit() {
    let engine = engine();
    let bomb = load::<ResourceTranslation>(&engine, "bomb.wasm", hostile::MEMORY_BOMB).expect("valid at load");
    let error = bomb.decide(&engine, &managed_pod::<ResourceTranslation>()).unwrap_err();
    assert_eq!(
        error,
        DecisionError::OutOfMemory {
            slot: Slot::ResourceTranslation,
            limit_bytes: 16 << 20
        }
    );
}

#[test]
fn a_guest_that_catches_its_own_out_of_memory_is_still_out_of_memory() {
    let engine = engine();
    let bomb = load::<ResourceTranslation>(&engine, "bomb.wasm", hostile::MEMORY_BOMB).expect("valid at load");
    let catching = facts::<ResourceTranslation>(
        "pod: {metadata: {namespace: ns, name: p, annotations: {vm.cocoonstack.io/name: vm1, cocoonset.cocoonstack.io/managed: 'true', test.cocoonstack.io/bomb: catch}}}",
    );
    // The guest answers a permissive translation after memory.grow failed; the host reports the
    // limit instead of acting on it, so the slot fails safe like any out-of-memory policy.
    assert_eq!(
        bomb.decide(&engine, &catching).unwrap_err(),
        DecisionError::OutOfMemory {
            slot: Slot::ResourceTranslation,
            limit_bytes: 16 << 20
        }
    );
}

#[test]
fn a_component_beyond_the_limits_is_refused_at_load_naming_the_setting() {
    // The defaults start with two 64 KiB pages (their stack and data): a memory limit of one
    // page refuses them before compiling, with the setting to raise.
    let engine = PolicyEngine::new(SandboxLimits {
        memory_bytes: 64 << 10,
        ..SandboxLimits::default()
    })
    .unwrap();
    let Err(error) = LoadedPolicy::<CpuClassAdmission>::builtin(&engine, None) else {
        panic!("a component with more core instances than allowed must be refused");
    };
    let text = error.to_string();
    assert!(matches!(error, LoadError::TooLarge { .. }), "{error:?}");
    assert!(
        text.contains(
            "bytes of initial memory (in one memory), more than the limit of 65536: raise limits.memory-bytes"
        ) && text.contains("VK_POLICY_MEMORY_MIB"),
        "{text}"
    );
    assert!(!engine.has_large_pool(), "a refused component creates no pool");
    // With the defaults the same component runs in the small pool, and no large pool exists.
    let engine = PolicyEngine::new(SandboxLimits::default()).unwrap();
    let policy = LoadedPolicy::<CpuClassAdmission>::builtin(&engine, None).unwrap();
    assert!(!policy.is_large() && !engine.has_large_pool());
}

#[test]
fn a_panicking_policy_is_a_typed_trap() {
    let engine = engine();
    let trapper = load::<BringUp>(&engine, "trap.wasm", hostile::TRAPPER).expect("valid at load");
    match trapper.decide(&engine, &managed_pod::<BringUp>()).unwrap_err() {
        DecisionError::Trap { slot, trap } => {
            assert_eq!(slot, Slot::BringUp);
            assert!(trap.contains("unreachable"), "{trap}");
        }
        other => panic!("expected a trap, got {other:?}"),
    }
}

#[test]
fn a_wasi_importing_component_is_refused_at_load_naming_the_imports() {
    let engine = engine();
    let Err(error) = load::<CpuClassAdmission>(&engine, "wasi.wasm", hostile::WASI_IMPORTER) else {
        panic!("a WASI component must be refused");
    };
    match &error {
        LoadError::ForbiddenImports { imports, .. } => {
            assert!(imports.iter().any(|i| i.starts_with("wasi:")), "{imports:?}");
            assert!(
                !imports.iter().any(|i| i.contains("cocoonstack:vk-policy/types")),
                "{imports:?}"
            );
        }
        other => panic!("expected ForbiddenImports, got {other}"),
    }
    assert!(
        error.to_string().contains("no_std"),
        "the error says what to do: {error}"
    );
}

/// Loads `bytes` for a slot known at run time; the contract version it was bound to.
fn load_as(engine: &PolicyEngine, slot: Slot, name: &str, bytes: &[u8]) -> Result<ContractVersion, LoadError> {
    struct Load<'a>(&'a PolicyEngine, &'a str, &'a [u8]);
    impl SlotVisitor for Load<'_> {
        type Output = Result<ContractVersion, LoadError>;
        fn visit<S: PolicySlot>(self) -> Self::Output {
            load::<S>(self.0, self.1, self.2).map(|p| p.version())
        }
    }
    with_slot(slot, Load(engine, name, bytes))
}

#[test]
fn a_wasi_importing_component_is_refused_for_every_slot() {
    let engine = engine();
    for slot in Slot::ALL {
        match load_as(&engine, slot, "wasi.wasm", hostile::WASI_IMPORTER) {
            Err(LoadError::ForbiddenImports { .. }) => {}
            Err(other) => panic!("{slot}: expected ForbiddenImports, got {other}"),
            Ok(_) => panic!("{slot}: a WASI component was accepted"),
        }
    }
}

#[test]
fn each_default_serves_only_its_own_slot_at_the_current_contract() {
    let engine = engine();
    for own in Slot::ALL {
        for slot in Slot::ALL {
            match (
                own == slot,
                load_as(&engine, slot, "default.wasm", own.default_component()),
            ) {
                (true, Ok(version)) => assert_eq!(version, ContractVersion::V0_3_0),
                (false, Err(LoadError::WrongWorld { expected, .. })) => {
                    assert_eq!(expected, slot.export_name(ContractVersion::CURRENT))
                }
                (true, Err(error)) => panic!("the {own} default does not load for its slot: {error}"),
                (false, other) => panic!("the {own} default loaded as {slot} or failed oddly: {:?}", other.err()),
            }
        }
    }
}

#[test]
fn a_component_of_an_unknown_contract_version_is_refused_naming_the_versions_spoken() {
    let engine = engine();
    let Err(error) = load::<CpuClassAdmission>(&engine, "future.wasm", hostile::FUTURE_CONTRACT) else {
        panic!("a component of contract 0.9.0 must be refused");
    };
    assert!(
        matches!(&error, LoadError::UnsupportedVersion { found, .. } if found == "cocoonstack:vk-policy@0.9.0"),
        "{error}"
    );
    let text = error.to_string();
    assert!(text.contains("0.1.0, 0.2.0, 0.3.0") && text.contains("0.9.0"), "{text}");
}

#[test]
fn a_wrong_signature_is_refused_at_load_not_at_the_first_decision() {
    let engine = engine();
    let Err(error) = load::<CpuClassAdmission>(&engine, "wrong.wasm", hostile::WRONG_SIGNATURE) else {
        panic!("a component with the right names but the wrong types must be refused");
    };
    assert!(
        matches!(
            error,
            LoadError::ExportMismatch {
                slot: Slot::CpuClassAdmission,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("type mismatch"), "{error}");
}

#[test]
fn a_component_for_another_slot_is_a_wrong_world_listing_its_exports() {
    let engine = engine();
    let Err(error) = load::<BringUp>(&engine, "admission.wasm", Slot::CpuClassAdmission.default_component()) else {
        panic!("an admission policy cannot serve bring-up");
    };
    match &error {
        LoadError::WrongWorld { expected, found, .. } => {
            assert_eq!(expected, "cocoonstack:vk-policy/bring-up@0.3.0");
            assert_eq!(
                found,
                &vec!["cocoonstack:vk-policy/cpu-class-admission@0.3.0".to_string()]
            );
        }
        other => panic!("expected WrongWorld, got {other}"),
    }
}

#[test]
fn corrupt_bytes_and_core_modules_are_refused_with_a_reason() {
    let engine = engine();
    let cases: [(&[u8], &str); 4] = [
        (b"", "only 0 bytes"),
        (b"#!/bin/sh\necho hi\n", "magic bytes"),
        (b"\0asm\x01\0\0\0", "core WebAssembly module"),
        (
            &hostile::TRAPPER[..hostile::TRAPPER.len() / 2],
            "not a valid WebAssembly component",
        ),
    ];
    for (bytes, expected) in cases {
        let Err(error) = load::<BringUp>(&engine, "bad.wasm", bytes) else {
            panic!("{expected}: accepted")
        };
        assert!(matches!(error, LoadError::Corrupt { .. }), "{error}");
        assert!(
            error.to_string().contains(expected),
            "{error} should mention {expected:?}"
        );
    }
}

fn retry_later(event: EventReason) -> Refusal {
    Refusal {
        kind: RefusalKind::RetryLater,
        event,
    }
}

#[test]
fn failed_decisions_take_the_non_permissive_fail_safe_and_are_counted() {
    let engine = engine();
    let policies = Policies::with_defaults(engine.clone(), None, PolicyMetrics::unregistered()).unwrap();

    policies.install(load::<CpuClassAdmission>(&engine, "spin.wasm", hostile::SPIN_FOREVER).unwrap());
    let d = policies.decide::<CpuClassAdmission>(&matching_pod());
    assert_eq!(
        d.verdict,
        Verdict::Reject(retry_later(EventReason::CpuClassAdmissionPolicyFailed)),
        "a timed-out admission rejects even a matching pod, to be retried"
    );
    assert_eq!(d.reason, "policy-failed");
    assert!(d.message.contains("deadline"), "{}", d.message);

    policies.install(load::<BringUp>(&engine, "trap.wasm", hostile::TRAPPER).unwrap());
    let d = policies.decide::<BringUp>(&managed_pod::<BringUp>());
    assert_eq!(
        d.outcome,
        bring_up::Outcome::Refuse(retry_later(EventReason::BringUpPolicyFailed))
    );

    policies.install(load::<ResourceTranslation>(&engine, "bomb.wasm", hostile::MEMORY_BOMB).unwrap());
    let d = policies.decide::<ResourceTranslation>(&managed_pod::<ResourceTranslation>());
    assert_eq!(
        d.outcome,
        translation::Outcome::Refuse(retry_later(EventReason::ResourceTranslationPolicyFailed))
    );

    let metrics = policies.metrics();
    assert_eq!(
        metrics.failures(Slot::CpuClassAdmission, "timeout_retried"),
        1,
        "a missed deadline is retried once"
    );
    assert_eq!(metrics.failures(Slot::CpuClassAdmission, "timeout"), 1);
    assert_eq!(metrics.failures(Slot::BringUp, "trap"), 1);
    assert_eq!(metrics.failures(Slot::ResourceTranslation, "out_of_memory"), 1);
    assert_eq!(metrics.decisions(Slot::BringUp, "refuse"), 1);
}

fn fixup_facts(os: &str, backend: &str, nics: Vec<Nic>) -> fixup::Facts {
    let mut f = facts::<GuestFixup>(&format!(
        "pod: {{metadata: {{namespace: ns, name: p, annotations: {{vm.cocoonstack.io/name: vm1, vm.cocoonstack.io/id: id-1, cocoonset.cocoonstack.io/managed: 'true', cocoonset.cocoonstack.io/os: '{os}', vm.cocoonstack.io/backend: '{backend}'}}}}}}"
    ));
    f.nics = nics;
    f
}

/// The i-th NIC of a VM, with a static address.
fn nic(i: usize) -> Nic {
    Nic {
        mac: format!("02:fc:00:00:{:02x}:{:02x}", i / 256, i % 256),
        ip: format!("10.0.{}.{}", i / 250, i % 250 + 2),
        gateway: "10.0.0.1".into(),
        prefix: 16,
    }
}

#[test]
fn guest_fixups_come_back_typed_through_the_live_policies() {
    let policies = Policies::with_defaults(engine(), None, PolicyMetrics::unregistered()).unwrap();
    let d = policies.decide::<GuestFixup>(&fixup_facts("windows", "cloud-hypervisor", vec![nic(0)]));
    let fixup::Outcome::Run(f) = &d.outcome else {
        panic!("a windows clone needs a fixup: {d:?}")
    };
    assert_eq!(
        (f.kind, &f.argv[..3]),
        (FixupKind::Windows, &["powershell", "-nop", "-c"].map(String::from)[..])
    );

    let dhcp = Nic {
        ip: String::new(),
        ..nic(1)
    };
    let d = policies.decide::<GuestFixup>(&fixup_facts("", "firecracker", vec![nic(0), dhcp]));
    let fixup::Outcome::Run(f) = &d.outcome else {
        panic!("firecracker needs a fixup: {d:?}")
    };
    assert_eq!(
        (f.kind, &f.argv[..2]),
        (FixupKind::LinuxFc, &["sh", "-c"].map(String::from)[..])
    );
    assert!(
        f.argv[2].contains("ip link set dev eth1 address 02:fc:00:00:00:01"),
        "{}",
        f.argv[2]
    );

    let dhcp = Nic {
        ip: String::new(),
        ..nic(0)
    };
    let d = policies.decide::<GuestFixup>(&fixup_facts("", "cloud-hypervisor", vec![dhcp]));
    assert_eq!((d.outcome, d.reason.as_str()), (fixup::Outcome::None, "not-needed"));
    assert_eq!(policies.metrics().decisions(Slot::GuestFixup, "none"), 1);
}

#[test]
fn an_oversized_guest_fixup_is_invalid_and_fails_safe_to_running_nothing() {
    // Hundreds of NICs make the default's script longer than the host lets through exec.
    let policies = Policies::with_defaults(engine(), None, PolicyMetrics::unregistered()).unwrap();
    let d = policies.decide::<GuestFixup>(&fixup_facts("", "firecracker", (0..400).map(nic).collect()));
    assert_eq!(
        d.outcome,
        fixup::Outcome::Refuse(Refusal {
            kind: RefusalKind::Permanent,
            event: EventReason::PostClonePolicyFailed
        }),
        "{d:?}"
    );
    assert_eq!(d.reason, "policy-failed");
    assert!(
        d.message.contains("invalid decision") && d.message.contains("argv"),
        "{}",
        d.message
    );
    assert_eq!(policies.metrics().failures(Slot::GuestFixup, "invalid_decision"), 1);
}

#[test]
fn the_host_keeps_serving_while_hostile_guests_run() {
    let engine = engine();
    let spin = Arc::new(load::<CpuClassAdmission>(&engine, "spin.wasm", hostile::SPIN_FOREVER).unwrap());
    let good = Arc::new(LoadedPolicy::<CpuClassAdmission>::builtin(&engine, None).unwrap());

    let hostile_threads: Vec<_> = (0..3)
        .map(|_| {
            let (engine, spin) = (engine.clone(), spin.clone());
            thread::spawn(move || {
                for _ in 0..3 {
                    assert!(matches!(
                        spin.decide(&engine, &matching_pod()),
                        Err(DecisionError::Timeout { .. })
                    ));
                }
            })
        })
        .collect();
    // Meanwhile, and after every trap, the same engine keeps deciding correctly.
    for _ in 0..200 {
        let d = good
            .decide(&engine, &mismatched_pod())
            .expect("the default policy decides");
        assert!(matches!(d.verdict, Verdict::Reject(_)), "{d:?}");
        let d = good
            .decide(&engine, &matching_pod())
            .expect("the default policy decides");
        assert_eq!(d.verdict, Verdict::Admit);
    }
    for t in hostile_threads {
        t.join().expect("hostile decisions end with a timeout");
    }
    let trapper = load::<BringUp>(&engine, "trap.wasm", hostile::TRAPPER).unwrap();
    for _ in 0..3 {
        assert!(matches!(
            trapper.decide(&engine, &managed_pod::<BringUp>()),
            Err(DecisionError::Trap { .. })
        ));
    }
    let bring_up = LoadedPolicy::<BringUp>::builtin(&engine, None).unwrap();
    let decision = bring_up
        .decide(&engine, &managed_pod::<BringUp>())
        .expect("a trap does not poison the engine");
    assert_eq!(decision.reason, "clone");
}

#[test]
fn more_concurrent_decisions_than_the_pool_holds_wait_instead_of_failing() {
    let engine = PolicyEngine::new(SandboxLimits {
        max_concurrent: 2,
        ..SandboxLimits::default()
    })
    .unwrap();
    let policy = Arc::new(LoadedPolicy::<CpuClassAdmission>::builtin(&engine, None).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (engine, policy) = (engine.clone(), policy.clone());
            thread::spawn(move || (0..50).all(|_| policy.decide(&engine, &matching_pod()).is_ok()))
        })
        .collect();
    for t in threads {
        assert!(
            t.join().unwrap(),
            "every decision succeeded despite a pool of two instances"
        );
    }
}

#[test]
fn every_decision_gets_a_fresh_instance() {
    let engine = engine();
    let policies = Policies::with_defaults(engine.clone(), None, PolicyMetrics::unregistered()).unwrap();
    policies.install(load::<CpuClassAdmission>(&engine, "counter.wasm", hostile::CALL_COUNTER).unwrap());
    for round in 0..20 {
        // The guest counts its decisions in instance state: a reused instance would say 2.
        let d = policies.decide::<CpuClassAdmission>(&matching_pod());
        assert_eq!(d.message, "decision 1 of this instance", "round {round}");
    }
}

/// Pins the calling thread to CPU `cpu` (so that it competes with every thread pinned there).
#[allow(unsafe_code)]
fn pin_to(cpu: usize) {
    // SAFETY: the set is a plain bit mask on this stack; the call only reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0
        );
    }
}

/// A decision's deadline counts the CPU time its thread used, not the time it spent waiting for
/// a core: with the deciding thread sharing one core with four busy threads, decisions of the
/// default policy that were preempted mid-way (their wall time past the 2 ms deadline) still
/// decide, and an infinite loop is still stopped. (On a wall-clock deadline each preempted
/// decision timed out.)
#[test]
fn a_preempted_decision_keeps_its_deadline_but_a_loop_is_still_stopped() {
    const TIMEOUT: Duration = Duration::from_millis(2);
    let engine = PolicyEngine::new(SandboxLimits {
        timeout: TIMEOUT,
        ..SandboxLimits::default()
    })
    .unwrap();
    let good = LoadedPolicy::<CpuClassAdmission>::builtin(&engine, None).unwrap();
    let spin = load::<CpuClassAdmission>(&engine, "spin.wasm", hostile::SPIN_FOREVER).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hogs: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            thread::spawn(move || {
                pin_to(0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let (preempted, outcomes) = thread::spawn(move || {
        pin_to(0);
        let (mut preempted, mut outcomes) = (0, Vec::new());
        for _ in 0..20_000 {
            let started = std::time::Instant::now();
            let result = good.decide(&engine, &matching_pod());
            if started.elapsed() > TIMEOUT {
                preempted += 1;
                outcomes.push(result.map(|d| d.verdict));
            }
            if preempted == 5 {
                break;
            }
        }
        let looped = spin.decide(&engine, &matching_pod());
        assert!(
            matches!(looped, Err(DecisionError::Timeout { .. })),
            "the loop is stopped: {looped:?}"
        );
        (preempted, outcomes)
    })
    .join()
    .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    hogs.into_iter().for_each(|h| h.join().unwrap());
    assert_eq!(preempted, 5, "the busy core preempted decisions past their deadline");
    for outcome in outcomes {
        assert_eq!(outcome, Ok(Verdict::Admit), "a preempted decision still decides");
    }
}
