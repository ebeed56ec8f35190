//! DeletePod crashed under each snapshot policy: `always` (save, push `:latest`, then remove),
//! `main-only` for a CocoonSet's main agent (as `always`) and for a sub-agent (as `never`), and
//! `never` (remove only). (The delete
//! of a released seat, a hibernated pod, makes no cocoon call: nothing to crash at.)

use super::*;

struct Delete {
    name: &'static str,
    vm: &'static str,
    policy: &'static str,
    /// The CocoonSet the pod belongs to (its role comes from that owner).
    owner: Option<&'static str>,
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
        // `main-only` snapshots the CocoonSet's main agent (slot 0) only.
        let main = self.owner.is_some() && self.vm == main_vm();
        (self.policy == "always" || (self.policy == "main-only" && main)).then_some("latest")
    }
    async fn setup(&self, w: &World) -> Daemon {
        let d = w.start().await;
        let mut p = pod(self.vm, &[("cocoonset.cocoonstack.io/snapshot-policy", self.policy)]);
        if let Some(set) = self.owner {
            p.metadata.owner_references = Some(vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "cocoonstack.io/v1".into(),
                kind: "CocoonSet".into(),
                name: set.into(),
                uid: "cocoonset-uid".into(),
                ..Default::default()
            }]);
        }
        create(&w.env, &p).await;
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
        vm: "vk-da",
        policy: "always",
        owner: None,
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_delete_without_a_snapshot_loses_nothing() {
    explore(Arc::new(Delete {
        name: "delete-never",
        vm: "vk-dn",
        policy: "never",
        owner: None,
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_main_agents_delete_under_main_only_loses_nothing() {
    let vm = main_vm();
    explore(Arc::new(Delete {
        name: "delete-main-only",
        vm: String::leak(vm),
        policy: "main-only",
        owner: Some("demo"),
    }))
    .await;
}

/// The VM name of slot 0 of CocoonSet `demo`: its main agent.
fn main_vm() -> String {
    vk_policy_support::role::vm_name_for_deployment("default", "demo", 0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_sub_agents_delete_under_main_only_loses_nothing() {
    let vm = vk_policy_support::role::vm_name_for_deployment("default", "demo", 1);
    explore(Arc::new(Delete {
        name: "delete-main-only-sub",
        vm: String::leak(vm),
        policy: "main-only",
        owner: Some("demo"),
    }))
    .await;
}
