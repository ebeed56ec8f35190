//! Hibernate and wake end to end: fake apiserver + cocoon-sim + Debian's docker-registry on
//! loopback + the real registry client. The guest's state is never in neither place: every
//! fault (save, push, remove, the registry down during verification, the pull) leaves it in the
//! VM or in the registry, the pod recoverable, and the owed retry finishes the job.

mod faults;
mod nic;
pub(crate) mod peer_tier;
mod restarts;
use crate::provider_support;
use crate::{registry_support, runtime_support};

use std::time::Duration;

use cocoon_sim::{Fault, FaultAction};
use provider_support::*;
use vk_cocoon::provider::Timings;
use vk_cocoon::registry::ManifestLookup;

const IMAGE: &str = "cocoonset.cocoonstack.io/image";
const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";
const ID: &str = "vm.cocoonstack.io/id";

fn oci(env: &Env) -> &Oci {
    env.oci.as_ref().expect("these tests run against a real registry")
}

async fn tag_exists(env: &Env, vm: &str) -> bool {
    matches!(
        oci(env).client.manifest(vm, "hibernate").await,
        Ok(ManifestLookup::Found(_))
    )
}

/// The invariant: the guest is in its VM or in the registry.
async fn state_somewhere(env: &Env, vm: &str) -> bool {
    vm_named(env, vm).await.is_some() || tag_exists(env, vm).await
}

/// The lifecycle says `ready` and so does the Ready condition.
fn is_up(env: &Env, pod: &str) -> bool {
    lifecycle(env, pod).as_deref() == Some("ready") && ready(env, pod)
}

async fn ready_pod(env: &Env, pod: &str, vm: &str) {
    create(env, &managed(pod, vm, &[(IMAGE, "base")])).await;
    eventually(30, &format!("{pod} ready"), || is_up(env, pod)).await;
}

async fn hibernated(env: &Env, pod: &str) {
    eventually(30, &format!("{pod} hibernated"), || {
        lifecycle(env, pod).as_deref() == Some("hibernated")
    })
    .await;
}

/// Asks for the hibernate and waits until it is reported done.
async fn hibernate_now(env: &Env, pod: &str) {
    annotate(env, pod, &[(HIBERNATE, Some("true"))]).await;
    hibernated(env, pod).await;
}

/// Slow retries, so a test can look at the state a failure left before the retry repairs it.
fn slow_retries() -> Options {
    Options {
        timings: Timings {
            op_retry_min: Duration::from_millis(1500),
            op_retry_max: Duration::from_secs(3),
            ..fast_timings()
        },
        ..Default::default()
    }
}

/// Drops the Node object, so a test can tell when the next daemon has registered.
async fn forget_node(env: &Env) {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(env.server.client());
    let _ = nodes.delete(NODE, &Default::default()).await;
}

fn node_registered(env: &Env) -> bool {
    env.server
        .store()
        .get_as::<k8s_openapi::api::core::v1::Node>(None, NODE)
        .is_some()
}

fn fail(stderr: &str) -> FaultAction {
    FaultAction::Fail {
        stdout: String::new(),
        stderr: stderr.into(),
        exit_code: 1,
    }
}

/// The next `verb` (on `arg`, when given) fails once, exit 1, with cocoon's `stderr` text.
fn fail_once(env: &Env, verb: &str, arg: Option<&str>, stderr: &str) {
    env.sim
        .add_fault(Fault {
            verb: verb.into(),
            match_arg: arg.map(Into::into),
            times: Some(1),
            action: fail(stderr),
        })
        .unwrap();
}

