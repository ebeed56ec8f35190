//! Policy decision latency: every slot's default policy on the daemon's fresh-instance path
//! (a new pooled instance per decision, facts converted to WIT and back), beside the same
//! decision code called natively in the same process; plus the start-up cost of loading all
//! five slots from the compile cache, beside compiling them from scratch.
//!
//! Run: `cargo bench --bench policy_latency` (release profile). Prints a table; figures are
//! ratios to the native baseline measured in the same run.

use std::hint::black_box;
use std::time::{Duration, Instant};

use vk_cocoon::model::{PodFacts, VmSpec};
use vk_cocoon::policy::facts::{
    AdmissionContext, AdmissionFacts, BootOrigin, BootPath, BringUpFacts, ContainerResources, GuestFixupFacts,
    GuestNic, HibernateEvidence, PreassignedRuntime, SnapshotFacts, TranslationFacts,
};
use vk_cocoon::policy::{
    CompileCache, LoadedPolicy, Policies, PolicyEngine, PolicyMetrics, SandboxLimits, Slot, SlotFacts,
};

const WARMUP: usize = 500;
const SAMPLES: usize = 20_000;
const STARTUP_RUNS: usize = 15;

fn pod() -> PodFacts {
    let annotations = [
        ("vm.cocoonstack.io/name", "vk-ns-demo-0-505043"),
        ("cocoonset.cocoonstack.io/managed", "true"),
        ("cocoonset.cocoonstack.io/image", "agent-base:v3"),
        ("cocoonset.cocoonstack.io/snapshot-policy", "main-only"),
        ("cocoonset.cocoonstack.io/network", "net-a"),
    ];
    PodFacts {
        namespace: "ns".into(),
        name: "demo-0".into(),
        uid: "0b0d2a4e-5c43-4c6f-9f1e-0d5a9a2d7e11".into(),
        phase: "Running".into(),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        labels: [("cocoonset.cocoonstack.io/name".to_string(), "demo".to_string())].into(),
        node_selector: [("cocoonstack.io/snapshot-cpu-class".to_string(), "genoa".to_string())].into(),
        owner_references: vec![vk_cocoon::model::pod::OwnerRef {
            api_version: "cocoonset.cocoonstack.io/v1".into(),
            kind: "CocoonSet".into(),
            name: "demo".into(),
            uid: "cs-1".into(),
            controller: true,
        }],
    }
}

/// The guest-fixup row's VM: a firecracker clone with a static and a DHCP NIC, the policy's
/// longest script (MACs re-applied, one networkd file per NIC).
const FIXUP_BACKEND: &str = "firecracker";

fn fixup_nics() -> Vec<GuestNic> {
    vec![
        GuestNic {
            mac: "02:fc:00:00:00:01".into(),
            ip: "10.0.0.2".into(),
            gateway: "10.0.0.1".into(),
            prefix: 24,
        },
        GuestNic {
            mac: "02:fc:00:00:00:02".into(),
            ..GuestNic::default()
        },
    ]
}

fn host_facts(slot: Slot) -> SlotFacts {
    let pod = pod();
    let spec = VmSpec::decode(&pod.annotations);
    match slot {
        Slot::SnapshotBeforeDestroy => SlotFacts::SnapshotBeforeDestroy(SnapshotFacts {
            pod,
            spec,
            pusher_configured: true,
            vm_running: true,
        }),
        Slot::BringUp => SlotFacts::BringUp(BringUpFacts {
            pod,
            spec,
            vm_exists_locally: false,
            evidence: HibernateEvidence::None,
            registry_configured: true,
            local_snapshots: vec![],
            node_restore_mode: "mmap".into(),
            preassigned: PreassignedRuntime::default(),
        }),
        Slot::CpuClassAdmission => SlotFacts::CpuClassAdmission(AdmissionFacts {
            pod,
            context: AdmissionContext::Create,
            node_name: "node-a".into(),
            node_class: "genoa".into(),
        }),
        Slot::ResourceTranslation => SlotFacts::ResourceTranslation(TranslationFacts {
            pod,
            spec,
            path: BootPath::Run,
            resources: Some(ContainerResources {
                requests: [
                    ("cpu".to_string(), "500m".to_string()),
                    ("memory".to_string(), "2Gi".to_string()),
                ]
                .into(),
                limits: [("cpu".to_string(), "2".to_string())].into(),
            }),
        }),
        Slot::GuestFixup => SlotFacts::GuestFixup(GuestFixupFacts {
            pod,
            spec: VmSpec {
                backend: FIXUP_BACKEND.into(),
                ..spec
            },
            vm_id: "fc-0b0d2a4e".into(),
            hypervisor: FIXUP_BACKEND.into(),
            nics: fixup_nics(),
            origin: BootOrigin::Clone,
            source_image: "agent-base:v3".into(),
            cloudimg_overlay: false,
        }),
    }
}

