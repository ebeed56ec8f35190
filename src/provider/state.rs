//! The provider's in-memory tables (behaviour spec §3.1): tracked pods with their incarnation
//! and VM, VMs by name, lifecycle intents, the delete fence, and per-key async locks that make
//! concurrent callers share one piece of work (fork snapshots, snapshot pulls, image pulls).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;

use super::lifecycle::{self, Dropped, Intent};
use crate::runtime::VmRecord;

/// A pod the provider tracks.
#[derive(Debug, Clone)]
pub struct Tracked {
    pub pod: Pod,
    pub uid: String,
    pub vm_name: String,
    pub vm: Option<VmRecord>,
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
        if s.intents.get(key).is_some_and(|i| i.intent.uid != uid) {
            s.intents.remove(key);
        }
        s.pods.insert(key.into(), Tracked { pod: pod.clone(), uid, vm_name: vm_name.into(), vm });
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
        let Some(t) = s.pods.get_mut(key).filter(|t| t.uid == uid) else { return false };
        t.vm = Some(vm.clone());
        let name = if vm.name().is_empty() { t.vm_name.clone() } else { vm.name().to_string() };
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

    /// Drops a provisional tracked pod of incarnation `uid` (its intent stays).
    pub fn untrack(&self, key: &str, uid: &str) {
        let mut s = self.lock();
        if s.pods.get(key).is_some_and(|t| t.uid == uid) {
            s.pods.remove(key);
        }
    }

    /// Forgets incarnation `uid`: tracked row, its VM's name index and its intent.
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
        s.intents.insert(key.into(), StoredIntent { intent: intent.clone(), flushed: false, pod: pod.cloned() });
        Ok(intent)
    }

    /// Seeds an intent read from the pod at startup (already on the apiserver).
    pub fn seed_intent(&self, key: &str, intent: Intent) {
        self.lock().intents.insert(key.into(), StoredIntent { intent, flushed: true, pod: None });
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
        self.lock().intents.iter().filter(|(_, i)| !i.flushed).map(|(k, i)| (k.clone(), i.intent.clone(), i.pod.clone())).collect()
    }

    /// The delete fence: false when a delete of `key` is already running.
    pub fn begin_delete(&self, key: &str) -> bool {
        self.lock().deleting.insert(key.into())
    }

    pub fn end_delete(&self, key: &str) {
        self.lock().deleting.remove(key);
    }

    /// An async lock per work key: concurrent callers serialise on it and the later ones find
    /// the work done.
    pub fn key_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.lock().expect("key locks").entry(key.into()).or_default().clone()
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
        Intent { uid: uid.into(), state, generation: 0, message: String::new() }
    }

    #[test]
    fn a_stale_incarnation_cannot_write_after_a_new_one_claims_the_key() {
        let s = State::default();
        s.track("ns/p", &pod("u1"), "vm");
        s.stage_intent("ns/p", intent("u1", LifecycleState::Creating), None).unwrap();
        s.track("ns/p", &pod("u2"), "vm");
        assert_eq!(s.intent("ns/p"), None, "the old incarnation's intent is dropped on claim");
        assert_eq!(s.stage_intent("ns/p", intent("u1", LifecycleState::Failed), None), Err(Dropped::OtherIncarnation));
        s.stage_intent("ns/p", intent("u2", LifecycleState::Ready), None).unwrap();
        let t = s.tracked("ns/p").unwrap();
        assert_eq!(t.pod.metadata.annotations.unwrap()[lifecycle::STATE], "ready");
    }

    #[test]
    fn vms_index_by_name_and_forget_clears_everything_of_that_incarnation() {
        let s = State::default();
        s.track("ns/p", &pod("u1"), "vm");
        assert!(!s.set_vm("ns/p", "u0", VmRecord { id: "x".into(), ..Default::default() }));
        assert!(s.set_vm("ns/p", "u1", VmRecord { id: "id1".into(), ..Default::default() }));
        assert_eq!(s.vm_by_name("vm").unwrap().id, "id1");
        s.stage_intent("ns/p", intent("u1", LifecycleState::Ready), None).unwrap();
        s.forget("ns/p", "u1", "vm");
        assert!(s.tracked("ns/p").is_none() && s.vm_by_name("vm").is_none() && s.intent("ns/p").is_none());
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
