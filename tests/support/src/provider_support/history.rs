//! Readiness and what a pod went through: its Ready condition and IP, cocoon-net lease files,
//! and `PodHistory`, a watch that records every change of a pod for later assertions.

use super::*;

/// (status, message) of the pod's Ready condition.
pub fn ready_condition(env: &Env, name: &str) -> Option<(String, String)> {
    get(env, name)
        .and_then(|p| p.status)
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
        .map(|c| (c.status, c.message.unwrap_or_default()))
}

pub fn pod_ip(env: &Env, name: &str) -> Option<String> {
    get(env, name).and_then(|p| p.status).and_then(|s| s.pod_ip)
}

/// Writes cocoon-net's lease file: `(mac, ip)` pairs valid far into the future.
pub fn write_leases(env: &Env, leases: &[(&str, &str)]) {
    let rows: Vec<String> = leases
        .iter()
        .map(|(mac, ip)| format!(r#"{{"mac":"{mac}","ip":"{ip}","expiry":"2999-01-01T00:00:00Z"}}"#))
        .collect();
    let tmp = env.leases.with_extension("tmp");
    std::fs::write(&tmp, format!("[{}]", rows.join(","))).unwrap();
    std::fs::rename(&tmp, &env.leases).unwrap();
}

/// Every version of pod `name` the apiserver stored from now on (including its last state when
/// it is deleted), so a test can see a status that was published just before the object went.
/// The versions arrive through the store's change feed on a task of their own, so a test reads
/// them through the waiting accessors: a version the store already holds may not have reached
/// the recorder yet.
pub struct PodHistory {
    seen: Arc<Mutex<Vec<Pod>>>,
    /// The deletion of the object was recorded (no version comes after it).
    gone: Arc<AtomicBool>,
    /// Changes the recorder missed because it fell behind the feed (the history is then wrong).
    missed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl PodHistory {
    pub fn record(env: &Env, name: &str) -> Self {
        let mut rx = env.server.store().subscribe();
        let seen: Arc<Mutex<Vec<Pod>>> = Arc::default();
        let gone: Arc<AtomicBool> = Arc::default();
        let missed: Arc<AtomicU64> = Arc::default();
        let (out, done, lost, name) = (seen.clone(), gone.clone(), missed.clone(), name.to_string());
        let task = tokio::spawn(async move {
            loop {
                let msg = match rx.recv().await {
                    Ok(msg) => msg,
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        lost.fetch_add(n, Ordering::SeqCst);
                        continue;
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                let fake_apiserver::store::Broadcast::Change(change) = msg else {
                    continue;
                };
                if change.resource == fake_apiserver::resource::PODS
                    && change.object["metadata"]["name"] == name.as_str()
                    && let Ok(pod) = serde_json::from_value::<Pod>(change.object.clone())
                {
                    out.lock().unwrap().push(pod);
                    if change.kind == fake_apiserver::store::ChangeKind::Deleted {
                        done.store(true, Ordering::SeqCst);
                    }
                }
            }
        });
        Self {
            seen,
            gone,
            missed,
            task,
        }
    }

    pub fn versions(&self) -> Vec<Pod> {
        let missed = self.missed.load(Ordering::SeqCst);
        assert_eq!(
            missed, 0,
            "the pod history fell {missed} changes behind the store's feed"
        );
        self.seen.lock().unwrap().clone()
    }

    /// The first recorded version that satisfies `pred`, waiting for the recorder to see it.
    pub async fn first(&self, what: &str, pred: impl Fn(&Pod) -> bool) -> Pod {
        let found = || self.versions().into_iter().find(|p| pred(p));
        eventually(20, what, || found().is_some()).await;
        found().expect("just seen")
    }

    /// The last Failed status (reason, message) before the object went: waits until the
    /// recorder has seen the deletion, so no later version is missing.
    pub async fn final_failure(&self) -> Option<(String, String)> {
        eventually(20, "the pod history recorded the deletion", || {
            self.gone.load(Ordering::SeqCst)
        })
        .await;
        self.versions().into_iter().rev().find_map(|p| {
            let s = p.status?;
            (s.phase.as_deref() == Some("Failed"))
                .then(|| (s.reason.unwrap_or_default(), s.message.unwrap_or_default()))
        })
    }
}

impl Drop for PodHistory {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How many times Event `reason` was recorded about pod `name` (Events are deduplicated into a
/// series: one object, a count).
pub fn event_count(env: &Env, name: &str, reason: &str) -> i32 {
    env.server
        .store()
        .list_as::<k8s_openapi::api::events::v1::Event>()
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name) && e.reason.as_deref() == Some(reason)
        })
        .map(|e| e.series.map(|s| s.count).unwrap_or(1))
        .sum()
}