/// The guests' own generated types for the native baseline: one builder per crate, fed the
/// same values as the host facts.
macro_rules! native_pod {
    ($types:path, $pod:expr) => {{
        use $types as t;
        let kv = |m: &std::collections::BTreeMap<String, String>| {
            m.iter()
                .map(|(k, v)| t::KeyValue {
                    key: k.clone(),
                    value: v.clone(),
                })
                .collect::<Vec<_>>()
        };
        let p = $pod;
        t::PodFacts {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            uid: p.uid.clone(),
            phase: p.phase.clone(),
            annotations: kv(&p.annotations),
            labels: kv(&p.labels),
            node_selector: kv(&p.node_selector),
            owner_references: p
                .owner_references
                .iter()
                .map(|o| t::OwnerReference {
                    api_version: o.api_version.clone(),
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                    controller: o.controller,
                })
                .collect(),
        }
    }};
}

macro_rules! native_spec {
    ($types:path, $spec:expr) => {{
        use $types as t;
        let s = $spec;
        t::VmSpec {
            vm_name: s.vm_name.clone(),
            image: s.image.clone(),
            mode: s.mode.clone(),
            os: s.os.clone(),
            storage: s.storage.clone(),
            network: s.network.clone(),
            snapshot_policy: s.snapshot_policy.clone(),
            fork_from: s.fork_from.clone(),
            clone_from_dir: s.clone_from_dir.clone(),
            managed: s.managed,
            force_pull: s.force_pull,
            no_direct_io: s.no_direct_io,
            conn_type: s.conn_type.clone(),
            backend: s.backend.clone(),
            probe_port: s.probe_port.clone(),
            restore_from_hibernate: s.restore_from_hibernate,
        }
    }};
}

/// One native decision of `slot`'s default policy, on facts built once.
fn native_decider(slot: Slot) -> Box<dyn Fn() -> usize> {
    let pod = pod();
    let spec = VmSpec::decode(&pod.annotations);
    match slot {
        Slot::SnapshotBeforeDestroy => {
            use snapshot_before_destroy_policy as p;
            let facts = p::Facts {
                pod: native_pod!(p::cocoonstack::vk_policy::types, &pod),
                spec: native_spec!(p::cocoonstack::vk_policy::types, &spec),
                pusher_configured: true,
                vm_running: true,
            };
            Box::new(move || p::decide(black_box(&facts)).message.len())
        }
        Slot::BringUp => {
            use bring_up_policy as p;
            let facts = p::Facts {
                pod: native_pod!(p::cocoonstack::vk_policy::types, &pod),
                spec: native_spec!(p::cocoonstack::vk_policy::types, &spec),
                vm_exists_locally: false,
                evidence: p::HibernateEvidence::None,
                registry_configured: true,
                local_snapshots: vec![],
                node_restore_mode: "mmap".into(),
                preassigned_vm_id: String::new(),
                preassigned_ip: String::new(),
                preassigned_vnc_port: String::new(),
            };
            Box::new(move || p::decide(black_box(&facts)).message.len())
        }
        Slot::CpuClassAdmission => {
            use cpu_class_admission_policy as p;
            let facts = p::Facts {
                pod: native_pod!(p::cocoonstack::vk_policy::types, &pod),
                context: p::AdmissionContext::Create,
                node_name: "node-a".into(),
                node_class: "genoa".into(),
            };
            Box::new(move || p::decide(black_box(&facts)).message.len())
        }
        Slot::ResourceTranslation => {
            use resource_translation_policy as p;
            use resource_translation_policy::cocoonstack::vk_policy::types::KeyValue;
            let kv = |k: &str, v: &str| KeyValue {
                key: k.into(),
                value: v.into(),
            };
            let facts = p::Facts {
                pod: native_pod!(p::cocoonstack::vk_policy::types, &pod),
                spec: native_spec!(p::cocoonstack::vk_policy::types, &spec),
                path: p::BootPath::Run,
                resources: Some(p::ContainerResources {
                    requests: vec![kv("cpu", "500m"), kv("memory", "2Gi")],
                    limits: vec![kv("cpu", "2")],
                }),
            };
            Box::new(move || p::decide(black_box(&facts)).message.len())
        }
        Slot::GuestFixup => {
            use guest_fixup_policy as p;
            let spec = VmSpec {
                backend: FIXUP_BACKEND.into(),
                ..spec
            };
            let facts = p::Facts {
                pod: native_pod!(p::cocoonstack::vk_policy::types, &pod),
                spec: native_spec!(p::cocoonstack::vk_policy::types, &spec),
                vm_id: "fc-0b0d2a4e".into(),
                hypervisor: FIXUP_BACKEND.into(),
                nics: fixup_nics()
                    .into_iter()
                    .map(|n| p::Nic {
                        mac: n.mac,
                        ip: n.ip,
                        gateway: n.gateway,
                        prefix: n.prefix,
                    })
                    .collect(),
                origin: p::BootOrigin::Clone,
                source_image: "agent-base:v3".into(),
                cloudimg_overlay: false,
            };
            Box::new(move || p::decide(black_box(&facts)).message.len())
        }
    }
}

