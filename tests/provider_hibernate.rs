//! Hibernate and wake end to end: fake apiserver + cocoon-sim + Debian's docker-registry on
//! loopback + the real registry client. The guest's state is never in neither place: every
//! fault (save, push, remove, the registry down during verification, the pull) leaves it in the
//! VM or in the registry, the pod recoverable, and the owed retry finishes the job.

#[path = "peer_tier/mod.rs"]
mod peer_tier;
mod provider_support;

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

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_save_keeps_the_vm_running_and_the_retry_hibernates() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, slow_retries());
    ready_pod(&env, "agent-0", "vm-s").await;
    env.sim
        .add_fault(Fault {
            verb: "snapshot save".into(),
            match_arg: None,
            times: Some(1),
            action: fail("Error: pause vm: cloud-hypervisor API timeout"),
        })
        .unwrap();
    annotate(&env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    wait_failed_with(&env, "agent-0", "snapshot save vm-s").await;
    assert!(
        vm_named(&env, "vm-s").await.is_some_and(|v| v.state.is_running()),
        "the VM keeps running"
    );
    assert!(
        annotation(&env, "agent-0", ID).is_some(),
        "its runtime annotations stay"
    );
    assert!(!tag_exists(&env, "vm-s").await);
    eventually(10, "HibernateSnapshotFailed event", || {
        has_event(&env, "agent-0", "HibernateSnapshotFailed")
    })
    .await;
    hibernated(&env, "agent-0").await;
    assert!(tag_exists(&env, "vm-s").await && vm_named(&env, "vm-s").await.is_none());
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_push_to_a_dead_registry_keeps_the_vm_and_the_retry_pushes_once_it_is_back() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, slow_retries());
    ready_pod(&env, "agent-0", "vm-p").await;
    oci(&env).kill();
    annotate(&env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(30, "HibernatePushFailed event", || {
        has_event(&env, "agent-0", "HibernatePushFailed")
    })
    .await;
    // The Event is recorded just before the lifecycle annotation is written.
    eventually(30, "lifecycle failed", || {
        lifecycle(&env, "agent-0").as_deref() == Some("failed")
    })
    .await;
    assert!(
        vm_named(&env, "vm-p").await.is_some_and(|v| v.state.is_running()),
        "the guest is still in its VM"
    );
    assert!(
        annotation(&env, "agent-0", ID).is_some(),
        "its runtime annotations stay"
    );
    oci(&env).restart();
    hibernated(&env, "agent-0").await;
    assert!(tag_exists(&env, "vm-p").await && vm_named(&env, "vm-p").await.is_none());
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_remove_withdraws_the_tag_reapplies_the_runtime_and_the_retry_finishes() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, slow_retries());
    ready_pod(&env, "agent-0", "vm-r").await;
    let vm = vm_named(&env, "vm-r").await.unwrap();
    env.sim
        .add_fault(Fault {
            verb: "vm rm".into(),
            match_arg: Some(vm.id.clone()),
            times: Some(1),
            action: fail("Error: vm busy: stop timed out"),
        })
        .unwrap();
    annotate(&env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(20, "HibernateRemoveFailed event", || {
        has_event(&env, "agent-0", "HibernateRemoveFailed")
    })
    .await;
    wait_failed_with(&env, "agent-0", "the hibernate tag was withdrawn").await;
    assert!(
        !tag_exists(&env, "vm-r").await,
        "a wake cannot restore a copy the running VM has moved past"
    );
    assert!(
        vm_named(&env, "vm-r").await.is_some_and(|v| v.state.is_running()),
        "the guest is in its VM"
    );
    assert_eq!(
        annotation(&env, "agent-0", ID).as_deref(),
        Some(vm.id.as_str()),
        "the runtime is re-applied"
    );
    hibernated(&env, "agent-0").await;
    assert!(tag_exists(&env, "vm-r").await, "the retry re-published the tag");
    assert!(vm_named(&env, "vm-r").await.is_none());
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wake_fails_closed_while_the_registry_cannot_verify_the_local_copy() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, slow_retries());
    ready_pod(&env, "agent-0", "vm-v").await;
    hibernate_now(&env, "agent-0").await;
    oci(&env).kill();
    annotate(&env, "agent-0", &[(HIBERNATE, None)]).await;
    eventually(30, "wake failed", || {
        lifecycle(&env, "agent-0").as_deref() == Some("failed")
    })
    .await;
    assert!(
        vm_named(&env, "vm-v").await.is_none(),
        "no guest boots from an unverified copy, nor fresh"
    );
    assert!(
        env.sim.snapshot_dir("vm-v").unwrap().is_some(),
        "the local copy is kept"
    );
    oci(&env).restart();
    assert!(state_somewhere(&env, "vm-v").await);
    eventually(30, "woken once the registry answers", || is_up(&env, "agent-0")).await;
    assert_eq!(
        calls(&env, "vm clone").last().unwrap().last().map(String::as_str),
        Some("vm-v"),
        "from the now verified local copy"
    );
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_pull_keeps_the_tag_boots_nothing_and_the_retry_wakes() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, slow_retries());
    ready_pod(&env, "agent-0", "vm-u").await;
    hibernate_now(&env, "agent-0").await;
    env.runtime.snapshot_remove_if_exists("vm-u").await.unwrap();
    env.sim
        .add_fault(Fault {
            verb: "snapshot import".into(),
            match_arg: None,
            times: Some(1),
            action: FaultAction::Die { after_bytes: 4096 },
        })
        .unwrap();
    annotate(&env, "agent-0", &[(HIBERNATE, None)]).await;
    eventually(30, "WakePullFailed event", || {
        has_event(&env, "agent-0", "WakePullFailed")
    })
    .await;
    assert!(vm_named(&env, "vm-u").await.is_none(), "nothing booted");
    assert!(tag_exists(&env, "vm-u").await, "the guest is still in the registry");
    eventually(30, "woken by the retry", || is_up(&env, "agent-0")).await;
    assert!(vm_named(&env, "vm-u").await.is_some());
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wake_whose_hibernate_tag_was_deleted_never_boots_a_fresh_guest() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, slow_retries());
    ready_pod(&env, "agent-0", "vm-t").await;
    hibernate_now(&env, "agent-0").await;
    oci(&env).client.delete_manifest("vm-t", "hibernate").await.unwrap();
    annotate(&env, "agent-0", &[(HIBERNATE, None)]).await;
    wait_failed_with(&env, "agent-0", "no hibernate snapshot exists").await;
    eventually(10, "HibernateSnapshotMissing event", || {
        has_event(&env, "agent-0", "HibernateSnapshotMissing")
    })
    .await;
    let failed_wakes = || d.provider.metrics().wake.with_label_values(&["failed"]).get();
    eventually(20, "the owed retry of the wake ran and failed too", || {
        failed_wakes() >= 2
    })
    .await;
    assert!(
        vm_named(&env, "vm-t").await.is_none(),
        "no fresh guest, not even after a retry"
    );
    assert!(
        calls(&env, "vm clone").len() == 1 && calls(&env, "vm run").len() == 1,
        "only the create's clone and the seed's run"
    );
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_mid_hibernate_resumes_it() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-m").await;
    // The daemon dies while the save is in progress.
    env.sim.delay("snapshot save", Some(1), 1_500).unwrap();
    annotate(&env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(20, "hibernating", || {
        lifecycle(&env, "agent-0").as_deref() == Some("hibernating")
    })
    .await;
    d.kill().await;
    // The kill takes the daemon's cocoon children with it: no save finishes behind its back.
    eventually(20, "no snapshot save left running", || {
        env.sim.pids_of("snapshot save").unwrap().is_empty()
    })
    .await;
    assert!(vm_named(&env, "vm-m").await.is_some(), "the VM outlived the daemon");

    let d = start(&env, Options::default());
    hibernated(&env, "agent-0").await;
    assert!(tag_exists(&env, "vm-m").await);
    assert!(vm_named(&env, "vm-m").await.is_none());
    eventually(10, "ResumedAfterRestart event", || {
        events(&env, "agent-0")
            .iter()
            .any(|(r, n)| r == "ResumedAfterRestart" && n == "op=hibernate")
    })
    .await;
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_after_the_remove_reports_hibernated_from_the_tag() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let d = start(&env, Options::default());
    ready_pod(&env, "agent-0", "vm-n").await;
    // The daemon dies during `vm rm`, after the push and the runtime clear; the VM goes anyway
    // (a real cocoon child outlives a crashed daemon and finishes the remove).
    env.sim.delay("vm rm", Some(1), 3_000).unwrap();
    annotate(&env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(20, "the id is cleared before the remove", || {
        annotation(&env, "agent-0", ID).is_none()
    })
    .await;
    d.kill().await;
    env.sim.flip_vm("vm-n", cocoon_sim::Flip::Deleted).unwrap();
    assert_eq!(lifecycle(&env, "agent-0").as_deref(), Some("hibernating"));

    let d = start(&env, Options::default());
    hibernated(&env, "agent-0").await;
    assert!(tag_exists(&env, "vm-n").await);
    assert_eq!(
        calls(&env, "snapshot save").len(),
        2,
        "the seed's and the hibernate's: nothing saved again"
    );
    d.kill().await;
}

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

#[tokio::test(flavor = "multi_thread")]
async fn a_cloud_hypervisor_windows_guest_hibernates_without_its_nic_and_wakes_with_a_fresh_one() {
    let env = env_with_oci().await;
    seed_windows_snapshot(&env, "winbase").await;
    let d = start(&env, Options::default());
    let windows = [
        (IMAGE, "winbase"),
        ("cocoonset.cocoonstack.io/os", "windows"),
        ("vm.cocoonstack.io/backend", "cloud-hypervisor"),
    ];
    create(&env, &managed("win-0", "vm-win", &windows)).await;
    eventually(30, "ready", || is_up(&env, "win-0")).await;
    let first_clone = calls(&env, "vm clone")[0].join(" ");
    assert!(
        first_clone.contains("--restore-mode copy"),
        "Windows guests restore by copy: {first_clone}"
    );
    assert_eq!(
        env.sim.exec_log().unwrap()[0].argv[0],
        "powershell",
        "a fresh Windows clone gets its NIC reset"
    );
    let id = vm_named(&env, "vm-win").await.unwrap().id;

    hibernate_now(&env, "win-0").await;
    let seq: Vec<String> = env
        .sim
        .calls()
        .unwrap()
        .into_iter()
        .filter(|c| c.argv.contains(&id) && matches!(c.verb.as_str(), "vm exec" | "vm net" | "snapshot save" | "vm rm"))
        .map(|c| match c.verb.as_str() {
            "vm exec" => c.argv[c.argv.iter().position(|a| a == "--").unwrap() + 1..].join(" "),
            _ => c.argv.join(" "),
        })
        .collect();
    let pos = |needle: &str| {
        seq.iter()
            .position(|s| s.contains(needle))
            .unwrap_or_else(|| panic!("{needle} in {seq:?}"))
    };
    assert!(pos("cmd /c ipconfig /release") < pos("net --nics 0"), "{seq:?}");
    assert!(
        pos("net --nics 0") < pos("snapshot save") && pos("snapshot save") < pos("rm --force"),
        "{seq:?}"
    );
    let m = d.provider.metrics();
    assert_eq!(
        (
            m.hibernate.with_label_values(&["dhcp_release", "ok"]).get(),
            m.hibernate.with_label_values(&["netresize", "ok"]).get()
        ),
        (1, 1)
    );

    let execs_before_wake = env.sim.exec_log().unwrap().len();
    annotate(&env, "win-0", &[(HIBERNATE, None)]).await;
    eventually(30, "woken", || is_up(&env, "win-0")).await;
    let wake_clone = calls(&env, "vm clone").last().unwrap().join(" ");
    assert!(
        wake_clone.contains("--restore-mode copy") && wake_clone.contains("--nics 1"),
        "a fresh NIC is hot-added: {wake_clone}"
    );
    assert_eq!(
        env.sim.exec_log().unwrap().len(),
        execs_before_wake,
        "a restored Windows guest only waits for its lease"
    );
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_nic_drop_renews_the_guest_lease_and_keeps_the_vm_running() {
    let env = env_with_oci().await;
    seed_windows_snapshot(&env, "winbase").await;
    let d = start(&env, slow_retries());
    let windows = [
        (IMAGE, "winbase"),
        ("cocoonset.cocoonstack.io/os", "windows"),
        ("vm.cocoonstack.io/backend", "cloud-hypervisor"),
    ];
    create(&env, &managed("win-0", "vm-win", &windows)).await;
    eventually(30, "ready", || lifecycle(&env, "win-0").as_deref() == Some("ready")).await;
    env.sim
        .add_fault(Fault {
            verb: "vm net".into(),
            match_arg: None,
            times: Some(1),
            action: fail("Error: hot-unplug: device busy"),
        })
        .unwrap();
    annotate(&env, "win-0", &[(HIBERNATE, Some("true"))]).await;
    eventually(20, "HibernateNetResizeFailed", || {
        has_event(&env, "win-0", "HibernateNetResizeFailed")
    })
    .await;
    assert_eq!(
        calls(&env, "snapshot save").len(),
        1,
        "only the seed's: nothing is saved without the NIC dropped"
    );
    eventually(10, "the guest renews its lease", || {
        env.sim
            .exec_log()
            .unwrap()
            .iter()
            .any(|e| e.argv.join(" ") == "cmd /c ipconfig /renew")
    })
    .await;
    assert!(
        vm_named(&env, "vm-win")
            .await
            .is_some_and(|v| v.state.is_running() && !v.network_configs.is_empty())
    );
    assert!(!tag_exists(&env, "vm-win").await);
    hibernated(&env, "win-0").await;
    d.kill().await;
}

/// A pod whose VM was stopped behind a dead daemon's back, with the hibernate asked for meanwhile.
async fn stopped_with_hibernate_owed(env: &Env, vm: &str, saved_first: bool) -> (String, Option<String>) {
    let d = start(env, Options::default());
    ready_pod(env, "agent-0", vm).await;
    d.kill().await;
    let id = vm_named(env, vm).await.unwrap().id;
    let mut saved = None;
    if saved_first {
        // The guest was saved and pushed before the host lost the VM's memory.
        env.runtime.snapshot_save(vm, &id).await.unwrap();
        oci(env)
            .client
            .push_snapshot(env.runtime.as_ref(), vm, vm, "hibernate", "base")
            .await
            .unwrap();
        saved = oci(env)
            .client
            .snapshot_config(vm, "hibernate")
            .await
            .unwrap()
            .map(|c| c.snapshot_id);
    }
    env.sim.flip_vm(vm, cocoon_sim::Flip::Stopped).unwrap();
    annotate(env, "agent-0", &[(HIBERNATE, Some("true"))]).await;
    (id, saved)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_vm_whose_save_is_the_tag_is_removed_without_saving_a_cold_guest_over_it() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let (_, saved) = stopped_with_hibernate_owed(&env, "vm-z", true).await;
    let saves = calls(&env, "snapshot save").len();
    let d = start(&env, Options::default());
    hibernated(&env, "agent-0").await;
    assert_eq!(calls(&env, "snapshot save").len(), saves, "no new save");
    assert!(calls(&env, "vm start").is_empty(), "the stopped VM was not booted");
    let now = oci(&env)
        .client
        .snapshot_config("vm-z", "hibernate")
        .await
        .unwrap()
        .map(|c| c.snapshot_id);
    assert_eq!(now, saved, "the tag still holds the guest's own save");
    assert!(vm_named(&env, "vm-z").await.is_none());
    d.kill().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_vm_without_a_saved_guest_is_booted_and_saved_before_it_goes() {
    let env = env_with_oci().await;
    seed_snapshot(&env, "base", "ghcr.io/x/base:1").await;
    let (id, _) = stopped_with_hibernate_owed(&env, "vm-y", false).await;
    let saves = calls(&env, "snapshot save").len();
    let d = start(&env, Options::default());
    hibernated(&env, "agent-0").await;
    assert!(
        calls(&env, "vm start").iter().any(|a| a.last() == Some(&id)),
        "booted so its disk can be saved"
    );
    assert_eq!(calls(&env, "snapshot save").len(), saves + 1);
    assert!(tag_exists(&env, "vm-y").await && vm_named(&env, "vm-y").await.is_none());
    d.kill().await;
}
