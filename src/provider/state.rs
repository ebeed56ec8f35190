//! The provider's in-memory tables (behaviour spec §3.1): tracked pods with their incarnation
//! and VM, VMs by name, lifecycle intents, the delete fence, resume claims, the statuses of
//! evicted pods, background guest work, VM restart times, owed retries, and per-key async locks
//! that make concurrent callers share one piece of work (fork snapshots, snapshot pulls, image
//! pulls) or serialise one pod's operations.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use super::lifecycle::{self, Dropped, Intent};
use crate::kubelet::ProviderPodStatus;
use crate::runtime::VmRecord;

/// A pod the provider tracks.
#[derive(Debug, Clone)]
pub struct Tracked {
    pub pod: Pod,
    pub uid: String,
    pub vm_name: String,
    pub vm: Option<VmRecord>,
    /// No VM because the guest is hibernated (its state is in a snapshot): the pod stays alive.
    pub hibernated: bool,
}

/// How long the final status of an evicted pod is kept for its finalize.
const TERMINAL_TTL: Duration = Duration::from_secs(600);

/// One run of background guest work (fixup, lease wait) of a pod.
#[derive(Debug, Clone)]
pub struct GuestWork {
    id: u64,
    /// Cancelled when the pod is hibernated, deleted or evicted, or newer work replaces this.
    pub stop: CancellationToken,
}

/// A failed hibernate or wake owed a retry (decision 10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwedRetry {
    pub uid: String,
    /// The delay the retry was scheduled with (the next one doubles it).
    pub delay: Duration,
    /// Identifies the scheduled task: a later schedule supersedes it.
    pub token: u64,
}

#[derive(Debug, Clone)]
struct StoredIntent {
    intent: Intent,
    flushed: bool,
    /// The incarnation's object the intent is written on (kept after a failed create untracks it).
    pod: Option<Pod>,
}

#[derive(Default)]
struct Inner {
    pods: HashMap<String, Tracked>,
    vms_by_name: HashMap<String, VmRecord>,
    intents: HashMap<String, StoredIntent>,
    deleting: HashSet<String>,
    /// Pods whose work owed after a restart is running (`resumedOps`).
    resumed: HashSet<String>,
    /// The final status of evicted incarnations, published when the kubelet finalizes them
    /// (kept for [`TERMINAL_TTL`]: the finalize follows within seconds).
    terminal: HashMap<String, (String, ProviderPodStatus, Instant)>,
    /// Background guest work (fixup, lease wait) per pod: (uid, stop).
    guest_work: HashMap<String, (String, GuestWork)>,
    /// When the watcher last restarted a VM in place, by VM id.
    last_restart: HashMap<String, Instant>,
    /// VM ids with a deferred inspect recheck running.
    rechecks: HashSet<String>,
    /// VM ids whose event is being handled (the stream may repeat an event).
    handling: HashSet<String>,
    retries: HashMap<String, OwedRetry>,
    next_token: u64,
}

#[derive(Default)]
pub struct State {
    inner: Mutex<Inner>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

pub fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

impl State {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("provider state lock")
    }

    /// Claims the incarnation: tracks `pod` (without a VM unless the same incarnation already
    /// has one). Another incarnation's intent is dropped.
    pub fn track(&self, key: &str, pod: &Pod, vm_name: &str) {
        let uid = uid_of(pod);
        let mut s = self.lock();
        let vm = s.pods.get(key).filter(|t| t.uid == uid).and_then(|t| t.vm.clone());
        let hibernated = s.pods.get(key).filter(|t| t.uid == uid).is_some_and(|t| t.hibernated);
        if s.intents.get(key).is_some_and(|i| i.intent.uid != uid) {
            s.intents.remove(key);
        }
        if s.terminal.get(key).is_some_and(|(u, _, _)| *u != uid) {
            s.terminal.remove(key);
        }
        s.pods.insert(
            key.into(),
            Tracked {
                pod: pod.clone(),
                uid,
                vm_name: vm_name.into(),
                vm,
                hibernated,
            },
        );
    }

    /// Refreshes the tracked copy of the same incarnation (annotations such as the keep flag).
    pub fn refresh(&self, key: &str, pod: &Pod) {
        let uid = uid_of(pod);
        if let Some(t) = self.lock().pods.get_mut(key).filter(|t| t.uid == uid) {
            t.pod = pod.clone();
        }
    }

