//! The streaming half of the kubelet API: `exec`, `attach` and `portForward` for VM pods.
//!
//! * Transports: [`spdy`] (SPDY/3.1, what the apiserver speaks to a kubelet unless the node
//!   declares `ExtendWebSocketsToKubelet`, and what kubectl falls back to) and [`websocket`]
//!   (the channel protocols v5/v4 and the SPDY tunnel of port-forward); [`upgrade`] picks one and
//!   negotiates the sub-protocol.
//! * Protocols: [`remotecommand`] (exec and attach: options, streams, the final status);
//!   [`portforward`] (a data and an error stream per forwarded connection).
//! * Endpoints: [`exec`] (`cocoon vm exec`), [`attach`] (the VM's serial console),
//!   [`portforward`] (TCP to the guest), with [`pairing`] (its connections waiting for their
//!   second stream). [`target`] resolves the pod and its VM; [`supervise`] runs a session's tasks
//!   so that a panic ends the session, counted, instead of leaving it half-open.
//!
//! Every route sits behind the API's authentication and authorization (`nodes/proxy`); on top of
//! that, [`Streaming`] caps the sessions open at once and serialises console attaches.
//!
//! Shares of the session cap: through the apiserver every session arrives under one identity
//! (its kubelet-client certificate), whichever tenant asked for it, so a cap per identity alone
//! would let one tenant take every slot of the node. Each *pod* therefore has a share of its
//! own (`VK_STREAMING_MAX_SESSIONS_PER_POD`): the sessions of one pod's users cannot take what
//! the other pods need. A caller that reaches the port itself with a bearer token is one
//! person or program, and has a share of its own as well (`VK_STREAMING_MAX_SESSIONS_PER_CALLER`);
//! a caller with a client certificate (the apiserver, relaying every tenant) has none.

pub mod attach;
pub mod config;
pub mod exec;
pub mod pairing;
pub mod portforward;
pub mod remotecommand;
pub mod spdy;
pub mod supervise;
pub mod target;
pub mod upgrade;
pub mod websocket;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use prometheus::IntGauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub use config::{StreamingArgs, StreamingConfig};

/// What the streaming endpoints share.
pub struct Streaming {
    pub config: StreamingConfig,
    sessions: Arc<Semaphore>,
    shares: Arc<Mutex<HashMap<Share, usize>>>,
    consoles: Arc<Mutex<HashSet<String>>>,
}

/// A part of the session cap one pod, or one caller, may hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Share {
    /// `namespace/name`.
    Pod(String),
    /// The user name of a caller authenticated by a bearer token.
    Caller(String),
}

/// Who is asking for a session, for the shares of the cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requester {
    /// `namespace/name` of the pod the session is with.
    pub pod: String,
    /// The caller's user name when it has a share of its own (a bearer token); `None` for a
    /// client certificate (the apiserver, which relays every tenant's sessions).
    pub caller: Option<String>,
}

impl Requester {
    /// The pod `namespace/pod`, asked for by the request's authenticated caller.
    pub fn of(req: &axum::extract::Request, namespace: &str, pod: &str) -> Self {
        let certificate = req
            .extensions()
            .get::<crate::kubelet_api::auth::PeerCertificate>()
            .is_some();
        let caller = (!certificate)
            .then(|| req.extensions().get::<crate::kubelet_api::auth::UserInfo>())
            .flatten()
            .map(|u| u.name.clone());
        Self {
            pod: format!("{namespace}/{pod}"),
            caller,
        }
    }
}

/// One admitted session: holds its slot, its shares (and the in-flight gauge) until dropped.
pub struct Admission {
    _permit: OwnedSemaphorePermit,
    held: Vec<Share>,
    shares: Arc<Mutex<HashMap<Share, usize>>>,
    gauge: IntGauge,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.gauge.dec();
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        for share in &self.held {
            if let Some(n) = shares.get_mut(share) {
                *n -= 1;
                if *n == 0 {
                    shares.remove(share);
                }
            }
        }
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
    pub fn new(config: StreamingConfig) -> Self {
        Self {
            sessions: Arc::new(Semaphore::new(config.max_sessions)),
            shares: Arc::default(),
            consoles: Arc::default(),
            config,
        }
    }

