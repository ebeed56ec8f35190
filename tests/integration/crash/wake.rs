//! Wakes crashed anywhere: from the verified local copy, from the registry (no local copy), and
//! a released seat rebuilt as a new pod that restores the hibernated guest (with and without
//! the warm local copy the release kept).

use super::*;

#[derive(Clone, Copy, PartialEq)]
enum Source {
    Local,
    Registry,
}

/// The pod hibernated (its guest in `vm:hibernate` and the local copy); with `Registry` the
/// local copy is dropped, as on a node that never held it.
async fn hibernated_pod(w: &World, vm: &str, source: Source) -> Daemon {
    let d = w.start().await;
    create(&w.env, &pod(vm, &[])).await;
    wait_ready(&w.env).await;
    annotate(&w.env, POD, &[(HIBERNATE, Some("true"))]).await;
    wait_hibernated(&w.env).await;
    if source == Source::Registry {
        w.env.runtime.snapshot_remove_if_exists(vm).await.unwrap();
    }
    d
}

/// A wake from the registry clones the import of its pull (the local copy's clone carries
/// only the VM's name, which every clone of the VM carries).
fn import_marker(vm: &str, source: Source) -> Option<&'static str> {
    (source == Source::Registry).then(|| &*String::leak(vk_cocoon::provider::plan::hibernate_import_name(vm)))
}

struct Wake {
    name: &'static str,
    vm: &'static str,
    source: Source,
}

#[async_trait]
impl Operation for Wake {
    fn name(&self) -> &'static str {
        self.name
    }
    fn vm(&self) -> &'static str {
        self.vm
    }
    fn end(&self) -> End {
        End::Ready
    }
    fn guards_hibernated_state(&self) -> bool {
        true
    }
    fn path_marker(&self) -> Option<&'static str> {
        import_marker(self.vm, self.source)
    }
    async fn setup(&self, w: &World) -> Daemon {
        hibernated_pod(w, self.vm, self.source).await
    }
    async fn trigger(&self, w: &World) {
        annotate(&w.env, POD, &[(HIBERNATE, None)]).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_wake_from_the_local_copy_loses_nothing() {
    explore(Arc::new(Wake {
        name: "wake-local",
        vm: "vk-wl",
        source: Source::Local,
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_wake_from_the_registry_loses_nothing() {
    explore(Arc::new(Wake {
        name: "wake-registry",
        vm: "vk-wr",
        source: Source::Registry,
    }))
    .await;
}

/// A released seat: the hibernated pod deleted with keep-snapshot-on-delete, then rebuilt by
/// the operator with the restore marker.
struct SeatWake {
    name: &'static str,
    vm: &'static str,
    source: Source,
}

#[async_trait]
impl Operation for SeatWake {
    fn name(&self) -> &'static str {
        self.name
    }
    fn vm(&self) -> &'static str {
        self.vm
    }
    fn end(&self) -> End {
        End::Ready
    }
    fn guards_hibernated_state(&self) -> bool {
        true
    }
    fn path_marker(&self) -> Option<&'static str> {
        import_marker(self.vm, self.source)
    }
    async fn setup(&self, w: &World) -> Daemon {
        let d = hibernated_pod(w, self.vm, Source::Local).await;
        annotate(
            &w.env,
            POD,
            &[("vm.cocoonstack.io/keep-snapshot-on-delete", Some("true"))],
        )
        .await;
        delete(&w.env, POD).await;
        eventually(60, "the released pod gone", || get(&w.env, POD).is_none()).await;
        if self.source == Source::Registry {
            w.env.runtime.snapshot_remove_if_exists(self.vm).await.unwrap();
        }
        d
    }
    async fn trigger(&self, w: &World) {
        create(
            &w.env,
            &pod(self.vm, &[("vm.cocoonstack.io/restore-from-hibernate", "true")]),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_released_seat_wake_loses_nothing() {
    explore(Arc::new(SeatWake {
        name: "wake-seat-local",
        vm: "vk-sl",
        source: Source::Local,
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_released_seat_wake_from_the_registry_loses_nothing() {
    explore(Arc::new(SeatWake {
        name: "wake-seat-registry",
        vm: "vk-sr",
        source: Source::Registry,
    }))
    .await;
}

/// A released seat rebuilt on this node while the node that hibernated the guest (node A, the
/// peer tier's test node) serves its files: restored from the peer's copy, staged and cloned
/// `--from-dir`.
struct PeerWake;

#[async_trait]
impl Operation for PeerWake {
    fn name(&self) -> &'static str {
        "wake-peer"
    }
    fn vm(&self) -> &'static str {
        crate::provider::hibernate::peer_tier::VM
    }
    fn end(&self) -> End {
        End::Ready
    }
    fn guards_hibernated_state(&self) -> bool {
        true
    }
    fn path_marker(&self) -> Option<&'static str> {
        Some("--from-dir")
    }
    async fn world(&self) -> World {
        World::with_oci().await
    }
    async fn setup(&self, w: &World) -> Daemon {
        use crate::provider::hibernate::peer_tier::{node_a_pushing, register_node_a};
        let a = node_a_pushing(&w.env, 256 << 10, Default::default()).await;
        register_node_a(&w.env).await;
        *w.peer_port.lock().unwrap() = Some(a.addr.port());
        w.keep.lock().unwrap().push(Box::new(a));
        w.start().await
    }
    async fn trigger(&self, w: &World) {
        create(
            &w.env,
            &pod(self.vm(), &[("vm.cocoonstack.io/restore-from-hibernate", "true")]),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_wake_from_a_peer_loses_nothing() {
    explore(Arc::new(PeerWake)).await;
}