    /// Attaches `vm` to the tracked incarnation `uid` and indexes it by name.
    pub fn set_vm(&self, key: &str, uid: &str, vm: VmRecord) -> bool {
        let mut s = self.lock();
        let Some(t) = s.pods.get_mut(key).filter(|t| t.uid == uid) else {
            return false;
        };
        t.vm = Some(vm.clone());
        t.hibernated = false;
        let name = if vm.name().is_empty() {
            t.vm_name.clone()
        } else {
            vm.name().to_string()
        };
        s.vms_by_name.insert(name, vm);
        true
    }

    /// Sets an annotation on the tracked copy (same incarnation).
    pub fn set_annotations(&self, key: &str, uid: &str, changes: &std::collections::BTreeMap<String, Option<String>>) {
        if let Some(t) = self.lock().pods.get_mut(key).filter(|t| t.uid == uid) {
            let a = t.pod.metadata.annotations.get_or_insert_with(Default::default);
            for (k, v) in changes {
                match v {
                    Some(v) => a.insert(k.clone(), v.clone()),
                    None => a.remove(k),
                };
            }
        }
    }

    pub fn tracked(&self, key: &str) -> Option<Tracked> {
        self.lock().pods.get(key).cloned()
    }

    /// The tracked row of incarnation `uid`.
    pub fn tracked_as(&self, key: &str, uid: &str) -> Option<Tracked> {
        self.lock().pods.get(key).filter(|t| t.uid == uid).cloned()
    }

    /// Replaces the tracked VM record of incarnation `uid` when it still is VM `vm.id`
    /// (a refresh after a restart in place, or a NIC change); false when the VM changed.
    pub fn refresh_vm(&self, key: &str, uid: &str, vm: VmRecord) -> bool {
        let mut s = self.lock();
        let Some(t) = s
            .pods
            .get_mut(key)
            .filter(|t| t.uid == uid && t.vm.as_ref().is_some_and(|v| v.id == vm.id))
        else {
            return false;
        };
        t.vm = Some(vm.clone());
        let name = t.vm_name.clone();
        s.vms_by_name.insert(name, vm);
        true
    }

    /// Detaches the VM of incarnation `uid` (it was removed): the pod stays tracked, marked
    /// hibernated when its guest state was saved.
    pub fn detach_vm(&self, key: &str, uid: &str, hibernated: bool) {
        let mut s = self.lock();
        let Some(t) = s.pods.get_mut(key).filter(|t| t.uid == uid) else {
            return;
        };
        t.vm = None;
        t.hibernated = hibernated;
        let name = t.vm_name.clone();
        s.vms_by_name.remove(&name);
    }

    /// Marks a VM-less tracked incarnation as hibernated (startup: its guest is in a snapshot).
    pub fn mark_hibernated(&self, key: &str, uid: &str) {
        if let Some(t) = self.lock().pods.get_mut(key).filter(|t| t.uid == uid && t.vm.is_none()) {
            t.hibernated = true;
        }
    }

    /// The tracked pod running VM `vm_id`; for a record without an id, the pod whose VM is named
    /// `vm_name`. (An event about an older VM of the same name never matches the current one.)
    pub fn pod_of_vm(&self, vm_id: &str, vm_name: &str) -> Option<(String, Tracked)> {
        let s = self.lock();
        let found = if !vm_id.is_empty() {
            s.pods
                .iter()
                .find(|(_, t)| t.vm.as_ref().is_some_and(|v| v.id == vm_id))
        } else if !vm_name.is_empty() {
            s.pods.iter().find(|(_, t)| t.vm.is_some() && t.vm_name == vm_name)
        } else {
            None
        };
        found.map(|(k, t)| (k.clone(), t.clone()))
    }

    /// Drops a provisional tracked pod of incarnation `uid` (its intent stays).
    pub fn untrack(&self, key: &str, uid: &str) {
        let mut s = self.lock();
        if s.pods.get(key).is_some_and(|t| t.uid == uid) {
            s.pods.remove(key);
        }
    }

    /// Forgets incarnation `uid`: tracked row, its VM's name index, its intent, its guest work
    /// and any retry owed to it.
    pub fn forget(&self, key: &str, uid: &str, vm_name: &str) {
        let mut s = self.lock();
        if s.pods.get(key).is_some_and(|t| t.uid == uid) {
            s.pods.remove(key);
        }
        if s.intents.get(key).is_some_and(|i| i.intent.uid == uid) {
            s.intents.remove(key);
        }
        if !vm_name.is_empty() {
            s.vms_by_name.remove(vm_name);
        }
        if s.guest_work.get(key).is_some_and(|(u, _)| u == uid)
            && let Some((_, work)) = s.guest_work.remove(key)
        {
            work.stop.cancel();
        }
        if s.retries.get(key).is_some_and(|r| r.uid == uid) {
            s.retries.remove(key);
        }
    }

