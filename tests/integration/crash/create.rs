//! CreatePod crashed on each bring-up path: a clone of a local snapshot, a clone of one pulled
//! from the registry, `vm run` of an image, a fork of another pod's VM.

use super::*;

struct Create {
    name: &'static str,
    vm: &'static str,
    extra: &'static [(&'static str, &'static str)],
    marker: &'static str,
}

#[async_trait]
impl Operation for Create {
    fn name(&self) -> &'static str {
        self.name
    }
    fn vm(&self) -> &'static str {
        self.vm
    }
    fn end(&self) -> End {
        End::Ready
    }
    fn path_marker(&self) -> Option<&'static str> {
        Some(self.marker)
    }
    async fn setup(&self, w: &World) -> Daemon {
        w.start().await
    }
    async fn trigger(&self, w: &World) {
        create(&w.env, &pod(self.vm, self.extra)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_clone_create_loses_nothing() {
    explore(Arc::new(Create {
        name: "create-clone",
        vm: "vk-c",
        extra: &[],
        marker: "base",
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_run_create_loses_nothing() {
    explore(Arc::new(Create {
        name: "create-run",
        vm: "vk-r",
        extra: &[("cocoonset.cocoonstack.io/mode", "run"), (IMAGE, "ghcr.io/x/base:1")],
        marker: "run",
    }))
    .await;
}

/// A clone whose snapshot is only in the registry: pulled, imported, cloned.
struct CreatePulled;

#[async_trait]
impl Operation for CreatePulled {
    fn name(&self) -> &'static str {
        "create-pulled"
    }
    fn vm(&self) -> &'static str {
        "vk-p"
    }
    fn end(&self) -> End {
        End::Ready
    }
    fn path_marker(&self) -> Option<&'static str> {
        Some("golden")
    }
    fn kept_snapshots(&self) -> &'static [&'static str] {
        &["golden"]
    }
    async fn setup(&self, w: &World) -> Daemon {
        w.registry()
            .push_snapshot(w.env.runtime.as_ref(), "base", "golden", "latest", "ghcr.io/x/base:1")
            .await
            .unwrap();
        w.start().await
    }
    async fn trigger(&self, w: &World) {
        create(&w.env, &pod("vk-p", &[(IMAGE, "golden")])).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_create_from_a_registry_snapshot_loses_nothing() {
    explore(Arc::new(CreatePulled)).await;
}

/// A fork of another pod's VM: its fork snapshot saved once, then cloned.
struct CreateFork;

#[async_trait]
impl Operation for CreateFork {
    fn name(&self) -> &'static str {
        "create-fork"
    }
    fn vm(&self) -> &'static str {
        "vk-f"
    }
    fn end(&self) -> End {
        End::Ready
    }
    fn path_marker(&self) -> Option<&'static str> {
        Some("fork-vk-main")
    }
    fn kept_snapshots(&self) -> &'static [&'static str] {
        &["fork-vk-main"]
    }
    async fn setup(&self, w: &World) -> Daemon {
        let d = w.start().await;
        let mut main = pod("vk-main", &[]);
        main.metadata.name = Some("main-0".into());
        create(&w.env, &main).await;
        eventually(60, "main-0 ready", || {
            lifecycle(&w.env, "main-0").as_deref() == Some("ready")
        })
        .await;
        d
    }
    async fn trigger(&self, w: &World) {
        create(&w.env, &pod("vk-f", &[("vm.cocoonstack.io/fork-from", "vk-main")])).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_fork_create_loses_nothing() {
    explore(Arc::new(CreateFork)).await;
}
