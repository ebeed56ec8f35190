//! DeletePod crashed under each snapshot policy: `always` (save, push `:latest`, then remove)
//! and `never` (remove only).

use super::*;

struct Delete {
    name: &'static str,
    vm: &'static str,
    policy: &'static str,
}

#[async_trait]
impl Operation for Delete {
    fn name(&self) -> &'static str {
        self.name
    }
    fn vm(&self) -> &'static str {
        self.vm
    }
    fn end(&self) -> End {
        End::Gone
    }
    fn push_before_remove(&self) -> Option<&'static str> {
        (self.policy == "always").then_some("latest")
    }
    async fn setup(&self, w: &World) -> Daemon {
        let d = w.start().await;
        create(
            &w.env,
            &pod(self.vm, &[("cocoonset.cocoonstack.io/snapshot-policy", self.policy)]),
        )
        .await;
        wait_ready(&w.env).await;
        d
    }
    async fn trigger(&self, w: &World) {
        delete(&w.env, POD).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_delete_that_snapshots_loses_nothing() {
    explore(Arc::new(Delete {
        name: "delete-always",
        vm: "vm-da",
        policy: "always",
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_delete_without_a_snapshot_loses_nothing() {
    explore(Arc::new(Delete {
        name: "delete-never",
        vm: "vm-dn",
        policy: "never",
    }))
    .await;
}
