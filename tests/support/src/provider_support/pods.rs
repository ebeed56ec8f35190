//! Pods for the provider tests: builders (agent, managed, resources), reads from the fake
//! apiserver (annotations, lifecycle, phase, Events), the simulator's recorded calls, snapshots
//! seeded through the real CLI, and create / annotate / delete through a kube client.

use super::*;

pub fn agent_pod(name: &str, annotations: &[(&str, &str)]) -> Pod {
    let mut p = kubelet_support::pod(name, NODE);
    p.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    p
}

pub fn managed(name: &str, vm: &str, extra: &[(&str, &str)]) -> Pod {
    let mut a: Vec<(&str, &str)> = vec![
        ("vm.cocoonstack.io/name", vm),
        ("cocoonset.cocoonstack.io/managed", "true"),
    ];
    a.extend_from_slice(extra);
    agent_pod(name, &a)
}

pub fn with_resources(mut pod: Pod, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Pod {
    let q = |v: &[(&str, &str)]| {
        Some(
            v.iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    let spec = pod.spec.get_or_insert_with(PodSpec::default);
    if spec.containers.is_empty() {
        spec.containers.push(Container {
            name: "agent".into(),
            ..Default::default()
        });
    }
    spec.containers[0].resources = Some(ResourceRequirements {
        requests: q(requests),
        limits: q(limits),
        ..Default::default()
    });
    pod
}

pub fn get(env: &Env, name: &str) -> Option<Pod> {
    env.server.store().get_as::<Pod>(Some("default"), name)
}

pub fn annotation(env: &Env, name: &str, key: &str) -> Option<String> {
    get(env, name).and_then(|p| p.annotations().get(key).cloned())
}

pub fn lifecycle(env: &Env, name: &str) -> Option<String> {
    annotation(env, name, "vm.cocoonstack.io/lifecycle-state")
}

pub fn lifecycle_message(env: &Env, name: &str) -> String {
    annotation(env, name, "vm.cocoonstack.io/lifecycle-state-message").unwrap_or_default()
}

/// Waits until pod `name` reports lifecycle `failed` with a message containing `needle`, both
/// read from one version of the pod: a failure that is retried moves the lifecycle on again
/// (`creating`, an empty message) within milliseconds, so the two must be read together.
/// Returns the message.
pub async fn wait_failed_with(env: &Env, name: &str, needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let seen = get(env, name).map(|p| {
            let a = p.annotations();
            (
                a.get("vm.cocoonstack.io/lifecycle-state").cloned().unwrap_or_default(),
                a.get("vm.cocoonstack.io/lifecycle-state-message")
                    .cloned()
                    .unwrap_or_default(),
            )
        });
        if let Some((state, message)) = &seen
            && state == "failed"
            && message.contains(needle)
        {
            return message.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {name} to fail with {needle:?}; last seen (lifecycle, message): {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn phase(env: &Env, name: &str) -> Option<String> {
    get(env, name).and_then(|p| p.status.and_then(|s| s.phase))
}

pub fn ready(env: &Env, name: &str) -> bool {
    get(env, name)
        .and_then(|p| p.status)
        .and_then(|s| s.conditions)
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// (reason, note) of the Events about pod `name`.
pub fn events(env: &Env, name: &str) -> Vec<(String, String)> {
    env.server
        .store()
        .list_as::<k8s_openapi::api::events::v1::Event>()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

pub fn has_event(env: &Env, name: &str, reason: &str) -> bool {
    events(env, name).iter().any(|(r, _)| r == reason)
}

/// The argv of every sim invocation of `verb` (e.g. "vm clone").
pub fn calls(env: &Env, verb: &str) -> Vec<Vec<String>> {
    calls_of(&env.sim, verb)
}

/// How many times a guest ran `ipconfig /renew` (a Windows guest's lease renew).
pub fn renews(env: &Env) -> usize {
    env.sim
        .exec_log()
        .unwrap()
        .iter()
        .filter(|e| e.argv.join(" ") == "cmd /c ipconfig /renew")
        .count()
}

/// The argv of every invocation of `verb` that simulator `sim` (cocoon's or cocoon-macos's) logged.
pub fn calls_of(sim: &Sim, verb: &str) -> Vec<Vec<String>> {
    sim.calls()
        .unwrap()
        .into_iter()
        .filter(|c| c.verb == verb)
        .map(|c| c.argv)
        .collect()
}

pub async fn vms(env: &Env) -> Vec<vk_cocoon::runtime::VmRecord> {
    env.runtime.list().await.unwrap()
}

pub async fn vm_named(env: &Env, name: &str) -> Option<vk_cocoon::runtime::VmRecord> {
    vms(env).await.into_iter().find(|v| v.name() == name)
}

/// A local snapshot `name` taken from a throwaway VM booted from `image`.
pub async fn seed_snapshot(env: &Env, name: &str, image: &str) {
    seed_snapshot_on(&env.runtime, name, image).await;
}

/// [`seed_snapshot`] through any cocoon runtime (the real-apiserver tests have no [`Env`]).
pub async fn seed_snapshot_on(runtime: &CocoonCli, name: &str, image: &str) {
    runtime.image_pull(image, false).await.unwrap();
    let vm = runtime
        .run(&RunSpec {
            name: Some(format!("seed-{}", name.replace([':', '/'], "-"))),
            image: image.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    runtime.snapshot_save(name, &vm.id).await.unwrap();
    runtime.remove(&vm.id).await.unwrap();
}

/// VM `name` cloned straight from local snapshot `snapshot` (behind the daemon's back), on
/// network `network` (`None`: the default, static addresses).
pub async fn clone_direct_on(
    runtime: &CocoonCli,
    snapshot: &str,
    name: &str,
    network: Option<&str>,
) -> vk_cocoon::runtime::VmRecord {
    runtime
        .clone_vm(&vk_cocoon::runtime::CloneSpec {
            name: Some(name.into()),
            network: network.map(str::to_string),
            no_direct_io: false,
            pull: true,
            restore_mode: None,
            nics: None,
            cpu_policy: Default::default(),
            backend: Default::default(),
            source: vk_cocoon::runtime::CloneSource::Snapshot(snapshot.into()),
        })
        .await
        .unwrap()
}

/// A local Windows snapshot `name` (a cloud image booted with `--windows`, then saved).
pub async fn seed_windows_snapshot(env: &Env, name: &str) {
    env.sim.add_image("win11", "cloudimg").unwrap();
    let seed = env
        .runtime
        .run(&RunSpec {
            name: Some(format!("seed-{name}")),
            image: "win11".into(),
            windows: true,
            ..Default::default()
        })
        .await
        .unwrap();
    env.runtime.snapshot_save(name, &seed.id).await.unwrap();
    env.runtime.remove(&seed.id).await.unwrap();
}

pub async fn create(env: &Env, pod: &Pod) -> Pod {
    env.server.store().seed(pod).unwrap()
}

/// Merge-patches pod annotations as the operator does (`None` removes the key).
pub async fn annotate(env: &Env, name: &str, changes: &[(&str, Option<&str>)]) {
    let pods: kube::Api<Pod> = kube::Api::namespaced(env.server.client(), "default");
    let map: serde_json::Map<String, serde_json::Value> = changes
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
        .collect();
    let patch = serde_json::json!({"metadata": {"annotations": map}});
    pods.patch(
        name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
}

/// Kubelet-style delete (graceful: sets deletionTimestamp; the node finalizes).
pub async fn delete(env: &Env, name: &str) {
    let pods: kube::Api<Pod> = kube::Api::namespaced(env.server.client(), "default");
    pods.delete(name, &Default::default()).await.unwrap();
}