/// Lifecycle: L18, L53, L55, L59, L61.
/// Checklist rows: create_test/HandleVMGoneSkippedWhenPodHibernating
#[tokio::test(flavor = "multi_thread")]
async fn hibernate_then_wake_round_trips_the_guest_through_the_registry() {
    let env = env_with_oci().await;
    env.sim.set_settings(|s| s.snapshot_cow_bytes = 4 << 20).unwrap();
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-h").await;
    let first = vm_named(&env, "vm-h").await.unwrap();

    hibernate_now(&env, "agent-0").await;
    assert!(vm_named(&env, "vm-h").await.is_none(), "the VM is removed");
    assert!(tag_exists(&env, "vm-h").await, "the guest is in vm-h:hibernate");
    let artifact = match oci(&env).client.manifest("vm-h", "hibernate").await.unwrap() {
        ManifestLookup::Found(a) => a,
        ManifestLookup::Absent => unreachable!(),
    };
    assert_eq!(
        artifact.annotations["cocoonstack.snapshot.baseimage"], "base",
        "the pod's image is recorded for the wake guard"
    );
    assert_eq!(
        annotation(&env, "agent-0", ID),
        None,
        "the runtime annotations are cleared"
    );
    eventually(10, "Hibernated event", || {
        events(&env, "agent-0")
            .iter()
            .any(|(r, n)| r == "Hibernated" && n == "snapshot pushed to registry")
    })
    .await;
    eventually(10, "the pod stays alive", || {
        phase(&env, "agent-0").as_deref() == Some("Running") && !ready(&env, "agent-0")
    })
    .await;
    let m = d.provider.metrics();
    for phase in ["snapshot", "push", "remove"] {
        assert_eq!(
            m.hibernate.with_label_values(&[phase, "ok"]).get(),
            1,
            "hibernate_total{{{phase},ok}}"
        );
    }

    // The registry holds the guest byte for byte: pull it into another node's store and compare.
    let local = env
        .sim
        .snapshot_dir("vm-h")
        .unwrap()
        .expect("the saved snapshot stays as a warm local copy");
    let other = tempfile::tempdir().unwrap();
    let other_sim = cocoon_sim::Sim::new(other.path()).unwrap();
    let other_rt = vk_cocoon::runtime::CocoonCli::new(runtime_support::config(&other_sim));
    oci(&env)
        .client
        .pull_snapshot(&other_rt, "vm-h", "hibernate", "check")
        .await
        .unwrap();
    let pulled = other_sim.snapshot_dir("check").unwrap().unwrap();
    assert_eq!(
        registry_support::dir_files(&pulled),
        registry_support::dir_files(&local),
        "the registry copy is the guest, byte for byte"
    );

    // Wake from the registry (the warm copy is gone, as on another node).
    env.runtime.snapshot_remove_if_exists("vm-h").await.unwrap();
    annotate(&env, "agent-0", &[(HIBERNATE, None)]).await;
    eventually(30, "woken and ready", || is_up(&env, "agent-0")).await;
    let woken = vm_named(&env, "vm-h").await.expect("a VM again");
    assert_ne!(woken.id, first.id, "a new incarnation of the guest");
    assert_eq!(annotation(&env, "agent-0", ID).as_deref(), Some(woken.id.as_str()));
    let clone = calls(&env, "vm clone").last().unwrap().join(" ");
    assert!(
        clone.ends_with("vm-h-hibernate-import") && clone.contains("--restore-mode mmap"),
        "{clone}"
    );
    assert!(
        clone.contains("--cpu-weight"),
        "the cgroup flags come with every clone: {clone}"
    );
    eventually(10, "Woken event", || {
        events(&env, "agent-0")
            .iter()
            .any(|(r, n)| r == "Woken" && n == "cloned from registry vm-h:hibernate")
    })
    .await;
    assert!(
        tag_exists(&env, "vm-h").await,
        "the daemon never deletes the :hibernate tag"
    );
    eventually(10, "the import is cleaned up", || {
        env.sim.snapshot_dir("vm-h-hibernate-import").unwrap().is_none()
    })
    .await;
    assert_eq!(m.wake.with_label_values(&["ok"]).get(), 1);
    assert_eq!(
        m.wake_ip_wait.with_label_values(&["ok"]).get(),
        2,
        "the create and the wake each waited for the lease"
    );

    // Second cycle: the warm local copy is verified against the tag and used.
    hibernate_now(&env, "agent-0").await;
    annotate(&env, "agent-0", &[(HIBERNATE, None)]).await;
    eventually(30, "woken again", || is_up(&env, "agent-0")).await;
    assert!(
        calls(&env, "vm clone").last().unwrap().last().map(String::as_str) == Some("vm-h"),
        "cloned from the verified local copy"
    );
    assert_eq!(m.snapshot_verify.with_label_values(&["ok"]).get(), 1);
    d.kill().await;
}

