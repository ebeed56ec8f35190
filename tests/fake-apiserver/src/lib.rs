//! An in-process fake Kubernetes API server for tests, spoken to through a real `kube::Client`.
//!
//! It serves exactly what vk-cocoon uses — `core/v1` pods (with `/status`), nodes (with `/status`),
//! namespaces, events; `coordination.k8s.io/v1` leases; `events.k8s.io/v1` events (what
//! kube-runtime's `events::Recorder` writes in kube 5) — with the semantics a controller can
//! observe:
//!
//! * one increasing resourceVersion counter for every write; `metadata.uid` and
//!   `creationTimestamp` set on create; no-op writes do not bump it;
//! * 409 `Conflict` for a stale `metadata.resourceVersion` on update/patch and for failed delete
//!   preconditions; 422 `Invalid` for a body whose `metadata.uid` differs from the stored one (the
//!   uid-as-precondition idiom of status patches: the field is immutable); 409 `AlreadyExists` on
//!   create; 404 `NotFound` with a proper `Status` body — each worded as the real apiserver words it;
//! * `/status` writes take the status and metadata but keep the spec (a pod also keeps its owner
//!   references); writes to the main resource keep the status;
//! * strategic merge patch with patch-merge keys, set-merged finalizers and `$patch` directives
//!   ([`strategic`]); JSON merge patch; JSON patch;
//! * list and watch with `fieldSelector` (each type's own field labels; anything else is a 400) and
//!   `labelSelector`; watches from a resourceVersion replay the bounded history and answer an
//!   `ERROR` event with a 410 `Expired` `Status` when it is older than the history (force it with
//!   [`Store::compact_history`]); `BOOKMARK` events when `allowWatchBookmarks=true`;
//!   `sendInitialEvents=true` streaming lists ending with the `k8s.io/initial-events-end` bookmark;
//! * graceful pod deletion: a delete with grace > 0 of a pod bound to a node sets
//!   `deletionTimestamp` and leaves the object, grace 0 removes it; finalizers hold objects;
//! * Events stored as `events.k8s.io/v1` and readable through core/v1 too, converted;
//! * `SelfSubjectAccessReview` / `SelfSubjectReview` (the daemon's RBAC preflight): every caller is
//!   an administrator, so every review is allowed.
//!
//! `tests/semantics` runs the shared behaviour against this server and a real kube-apiserver;
//! the README lists what the fake does not model. Server-side apply is not supported (415).
//! Lists ignore `limit` and return one page.

pub mod error;
mod events;
mod http;
pub mod resource;
mod review;
pub mod selector;
pub mod store;
pub mod strategic;

pub use error::ApiError;
pub use http::{Fault, RequestRecord};
pub use resource::ResourceType;
pub use store::Store;

use axum::http::Method;
use http::{AppState, Shared};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Server options.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many changes the watch history keeps (older resumptions get 410 Gone).
    pub history_capacity: usize,
    /// How often a bookmark is broadcast to watches that asked for bookmarks (`None`: never,
    /// except through [`FakeApiServer::bookmark`]).
    pub bookmark_interval: Option<Duration>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            history_capacity: 1000,
            bookmark_interval: Some(Duration::from_secs(1)),
        }
    }
}

struct Running {
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

/// A running (or stopped) fake API server. Its store survives [`stop`](Self::stop) /
/// [`start_again`](Self::start_again), so a restart looks to clients like an apiserver restart.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    options: Options,
    addr: SocketAddr,
    running: Option<Running>,
}

impl FakeApiServer {
    /// Starts on a free loopback port with default options.
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    /// Starts on a free loopback port.
    pub async fn start_with(options: Options) -> Self {
        let shared = Arc::new(Shared {
            store: Arc::new(Store::new(options.history_capacity)),
            requests: Mutex::new(Vec::new()),
            faults: Mutex::new(Vec::new()),
        });
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the fake apiserver");
        let addr = listener
            .local_addr()
            .expect("local address of the fake apiserver listener");
        let mut server = Self {
            shared,
            options,
            addr,
            running: None,
        };
        server.serve(listener);
        server
    }

    fn serve(&mut self, listener: TcpListener) {
        let shutdown = CancellationToken::new();
        let state = AppState {
            shared: self.shared.clone(),
            shutdown: shutdown.clone(),
        };
        let app = axum::Router::new().fallback(http::handle).with_state(state);
        let signal = shutdown.clone();
        let store = self.shared.store.clone();
        let interval = self.options.bookmark_interval;
        let task = tokio::spawn(async move {
            if let Some(every) = interval {
                let ticker_stop = signal.clone();
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(every);
                    loop {
                        tokio::select! {
                            _ = ticker_stop.cancelled() => break,
                            _ = tick.tick() => store.bookmark(),
                        }
                    }
                });
            }
            let result = axum::serve(listener, app)
                .with_graceful_shutdown(async move { signal.cancelled().await })
                .await;
            if let Err(err) = result {
                tracing::warn!(%err, "fake apiserver stopped with an error");
            }
        });
        self.running = Some(Running { shutdown, task });
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A real `kube::Client` talking to this server (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        // Ignored when a provider is already installed (by the test or an earlier client).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = kube::Config::new(self.url().parse().expect("valid fake apiserver URL"));
        kube::Client::try_from(config).expect("build a kube client for the fake apiserver")
    }

    /// The object store: inspect, seed, compact.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// Stops serving: open watches end, connections close, new connections are refused.
    pub async fn stop(&mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown.cancel();
            let mut task = running.task;
            if tokio::time::timeout(Duration::from_secs(5), &mut task).await.is_err() {
                task.abort();
            }
        }
    }

    /// Serves again on the same port, with the same store.
    pub async fn start_again(&mut self) {
        assert!(self.running.is_none(), "start_again called on a running fake apiserver");
        let mut last_err = None;
        for _ in 0..100 {
            match TcpListener::bind(self.addr).await {
                Ok(listener) => {
                    self.serve(listener);
                    return;
                }
                Err(err) => {
                    last_err = Some(err);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        panic!("could not re-bind the fake apiserver on {}: {last_err:?}", self.addr);
    }

    /// Stop, then serve again on the same port with the same store.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.start_again().await;
    }

    /// Stop, then serve on a new free port with the same store (clients must be rebuilt).
    pub async fn restart_on_new_port(&mut self) {
        self.stop().await;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the fake apiserver");
        self.addr = listener
            .local_addr()
            .expect("local address of the fake apiserver listener");
        self.serve(listener);
    }

    /// Broadcasts a bookmark now to every watch that asked for bookmarks.
    pub fn bookmark(&self) {
        self.shared.store.bookmark();
    }

    /// Every request served so far (across restarts).
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.requests.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Makes the next `times` requests with this method whose path contains `path_contains` fail
    /// with `status` (a `Status` body with the matching reason).
    pub fn inject_fault(&self, method: Option<Method>, path_contains: &str, status: u16, times: usize) {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Fault {
                method,
                path_contains: path_contains.to_string(),
                status,
                times,
            });
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown.cancel();
        }
    }
}