struct Stats {
    p50: Duration,
    p99: Duration,
}

fn measure(mut f: impl FnMut(), samples: usize) -> Stats {
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = Instant::now();
        f();
        times.push(start.elapsed());
    }
    times.sort();
    Stats {
        p50: times[samples / 2],
        p99: times[samples * 99 / 100],
    }
}

fn us(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e6)
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is configurable.
    let engine = PolicyEngine::new(SandboxLimits::default()).expect("engine");
    println!("policy decision latency, {SAMPLES} samples per row after {WARMUP} warm-up decisions");
    println!(
        "{:<26} {:>12} {:>12} {:>13} {:>13} {:>10} {:>10}",
        "slot", "wasm p50 us", "wasm p99 us", "native p50 us", "native p99 us", "p50 ratio", "p99 ratio"
    );
    for slot in Slot::ALL {
        let policy = LoadedPolicy::builtin(&engine, None, slot).expect("default policy loads");
        let facts = host_facts(slot);
        let native = native_decider(slot);
        // A decision that misses its wall-clock deadline on a starved machine is counted, not fatal.
        let missed = std::cell::Cell::new(0usize);
        let wasm_once = || {
            if policy.decide(&engine, black_box(&facts)).is_err() {
                missed.set(missed.get() + 1);
            }
        };
        for _ in 0..WARMUP {
            wasm_once();
            black_box(native());
        }
        let wasm = measure(wasm_once, SAMPLES);
        let base = measure(
            || {
                black_box(native());
            },
            SAMPLES,
        );
        println!(
            "{:<26} {:>12} {:>12} {:>13} {:>13} {:>9.1}x {:>9.1}x",
            slot.name(),
            us(wasm.p50),
            us(wasm.p99),
            us(base.p50),
            us(base.p99),
            wasm.p50.as_secs_f64() / base.p50.as_secs_f64(),
            wasm.p99.as_secs_f64() / base.p99.as_secs_f64(),
        );
        if missed.get() > 0 {
            println!(
                "  ({} of {} decisions missed the deadline on this run)",
                missed.get(),
                WARMUP + SAMPLES
            );
        }
    }

    let cache_dir = tempfile::tempdir().expect("temp dir");
    let cache = CompileCache::new(cache_dir.path());
    let load_all = |cache: Option<CompileCache>| {
        let engine = PolicyEngine::new(SandboxLimits::default()).expect("engine");
        black_box(Policies::with_defaults(engine, cache, PolicyMetrics::unregistered()).expect("defaults load"));
    };
    load_all(Some(cache.clone())); // fill the cache
    let cold = measure(|| load_all(None), 3);
    let warm = measure(|| load_all(Some(cache.clone())), STARTUP_RUNS);
    println!();
    println!(
        "start-up: engine + all {} slots loaded and validated (median of runs)",
        Slot::ALL.len()
    );
    println!("{:<34} {:>10}", "path", "ms");
    println!("{:<34} {:>10}", "compiled from scratch (baseline)", ms(cold.p50));
    println!("{:<34} {:>10}", "from the compile cache", ms(warm.p50));
    println!(
        "{:<34} {:>9.1}x",
        "cache speed-up",
        cold.p50.as_secs_f64() / warm.p50.as_secs_f64()
    );
}