/// Lifecycle: L10.
/// Checklist rows: delete_test/SnapshotRetention
#[tokio::test(flavor = "multi_thread")]
async fn a_seat_release_keeps_the_warm_copy_and_a_cross_node_wake_restores_only_on_a_matching_class() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let class = [("cocoonstack.io/snapshot-cpu-class", "genoa")];
    let mut pod = managed("agent-0", "vm-x", &[(IMAGE, "base")]);
    pod.spec.as_mut().unwrap().node_selector =
        Some(class.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    let d = start(
        &env,
        Options {
            node_class: "genoa".into(),
            ..Default::default()
        },
    );
    create(&env, &pod).await;
    eventually(30, "ready", || lifecycle(&env, "agent-0").as_deref() == Some("ready")).await;
    hibernate_now(&env, "agent-0").await;
    // hibernatePolicy: release — the operator flags the seat release and deletes the pod.
    annotate(
        &env,
        "agent-0",
        &[("vm.cocoonstack.io/keep-snapshot-on-delete", Some("true"))],
    )
    .await;
    delete(&env, "agent-0").await;
    eventually(30, "pod gone", || get(&env, "agent-0").is_none()).await;
    assert!(
        env.sim.snapshot_dir("vm-x").unwrap().is_some(),
        "the seat release keeps the warm local copy"
    );
    d.kill().await;

    // The node comes back with another CPU class: the rebuilt pod, scheduled to it once it has
    // registered, must not resume here.
    forget_node(&env).await;
    let d = start(
        &env,
        Options {
            node_class: "skylake".into(),
            ..Default::default()
        },
    );
    eventually(20, "node registered", || node_registered(&env)).await;
    let mut rebuilt = managed(
        "agent-0",
        "vm-x",
        &[(IMAGE, "base"), ("vm.cocoonstack.io/restore-from-hibernate", "true")],
    );
    rebuilt.spec.as_mut().unwrap().node_selector = pod.spec.as_ref().unwrap().node_selector.clone();
    create(&env, &rebuilt).await;
    eventually(20, "refused", || has_event(&env, "agent-0", "SnapshotCPUClassMismatch")).await;
    eventually(20, "published failed", || {
        phase(&env, "agent-0").as_deref() == Some("Failed")
    })
    .await;
    assert!(
        vm_named(&env, "vm-x").await.is_none(),
        "nothing resumed on a foreign CPU class"
    );
    assert!(
        env.sim.snapshot_dir("vm-x").unwrap().is_some(),
        "a refused pod touches no snapshot"
    );
    // The operator moves the seat on again (still a release: the warm copy stays).
    annotate(
        &env,
        "agent-0",
        &[("vm.cocoonstack.io/keep-snapshot-on-delete", Some("true"))],
    )
    .await;
    delete(&env, "agent-0").await;
    eventually(30, "pod gone", || get(&env, "agent-0").is_none()).await;
    d.kill().await;

    // On a node of the right class the same rebuilt pod restores from the verified warm copy.
    forget_node(&env).await;
    let d = start(
        &env,
        Options {
            node_class: "genoa".into(),
            ..Default::default()
        },
    );
    eventually(20, "node registered", || node_registered(&env)).await;
    create(&env, &rebuilt).await;
    eventually(30, "restored and ready", || is_up(&env, "agent-0")).await;
    assert_eq!(
        calls(&env, "vm clone").last().unwrap().last().map(String::as_str),
        Some("vm-x"),
        "the warm copy, verified against the tag"
    );
    assert_eq!(d.provider.metrics().snapshot_verify.with_label_values(&["ok"]).get(), 1);
    d.kill().await;
}