    // ---- resume claims, evictions, guest work ----

    /// Claims `key` for work resumed after a restart; false when already claimed.
    pub fn claim_resume(&self, key: &str) -> bool {
        self.lock().resumed.insert(key.into())
    }

    pub fn release_resume(&self, key: &str) {
        self.lock().resumed.remove(key);
    }

    pub fn resume_claimed(&self, key: &str) -> bool {
        self.lock().resumed.contains(key)
    }

    pub fn is_deleting(&self, key: &str) -> bool {
        self.lock().deleting.contains(key)
    }

    /// Records the final status of an evicted incarnation and untracks it.
    pub fn evicted(&self, key: &str, uid: &str, status: ProviderPodStatus) {
        let mut s = self.lock();
        if s.pods.get(key).is_some_and(|t| t.uid == uid) {
            let name = s.pods.remove(key).map(|t| t.vm_name).unwrap_or_default();
            s.vms_by_name.remove(&name);
        }
        let now = Instant::now();
        s.terminal
            .retain(|_, (_, _, at)| now.saturating_duration_since(*at) < TERMINAL_TTL);
        s.terminal.insert(key.into(), (uid.into(), status, now));
    }

    pub fn terminal_status(&self, key: &str, uid: &str) -> Option<ProviderPodStatus> {
        self.lock()
            .terminal
            .get(key)
            .filter(|(u, _, _)| u == uid)
            .map(|(_, st, _)| st.clone())
    }

    /// Registers the guest work of incarnation `uid`, stopping any earlier work of the pod.
    pub fn begin_guest_work(&self, key: &str, uid: &str) -> GuestWork {
        let mut s = self.lock();
        s.next_token += 1;
        let work = GuestWork {
            id: s.next_token,
            stop: CancellationToken::new(),
        };
        if let Some(old) = s.guest_work.insert(key.into(), (uid.into(), work.clone())) {
            old.1.stop.cancel();
        }
        work
    }

    /// Stops the pod's guest work (hibernate, delete, eviction).
    pub fn stop_guest_work(&self, key: &str) {
        if let Some((_, work)) = self.lock().guest_work.remove(key) {
            work.stop.cancel();
        }
    }

    /// The guest work `work` finished (a later registration is left alone).
    pub fn end_guest_work(&self, key: &str, work: &GuestWork) {
        let mut s = self.lock();
        if s.guest_work.get(key).is_some_and(|(_, w)| w.id == work.id) {
            s.guest_work.remove(key);
        }
    }

    pub fn guest_work_running(&self, key: &str) -> bool {
        self.lock().guest_work.contains_key(key)
    }

    // ---- the VM watcher's memory ----

    /// When VM `vm_id` was last restarted in place.
    pub fn last_restart(&self, vm_id: &str) -> Option<Instant> {
        self.lock().last_restart.get(vm_id).copied()
    }

    pub fn record_restart(&self, vm_id: &str, at: Instant) {
        self.lock().last_restart.insert(vm_id.into(), at);
    }

    /// Drops restart records older than `age` (after a clean end of the event stream).
    pub fn gc_restarts(&self, now: Instant, age: Duration) {
        self.lock()
            .last_restart
            .retain(|_, at| now.saturating_duration_since(*at) < age);
    }

    /// Starts a deferred recheck of VM `vm_id`; false when one is already running.
    pub fn begin_recheck(&self, vm_id: &str) -> bool {
        self.lock().rechecks.insert(vm_id.into())
    }

    pub fn end_recheck(&self, vm_id: &str) {
        self.lock().rechecks.remove(vm_id);
    }

    /// Starts handling an event of VM `vm_id`; false when one is already being handled.
    pub fn begin_vm_event(&self, vm_id: &str) -> bool {
        self.lock().handling.insert(vm_id.into())
    }

    pub fn end_vm_event(&self, vm_id: &str) {
        self.lock().handling.remove(vm_id);
    }

    // ---- owed retries (decision 10) ----