    /// A slot for one more session of `who`, or the 429 that says which limit is reached
    /// (the node's, the pod's share, or the caller's).
    pub fn admit(&self, gauge: IntGauge, who: &Requester) -> Result<Admission, upgrade::Refusal> {
        let busy = |message: String| upgrade::Refusal::new(StatusCode::TOO_MANY_REQUESTS, message);
        let mut shares = self.shares.lock().unwrap_or_else(|e| e.into_inner());
        let pod = Share::Pod(who.pod.clone());
        if shares.get(&pod).copied().unwrap_or(0) >= self.config.max_sessions_per_pod {
            return Err(busy(format!(
                "vk-cocoon: pod {} already has {} exec/attach/port-forward sessions open, its share of the node's (VK_STREAMING_MAX_SESSIONS_PER_POD); try again when one ends",
                who.pod, self.config.max_sessions_per_pod
            )));
        }
        let caller = who.caller.clone().map(Share::Caller);
        if let Some(share) = &caller
            && shares.get(share).copied().unwrap_or(0) >= self.config.max_sessions_per_caller
        {
            return Err(busy(format!(
                "vk-cocoon: you already have {} exec/attach/port-forward sessions open on this node, a caller's share (VK_STREAMING_MAX_SESSIONS_PER_CALLER); try again when one ends",
                self.config.max_sessions_per_caller
            )));
        }
        let permit = self.sessions.clone().try_acquire_owned().map_err(|_| {
            busy(format!(
                "vk-cocoon: this node already serves {} exec/attach/port-forward sessions (VK_STREAMING_MAX_SESSIONS); try again when one ends",
                self.config.max_sessions
            ))
        })?;
        let held: Vec<Share> = std::iter::once(pod).chain(caller).collect();
        for share in &held {
            *shares.entry(share.clone()).or_default() += 1;
        }
        gauge.inc();
        Ok(Admission {
            _permit: permit,
            held,
            shares: self.shares.clone(),
            gauge,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn streaming(max: usize, per_pod: usize, per_caller: usize) -> Streaming {
        Streaming::new(StreamingConfig {
            max_sessions: max,
            max_sessions_per_pod: per_pod,
            max_sessions_per_caller: per_caller,
            ..StreamingConfig::default()
        })
    }

    fn who(pod: &str, caller: Option<&str>) -> Requester {
        Requester {
            pod: pod.into(),
            caller: caller.map(str::to_string),
        }
    }

    fn gauge() -> IntGauge {
        IntGauge::new("streams", "test").unwrap()
    }

    fn refusal(r: Result<Admission, upgrade::Refusal>) -> String {
        match r {
            Ok(_) => panic!("admitted"),
            Err(refusal) => {
                assert_eq!(refusal.status, StatusCode::TOO_MANY_REQUESTS);
                refusal.message
            }
        }
    }

    #[test]
    fn one_pod_takes_only_its_share_and_the_apiserver_has_none() {
        let s = streaming(6, 2, 3);
        let g = gauge();
        // Through the apiserver (no caller share): two sessions per pod, then 429 for that pod.
        let a: Vec<_> = (0..2)
            .map(|_| s.admit(g.clone(), &who("t1/a", None)).unwrap())
            .collect();
        assert!(refusal(s.admit(g.clone(), &who("t1/a", None))).contains("VK_STREAMING_MAX_SESSIONS_PER_POD"));
        let b = s
            .admit(g.clone(), &who("t2/b", None))
            .expect("another tenant's pod gets in");
        assert_eq!(g.get(), 3);
        // A token caller has a share of its own, across pods.
        let c: Vec<_> = ["t3/c", "t3/d", "t3/e"]
            .iter()
            .map(|p| s.admit(g.clone(), &who(p, Some("alice"))).unwrap())
            .collect();
        assert!(
            refusal(s.admit(g.clone(), &who("t3/f", Some("alice")))).contains("VK_STREAMING_MAX_SESSIONS_PER_CALLER")
        );
        // The node's cap still holds.
        assert!(refusal(s.admit(g.clone(), &who("t4/g", None))).contains("VK_STREAMING_MAX_SESSIONS)"));
        // Ending sessions gives their shares back.
        drop(a);
        drop(c);
        assert_eq!(g.get(), 1);
        let again: Vec<_> = (0..2)
            .map(|_| s.admit(g.clone(), &who("t1/a", Some("alice"))).unwrap())
            .collect();
        assert_eq!(s.shares.lock().unwrap().len(), 3, "pods t1/a, t2/b and caller alice");
        drop((b, again));
        assert!(s.shares.lock().unwrap().is_empty(), "no share outlives its sessions");
    }
}