/// Lifecycle: L51.
#[tokio::test(flavor = "multi_thread")]
async fn an_unrelated_update_is_a_noop_without_a_status_echo() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-q").await;
    // Observation windows, not synchronisation: a status write comes from the controller at once
    // or from the status reconciler within one period.
    let window = fast_timings().status_period * 2;
    tokio::time::sleep(window).await;
    let status_writes = |env: &Env| {
        env.server
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH" && r.path.ends_with("/agent-0/status"))
            .count()
    };
    let before = status_writes(&env);
    let noops = d.provider.metrics().lifecycle_count("update", "skipped", "noop");
    annotate(&env, "agent-0", &[("example.com/owner", Some("team-a"))]).await;
    eventually(10, "the update was seen", || {
        d.provider.metrics().lifecycle_count("update", "skipped", "noop") > noops
    })
    .await;
    tokio::time::sleep(window).await;
    assert_eq!(status_writes(&env), before, "no status echo");
    assert!(vm_named(&env, "vm-q").await.is_some() && ready(&env, "agent-0"));
    d.kill().await;
}

/// The cocoon-operator does not drop `<vm>:hibernate` after a CocoonSet resume, so the tag of a
/// guest that was woken lingers. A pod recreated later under the same VM name (a sub-agent slot
/// coming back, a CocoonSet rebuilt) must boot fresh, not restore the guest as it was before the
/// wake — even across a daemon restart. A genuine hibernate after that is restored as ever.
#[tokio::test(flavor = "multi_thread")]
async fn a_hibernate_tag_left_behind_after_a_wake_is_not_restored_into_a_recreated_pod() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    let never = ("cocoonset.cocoonstack.io/snapshot-policy", "never");
    create(&env, &managed("agent-0", "vm-w", &[(IMAGE, "base"), never])).await;
    eventually(30, "agent-0 ready", || is_up(&env, "agent-0")).await;
    hibernate_now(&env, "agent-0").await;
    annotate(&env, "agent-0", &[(HIBERNATE, None)]).await;
    eventually(30, "woken", || is_up(&env, "agent-0")).await;
    assert!(
        tag_exists(&env, "vm-w").await,
        "the operator's leftover tag is still there"
    );
    d.kill().await;

    // A restarted daemon remembers which guest it woke under that name.
    let d = start(&env, Options::default());
    delete(&env, "agent-0").await;
    eventually(30, "pod gone", || get(&env, "agent-0").is_none()).await;
    assert!(vm_named(&env, "vm-w").await.is_none(), "the VM went with its pod");
    create(&env, &managed("agent-0", "vm-w", &[(IMAGE, "base"), never])).await;
    eventually(30, "recreated and ready", || is_up(&env, "agent-0")).await;
    let clone = calls(&env, "vm clone").last().unwrap().join(" ");
    assert!(
        clone.ends_with(" base"),
        "the recreated pod boots fresh from its image, not from the woken guest's old tag: {clone}"
    );

    // A new hibernate of the recreated guest is hibernated state again, and its wake restores it.
    hibernate_now(&env, "agent-0").await;
    annotate(&env, "agent-0", &[(HIBERNATE, None)]).await;
    eventually(30, "woken again", || is_up(&env, "agent-0")).await;
    let clone = calls(&env, "vm clone").last().unwrap().join(" ");
    assert!(
        clone.ends_with(" vm-w") || clone.ends_with(" vm-w-hibernate-import"),
        "the second hibernate's guest is restored: {clone}"
    );
    d.kill().await;
}