    /// Schedules the next retry of incarnation `uid`: returns the delay (`min` the first time,
    /// then doubling up to `max`) and the token identifying this schedule.
    pub fn owe_retry(&self, key: &str, uid: &str, min: Duration, max: Duration) -> (Duration, u64) {
        let mut s = self.lock();
        let previous = s.retries.get(key).filter(|r| r.uid == uid).map(|r| r.delay);
        let delay = super::retry::next_delay(previous, min, max);
        s.next_token += 1;
        let token = s.next_token;
        s.retries.insert(
            key.into(),
            OwedRetry {
                uid: uid.into(),
                delay,
                token,
            },
        );
        (delay, token)
    }

    /// Whether the retry scheduled with `token` is still the one owed to the tracked incarnation.
    pub fn retry_due(&self, key: &str, token: u64) -> bool {
        let s = self.lock();
        s.retries
            .get(key)
            .is_some_and(|r| r.token == token && s.pods.get(key).is_some_and(|t| t.uid == r.uid))
    }

    pub fn owed_retry(&self, key: &str) -> Option<OwedRetry> {
        self.lock().retries.get(key).cloned()
    }

    /// The operation succeeded (or is no longer owed): no retry.
    pub fn settle_retry(&self, key: &str, uid: &str) {
        let mut s = self.lock();
        if s.retries.get(key).is_some_and(|r| r.uid == uid) {
            s.retries.remove(key);
        }
    }

    pub fn vm_by_name(&self, name: &str) -> Option<VmRecord> {
        self.lock().vms_by_name.get(name).cloned()
    }

    pub fn index_vm(&self, name: &str, vm: VmRecord) {
        self.lock().vms_by_name.insert(name.into(), vm);
    }

    pub fn vm_count(&self) -> usize {
        self.lock().vms_by_name.len()
    }

    pub fn tracked_keys(&self) -> Vec<String> {
        self.lock().pods.keys().cloned().collect()
    }

    /// Calls `f` for every tracked pod under the table's lock (readers copy only what they
    /// need: the stats sampler reads 1,000 rows per scrape).
    pub fn for_each_tracked(&self, mut f: impl FnMut(&str, &Tracked)) {
        for (key, t) in &self.lock().pods {
            f(key, t);
        }
    }

    /// Stages an intent under the §3.8 rules; the caller flushes it.
    pub fn stage_intent(&self, key: &str, mut intent: Intent, pod: Option<&Pod>) -> Result<Intent, Dropped> {
        let mut s = self.lock();
        let tracked = s.pods.get(key);
        if let Some(t) = tracked {
            let g = lifecycle::pod_generation(t.pod.metadata.annotations.as_ref().unwrap_or(&Default::default()));
            intent.generation = intent.generation.max(g);
        }
        let tracked_uid = tracked.map(|t| t.uid.clone());
        lifecycle::admit(s.intents.get(key).map(|i| &i.intent), tracked_uid.as_deref(), &intent)?;
        let changes = intent.annotations();
        if let Some(t) = s.pods.get_mut(key).filter(|t| t.uid == intent.uid) {
            let a = t.pod.metadata.annotations.get_or_insert_with(Default::default);
            for (k, v) in changes {
                match v {
                    Some(v) => a.insert(k, v),
                    None => a.remove(&k),
                };
            }
        }
        s.intents.insert(
            key.into(),
            StoredIntent {
                intent: intent.clone(),
                flushed: false,
                pod: pod.cloned(),
            },
        );
        Ok(intent)
    }

    /// Seeds an intent read from the pod at startup (already on the apiserver).
    pub fn seed_intent(&self, key: &str, intent: Intent) {
        self.lock().intents.insert(
            key.into(),
            StoredIntent {
                intent,
                flushed: true,
                pod: None,
            },
        );
    }

    pub fn intent(&self, key: &str) -> Option<Intent> {
        self.lock().intents.get(key).map(|i| i.intent.clone())
    }

    /// Whether `intent` is still the stored one (a flush aborts when it changed).
    pub fn is_current(&self, key: &str, intent: &Intent) -> bool {
        self.lock().intents.get(key).is_some_and(|i| i.intent == *intent)
    }

    pub fn mark_flushed(&self, key: &str, intent: &Intent) {
        if let Some(i) = self.lock().intents.get_mut(key).filter(|i| i.intent == *intent) {
            i.flushed = true;
        }
    }

    pub fn drop_intent(&self, key: &str, uid: &str) {
        let mut s = self.lock();
        if s.intents.get(key).is_some_and(|i| i.intent.uid == uid) {
            s.intents.remove(key);
        }
    }

