//! Hibernate crashed anywhere: save, push `:hibernate`, clear the runtime annotations, remove
//! the VM, release its lease.

use super::*;

struct Hibernate;

#[async_trait]
impl Operation for Hibernate {
    fn name(&self) -> &'static str {
        "hibernate"
    }
    fn vm(&self) -> &'static str {
        "vk-h"
    }
    fn end(&self) -> End {
        End::Hibernated
    }
    fn guards_hibernated_state(&self) -> bool {
        true
    }
    fn push_before_remove(&self) -> Option<&'static str> {
        Some("hibernate")
    }
    async fn setup(&self, w: &World) -> Daemon {
        let d = w.start().await;
        create(&w.env, &pod("vk-h", &[])).await;
        wait_ready(&w.env).await;
        d
    }
    async fn trigger(&self, w: &World) {
        annotate(&w.env, POD, &[(HIBERNATE, Some("true"))]).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_anywhere_in_a_hibernate_loses_nothing() {
    explore(Arc::new(Hibernate)).await;
}
