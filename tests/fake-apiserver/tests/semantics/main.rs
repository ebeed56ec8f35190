//! The fake apiserver's semantics, pinned through a real `kube::Client` and kube-runtime.
//!
//! [`both`]: every check there runs twice — against the fake and against the real kube-apiserver
//! v1.36 (`vk_test_support::kube_support`, `tests/support`; skipped with one line when its tools folder is missing, a
//! failure under `CI=true`) — so the fake can only pass what the real server does.
//! [`fake_only`]: what a real server cannot be made to do on demand (stop and restart, compact
//! its history into 410 Gone, send a bookmark now, a tiny history window); see the README for
//! what else the fake does not model.

mod both;
mod fake_only;

use fake_apiserver::FakeApiServer;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use vk_test_support::kube_support;

/// One server under test: a client and the namespace to work in.
pub struct Server {
    pub client: kube::Client,
    pub ns: String,
    /// Which one (for messages), and the fake itself when it is the fake.
    pub label: &'static str,
    pub fake: Option<FakeApiServer>,
}

impl Server {
    pub async fn fake() -> Server {
        let fake = FakeApiServer::start().await;
        Server {
            client: fake.client(),
            ns: "default".into(),
            label: "fake",
            fake: Some(fake),
        }
    }

    /// The binary's real cluster as admin, in a fresh namespace; `None` when skipped.
    pub async fn real() -> Option<Server> {
        let cluster = kube_support::shared_apiserver_only().await?;
        Some(Server {
            client: cluster.admin_client().await,
            ns: cluster.namespace("semantics").await,
            label: "real",
            fake: None,
        })
    }

    /// A name no other test on the same (shared) server uses, for cluster-scoped objects.
    pub fn unique(&self, prefix: &str) -> String {
        kube_support::unique(prefix)
    }
}

/// A valid pod in `ns` (the real server validates: containers need a name and an image).
pub fn pod(ns: &str, name: &str, node: Option<&str>) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some(ns.into());
    p.spec = Some(PodSpec {
        node_name: node.map(str::to_string),
        containers: vec![Container {
            name: "c".into(),
            image: Some("registry.invalid/c:1".into()),
            ..Default::default()
        }],
        ..Default::default()
    });
    p
}

pub fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// `mod $name { fake(), real() }`, each running `$name(&Server)` against its server.
#[macro_export]
macro_rules! on_both_servers {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread")]
            async fn fake() {
                super::$name(&$crate::Server::fake().await).await;
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn real() {
                if let Some(server) = $crate::Server::real().await {
                    super::$name(&server).await;
                }
            }
        }
    )*};
}