    /// Intents not yet on the apiserver (re-flushed by the lifecycle reconciler).
    pub fn unflushed(&self) -> Vec<(String, Intent, Option<Pod>)> {
        self.lock()
            .intents
            .iter()
            .filter(|(_, i)| !i.flushed)
            .map(|(k, i)| (k.clone(), i.intent.clone(), i.pod.clone()))
            .collect()
    }

    /// The delete fence: false when a delete of `key` is already running.
    pub fn begin_delete(&self, key: &str) -> bool {
        self.lock().deleting.insert(key.into())
    }

    pub fn end_delete(&self, key: &str) {
        self.lock().deleting.remove(key);
    }

    /// The lock serialising the operations that change one pod's VM (UpdatePod's transitions,
    /// their owed retries, resumed hibernates, DeletePod).
    pub fn op_lock(&self, pod_key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.key_lock(&format!("op:{pod_key}"))
    }

    /// An async lock per work key: concurrent callers serialise on it and the later ones find
    /// the work done.
    pub fn key_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .expect("key locks")
            .entry(key.into())
            .or_default()
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::lifecycle::LifecycleState;

    fn pod(uid: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p
    }

    fn intent(uid: &str, state: LifecycleState) -> Intent {
        Intent {
            uid: uid.into(),
            state,
            generation: 0,
            message: String::new(),
        }
    }

    #[test]
    fn a_stale_incarnation_cannot_write_after_a_new_one_claims_the_key() {
        let s = State::default();
        s.track("ns/p", &pod("u1"), "vm");
        s.stage_intent("ns/p", intent("u1", LifecycleState::Creating), None)
            .unwrap();
        s.track("ns/p", &pod("u2"), "vm");
        assert_eq!(
            s.intent("ns/p"),
            None,
            "the old incarnation's intent is dropped on claim"
        );
        assert_eq!(
            s.stage_intent("ns/p", intent("u1", LifecycleState::Failed), None),
            Err(Dropped::OtherIncarnation)
        );
        s.stage_intent("ns/p", intent("u2", LifecycleState::Ready), None)
            .unwrap();
        let t = s.tracked("ns/p").unwrap();
        assert_eq!(t.pod.metadata.annotations.unwrap()[lifecycle::STATE], "ready");
    }

    #[test]
    fn vms_index_by_name_and_forget_clears_everything_of_that_incarnation() {
        let s = State::default();
        s.track("ns/p", &pod("u1"), "vm");
        assert!(!s.set_vm(
            "ns/p",
            "u0",
            VmRecord {
                id: "x".into(),
                ..Default::default()
            }
        ));
        assert!(s.set_vm(
            "ns/p",
            "u1",
            VmRecord {
                id: "id1".into(),
                ..Default::default()
            }
        ));
        assert_eq!(s.vm_by_name("vm").unwrap().id, "id1");
        s.stage_intent("ns/p", intent("u1", LifecycleState::Ready), None)
            .unwrap();
        s.forget("ns/p", "u1", "vm");
        assert!(s.tracked("ns/p").is_none() && s.vm_by_name("vm").is_none() && s.intent("ns/p").is_none());
    }

    #[test]
    fn an_owed_retry_doubles_and_is_dropped_with_its_incarnation() {
        let s = State::default();
        s.track("ns/p", &pod("u1"), "vm");
        let (min, max) = (Duration::from_secs(15), Duration::from_secs(300));
        let (d1, t1) = s.owe_retry("ns/p", "u1", min, max);
        let (d2, t2) = s.owe_retry("ns/p", "u1", min, max);
        assert_eq!((d1, d2), (min, min * 2));
        assert!(!s.retry_due("ns/p", t1), "a later schedule supersedes the earlier one");
        assert!(s.retry_due("ns/p", t2));
        s.track("ns/p", &pod("u2"), "vm");
        assert!(
            !s.retry_due("ns/p", t2),
            "owed only while the same incarnation is tracked"
        );
        let (_, t3) = s.owe_retry("ns/p", "u2", min, max);
        s.forget("ns/p", "u2", "vm");
        assert!(
            !s.retry_due("ns/p", t3) && s.owed_retry("ns/p").is_none(),
            "forgetting the pod drops its retry"
        );
    }

    #[test]
    fn the_delete_fence_admits_one() {
        let s = State::default();
        assert!(s.begin_delete("k"));
        assert!(!s.begin_delete("k"));
        s.end_delete("k");
        assert!(s.begin_delete("k"));
    }
}