/// A hibernate clears the pod's address before it removes the VM; while a slow `vm rm` runs,
/// the status reconciler (every 400 ms here) must not write the address back, and the
/// hibernated pod's status must name no IP either (a status merge patch keeps a field it leaves
/// out): cocoon-net may lease that address to another guest.
#[tokio::test(flavor = "multi_thread")]
async fn a_hibernated_pod_names_no_address_even_when_its_vm_is_slow_to_go() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-s").await;
    eventually(10, "the pod names its address", || pod_ip(&env, "agent-0").is_some()).await;
    env.sim
        .add_fault(Fault {
            verb: "vm rm".into(),
            match_arg: None,
            times: Some(1),
            action: FaultAction::Delay { ms: 2000 },
        })
        .unwrap();
    hibernate_now(&env, "agent-0").await;
    assert_eq!(
        annotation(&env, "agent-0", "vm.cocoonstack.io/ip"),
        None,
        "no address annotation on the hibernated pod"
    );
    eventually(10, "a Hibernated status with no pod IP", || {
        pod_ip(&env, "agent-0").is_none() && !ready(&env, "agent-0")
    })
    .await;
    let pod = get(&env, "agent-0").unwrap();
    assert_eq!(pod.status.unwrap().pod_ips, None, "no podIPs either");
    d.kill().await;
}

/// The CPU-class gate runs in UpdatePod too: a hibernated pod that now asks for another CPU
/// class than the node's is not woken here (the snapshot's memory image would resume on a CPU
/// it was not taken on); the refusal is an Event on the pod and counted under its own reason.
/// (A real apiserver does not let a pod's node selector change; the gate does not rely on it.)
/// Lifecycle: L2
/// Lifecycle: L5.
#[tokio::test(flavor = "multi_thread")]
async fn a_wake_on_a_foreign_cpu_class_is_refused_by_the_update_gate() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let mut pod = managed("agent-0", "vm-cc", &[(IMAGE, "base")]);
    pod.spec.as_mut().unwrap().node_selector =
        Some([("cocoonstack.io/snapshot-cpu-class".to_string(), "genoa".to_string())].into());
    let d = start(
        &env,
        Options {
            node_class: "genoa".into(),
            ..Default::default()
        },
    );
    create(&env, &pod).await;
    eventually(30, "ready", || is_up(&env, "agent-0")).await;
    hibernate_now(&env, "agent-0").await;
    let boots = calls(&env, "vm clone").len();
    // The wake and a foreign class arrive in one update.
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(env.server.client(), "default");
    let patch = serde_json::json!({
        "metadata": {"annotations": {HIBERNATE: null}},
        "spec": {"nodeSelector": {"cocoonstack.io/snapshot-cpu-class": "skylake"}},
    });
    pods.patch(
        "agent-0",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
    eventually(20, "the update refused with an Event", || {
        events(&env, "agent-0")
            .iter()
            .any(|(reason, note)| reason == "SnapshotCPUClassMismatch" && note.starts_with("update:"))
    })
    .await;
    let m = d.provider.metrics();
    assert!(m.lifecycle_count("update", "failed", "snapshot_cpu_class_mismatch") >= 1);
    assert_eq!(
        m.lifecycle_count("update", "failed", ""),
        0,
        "counted once, under its reason"
    );
    assert_eq!(calls(&env, "vm clone").len(), boots, "nothing woken");
    assert!(vm_named(&env, "vm-cc").await.is_none());
    assert!(tag_exists(&env, "vm-cc").await, "the hibernated state is untouched");
    d.kill().await;
}

/// A wake starts the guest's runtime record afresh: a post-clone marker left from the boot
/// before the hibernate (here a failed fixup) is cleared, so neither the pod nor a restarted
/// daemon takes the restored guest for one whose fixup failed.
/// Checklist rows: update_test/WakeClearsStalePostCloneMarker
#[tokio::test(flavor = "multi_thread")]
async fn a_wake_clears_a_post_clone_marker_left_from_before_the_hibernate() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-pc").await;
    hibernate_now(&env, "agent-0").await;
    const MARKER: &str = "vm.cocoonstack.io/post-clone-state";
    annotate(&env, "agent-0", &[(MARKER, Some("failed"))]).await;
    annotate(&env, "agent-0", &[(HIBERNATE, None)]).await;
    eventually(30, "woken", || is_up(&env, "agent-0")).await;
    assert_ne!(
        annotation(&env, "agent-0", MARKER).as_deref(),
        Some("failed"),
        "the stale marker outlived the wake"
    );
    d.kill().await;
}
