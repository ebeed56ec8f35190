//! The streaming half of the kubelet API: `exec`, `attach` and `portForward` for VM pods.
//!
//! * Transports: [`spdy`] (SPDY/3.1, what the apiserver speaks to a kubelet unless the node
//!   declares `ExtendWebSocketsToKubelet`, and what kubectl falls back to) and [`websocket`]
//!   (the channel protocols v5/v4 and the SPDY tunnel of port-forward); [`upgrade`] picks one and
//!   negotiates the sub-protocol.
//! * Protocols: [`remotecommand`] (exec and attach: options, streams, the final status);
//!   [`portforward`] (a data and an error stream per forwarded connection).
//! * Endpoints: [`exec`] (`cocoon vm exec`), [`attach`] (the VM's serial console),
//!   [`portforward`] (TCP to the guest). [`target`] resolves the pod and its VM.
//!
//! Every route sits behind the API's authentication and authorization (`nodes/proxy`); on top of
//! that, [`Streaming`] caps the sessions open at once and serialises console attaches.

pub mod attach;
pub mod config;
pub mod exec;
pub mod portforward;
pub mod remotecommand;
pub mod spdy;
pub mod target;
pub mod upgrade;
pub mod websocket;

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use prometheus::IntGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use config::{StreamingArgs, StreamingConfig};

/// The networks port-forward may dial (the daemon's `VK_PROBE_NETWORKS`): a guest address
/// outside them is not contacted.
pub struct GuestScope {
    pub description: String,
    pub contains: Box<dyn Fn(IpAddr) -> bool + Send + Sync>,
}

/// What the streaming endpoints share.
pub struct Streaming {
    pub config: StreamingConfig,
    pub guests: Option<GuestScope>,
    sessions: Arc<Semaphore>,
    consoles: Arc<Mutex<HashSet<String>>>,
}

/// One admitted session: holds its slot (and the in-flight gauge) until dropped.
pub struct Admission {
    _permit: OwnedSemaphorePermit,
    gauge: IntGauge,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

/// The serial console of one VM, attached by one session at a time.
pub struct ConsoleLock {
    vm_id: String,
    consoles: Arc<Mutex<HashSet<String>>>,
}

impl Drop for ConsoleLock {
    fn drop(&mut self) {
        self.consoles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.vm_id);
    }
}

impl Streaming {
    pub fn new(config: StreamingConfig, guests: Option<GuestScope>) -> Self {
        Self {
            sessions: Arc::new(Semaphore::new(config.max_sessions)),
            consoles: Arc::default(),
            config,
            guests,
        }
    }

    /// A slot for one more session, or the 429 that says the node is at its limit.
    pub fn admit(&self, gauge: IntGauge) -> Result<Admission, upgrade::Refusal> {
        let permit = self.sessions.clone().try_acquire_owned().map_err(|_| {
            upgrade::Refusal::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "vk-cocoon: this node already serves {} exec/attach/port-forward sessions (VK_STREAMING_MAX_SESSIONS); try again when one ends",
                    self.config.max_sessions
                ),
            )
        })?;
        gauge.inc();
        Ok(Admission { _permit: permit, gauge })
    }

    /// The console of `vm_id`, unless another session holds it.
    pub fn lock_console(&self, vm_id: &str) -> Option<ConsoleLock> {
        let mut held = self.consoles.lock().unwrap_or_else(|e| e.into_inner());
        held.insert(vm_id.to_string()).then(|| ConsoleLock {
            vm_id: vm_id.to_string(),
            consoles: self.consoles.clone(),
        })
    }
}
