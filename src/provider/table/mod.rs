//! The provider's in-memory state: one [`PodEntry`] per pod key, one [`VmTable`] and who holds
//! each VM name ([`Holders`]), under one lock that is never held across an await.
//!
//! Readers get copies ([`Tracked`]); every write names the incarnation (uid) it is for, so work of
//! an older incarnation can never change a newer one's record. Work shared between pods runs as
//! single flights ([`SharedWork`], in the provider).

mod entry;
mod holders;
mod intents;
mod shared;
mod vms;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

pub use entry::{Claim, GuestWork, OwedRetry, Phase, PodEntry, StoredIntent, Terminal};
pub use holders::{Holder, Holders, WokenFrom};
pub use shared::{Interrupted, SHARED_WORK_DEADLINE, SharedWork};
pub use vms::{VmRow, VmTable};

use crate::kubelet::pods::same_for_provider;
use crate::kubelet::{PodKey, ProviderPodStatus, Uid};
use crate::retry::Schedule;
use crate::runtime::VmRecord;

/// A copy of a tracked pod's row.
#[derive(Debug, Clone)]
pub struct Tracked {
    pub pod: Arc<Pod>,
    pub uid: String,
    pub vm_name: String,
    pub vm: Option<VmRecord>,
    /// No VM because the guest is hibernated (its state is in a snapshot): the pod stays alive.
    pub hibernated: bool,
}

/// The incarnation of a pod object, as text.
pub fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// How long the final status of an evicted pod is kept for its finalize.
const TERMINAL_TTL: Duration = Duration::from_secs(600);

#[derive(Default)]
struct Inner {
    /// Boxed: a record holds whole pod objects inline (several KiB), and a map stores its values
    /// in its slots, so an unboxed map costs that much for every free slot as well (up to half
    /// of them after a resize) and moves every record on each resize.
    pods: HashMap<PodKey, Box<PodEntry>>,
    vms: VmTable,
    /// Who holds each VM name (persisted).
    holders: Holders,
    /// The hibernate snapshot each VM name was last woken from here (persisted).
    woken: WokenFrom,
    next_token: u64,
}

/// What a VM name is to a pod that wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameClaim {
    /// No pod holds it.
    Free,
    /// A pod of this namespace and name holds it.
    Own,
    /// Another pod holds it; `live`: a pod of that namespace and name exists now.
    Other { holder: Holder, live: bool },
}

impl Inner {
    /// A pod of this key exists: the node tracks it, or is deleting it.
    fn live(&self, key: &str) -> bool {
        self.pods.get(key).is_some_and(|e| e.claim.is_some() || e.deleting)
    }

    fn name_claim(&self, name: &str, key: &str) -> NameClaim {
        match self.holders.get(name) {
            None => NameClaim::Free,
            Some(h) if h.is(key) => NameClaim::Own,
            Some(h) => NameClaim::Other {
                holder: h.clone(),
                live: self.live(h.key().as_str()),
            },
        }
    }

    fn holds(&self, key: &str, name: &str) -> bool {
        self.holders.get(name).is_some_and(|h| h.is(key))
    }

    /// Removes the row of `name` when it is `key`'s: its VM, or a VM indexed for adoption
    /// under a name `key` holds. Another pod's row is never touched.
    fn remove_row_of(&mut self, key: &str, name: &str) {
        let ours = self.vms.get(name).is_some_and(|r| match &r.owner {
            Some(owner) => owner == key,
            None => self.holds(key, name),
        });
        if ours {
            self.vms.remove(name);
        }
    }

    fn entry(&mut self, key: &str) -> &mut PodEntry {
        if !self.pods.contains_key(key) {
            self.pods.insert(PodKey::from(key), Box::default());
        }
        self.pods.get_mut(key).expect("just inserted")
    }

    /// Drops the record of `key` when nothing is left in it.
    fn prune(&mut self, key: &str) {
        if self.pods.get(key).is_some_and(|e| e.is_empty()) {
            self.pods.remove(key);
        }
    }

    fn view(&self, claim: &Claim) -> Tracked {
        let (vm, hibernated) = match &claim.phase {
            Phase::Running { vm } => (self.vms.get(vm).map(|r| r.record.clone()), false),
            Phase::Hibernated => (None, true),
            Phase::NoVm => (None, false),
        };
        Tracked {
            pod: claim.pod.clone(),
            uid: claim.uid.to_string(),
            vm_name: claim.vm_name.clone(),
            vm,
            hibernated,
        }
    }

    /// Removes the VM row the claim of `key` runs on, if it is the pod's.
    fn drop_vm_of(&mut self, key: &str) {
        let Some(Phase::Running { vm }) = self.pods.get(key).and_then(|e| e.claim.as_ref()).map(|c| &c.phase) else {
            return;
        };
        let vm = vm.clone();
        if self
            .vms
            .get(&vm)
            .is_some_and(|r| r.owner.as_ref().map(PodKey::as_str) == Some(key))
        {
            self.vms.remove(&vm);
        }
    }
}

/// The provider's state.
#[derive(Default)]
pub struct Table {
    inner: Mutex<Inner>,
}

impl Table {
    /// A table whose VM name records (`holders`, `woken`) were loaded from the state directory.
    pub fn with_records(holders: Holders, woken: WokenFrom) -> Self {
        Self {
            inner: Mutex::new(Inner {
                holders,
                woken,
                ..Default::default()
            }),
        }
    }
}

/// The operation lock of one pod, held; dropping it releases the lock and lets the record go when
/// nothing else is left in it.
pub struct OpGuard<'a> {
    table: &'a Table,
    key: PodKey,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        self.guard.take();
        self.table.lock().prune(self.key.as_str());
    }
}

impl Table {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("provider table lock")
    }

    // ---- claims and VMs ----

    /// Claims the incarnation: tracks `pod` (without a VM unless the same incarnation already
    /// has one). Another incarnation's intent and final status are dropped.
    pub fn track(&self, key: &str, pod: &Arc<Pod>, vm_name: &str) {
        let uid = Uid::of(pod);
        let mut s = self.lock();
        let e = s.entry(key);
        let phase = e.claim_of(uid.as_str()).map(|c| c.phase.clone()).unwrap_or(Phase::NoVm);
        if e.intent.as_ref().is_some_and(|i| i.intent.uid != uid.as_str()) {
            e.intent = None;
        }
        if e.terminal.as_ref().is_some_and(|t| t.uid != uid) {
            e.terminal = None;
        }
        e.claim = Some(Claim {
            uid,
            pod: Arc::clone(pod),
            vm_name: vm_name.into(),
            phase,
        });
    }

    /// Refreshes the tracked copy of the same incarnation (annotations such as the keep flag).
    /// A pod of the tracked copy's own resource version is that copy before the provider's own
    /// annotation writes were applied to it (a CreatePod after a restart gets the version the
    /// startup listed): the copy stays, or those writes would be forgotten and work they record
    /// as done would look owed.
    ///
    /// A copy of another version may also be older than the tracked one (the pod controller
    /// queued the listed version while the watch delivered the echo of a later write): the
    /// provider's own latest lifecycle write is kept on it for the same reason.
    pub fn refresh(&self, key: &str, pod: &Arc<Pod>) {
        let uid = Uid::of(pod);
        let mut s = self.lock();
        let Some(e) = s.pods.get_mut(key) else {
            return;
        };
        let own_write = e
            .intent
            .as_ref()
            .filter(|stored| uid == stored.intent.uid.as_str())
            .map(|stored| stored.intent.annotations());
        if let Some(c) = e.claim_of_mut(uid.as_str()) {
            let version = pod.metadata.resource_version.as_ref();
            if version.is_none() || version != c.pod.metadata.resource_version.as_ref() {
                c.pod = with_own_write(pod, own_write);
            }
        }
    }

    /// Shares `pod`, a newer version of the claimed incarnation seen on the watch, when it
    /// differs from the tracked copy only where the provider does not look (status, resource
    /// version): the echo of the provider's own status and annotation writes. Without this the
    /// table would keep the version before each echo beside the core's newer one, two objects per
    /// pod. A version the core would run an update for (see [`same_for_provider`]) is left to
    /// `update_pod`, which refreshes the copy when it runs. Returns whether the copy is now `pod`.
    pub fn share_echo(&self, key: &str, pod: &Arc<Pod>) -> bool {
        let uid = Uid::of(pod);
        let mut s = self.lock();
        let Some(c) = s.pods.get_mut(key).and_then(|e| e.claim_of_mut(uid.as_str())) else {
            return false;
        };
        let same_view = Arc::ptr_eq(&c.pod, pod) || same_for_provider(&c.pod, pod);
        if same_view {
            c.pod = Arc::clone(pod);
        }
        same_view
    }

    /// Attaches `vm` to the tracked incarnation `uid` (its row in the VM table). False when
    /// the incarnation is gone, or the pod does not hold the VM's name (a VM is only ever the
    /// row of the pod holding its name).
    pub fn set_vm(&self, key: &str, uid: &str, vm: VmRecord) -> bool {
        let mut s = self.lock();
        let Some(c) = s.pods.get(key).and_then(|e| e.claim_of(uid)) else {
            return false;
        };
        let name = if vm.name().is_empty() {
            c.vm_name.clone()
        } else {
            vm.name().to_string()
        };
        if !s.holds(key, &name) {
            tracing::warn!(pod = key, vm = %name, "a vm whose name the pod does not hold is not attached to it");
            return false;
        }
        s.drop_vm_of(key);
        s.vms.put(&name, vm, Some(PodKey::from(key)));
        if let Some(c) = s.pods.get_mut(key).and_then(|e| e.claim_of_mut(uid)) {
            c.phase = Phase::Running { vm: name };
        }
        true
    }

    /// Sets or removes annotations on the tracked copy (same incarnation).
    pub fn set_annotations(&self, key: &str, uid: &str, changes: &BTreeMap<String, Option<String>>) {
        if let Some(c) = self.lock().pods.get_mut(key).and_then(|e| e.claim_of_mut(uid)) {
            apply(
                Arc::make_mut(&mut c.pod),
                changes.iter().map(|(k, v)| (k.clone(), v.clone())),
            );
        }
    }

    pub fn tracked(&self, key: &str) -> Option<Tracked> {
        let s = self.lock();
        let claim = s.pods.get(key)?.claim.as_ref()?;
        Some(s.view(claim))
    }

    /// The tracked row of incarnation `uid`.
    pub fn tracked_as(&self, key: &str, uid: &str) -> Option<Tracked> {
        let s = self.lock();
        let claim = s.pods.get(key)?.claim_of(uid)?;
        Some(s.view(claim))
    }

    /// Replaces the VM record of incarnation `uid` when it still is VM `vm.id` (a refresh after a
    /// restart in place, or a NIC change); false when the VM changed.
    pub fn refresh_vm(&self, key: &str, uid: &str, vm: VmRecord) -> bool {
        let mut s = self.lock();
        let Some(Phase::Running { vm: name }) = s.pods.get(key).and_then(|e| e.claim_of(uid)).map(|c| c.phase.clone())
        else {
            return false;
        };
        match s.vms.get_mut(&name) {
            Some(row) if row.record.id == vm.id => {
                row.record = vm;
                true
            }
            _ => false,
        }
    }

    /// Detaches the VM of incarnation `uid` (it was removed): the pod stays tracked, marked
    /// hibernated when its guest state was saved.
    pub fn detach_vm(&self, key: &str, uid: &str, hibernated: bool) {
        let mut s = self.lock();
        if s.pods.get(key).and_then(|e| e.claim_of(uid)).is_none() {
            return;
        }
        s.drop_vm_of(key);
        if let Some(c) = s.pods.get_mut(key).and_then(|e| e.claim_of_mut(uid)) {
            let name = c.vm_name.clone();
            c.phase = if hibernated { Phase::Hibernated } else { Phase::NoVm };
            s.remove_row_of(key, &name);
        }
    }

    /// Marks a VM-less tracked incarnation as hibernated (startup: its guest is in a snapshot).
    pub fn mark_hibernated(&self, key: &str, uid: &str) {
        if let Some(c) = self.lock().pods.get_mut(key).and_then(|e| e.claim_of_mut(uid))
            && c.phase == Phase::NoVm
        {
            c.phase = Phase::Hibernated;
        }
    }

    /// The tracked pod running VM `vm_id`; for a record without an id, the pod whose VM is named
    /// `vm_name`. (An event about an older VM of the same name never matches the current one.)
    pub fn pod_of_vm(&self, vm_id: &str, vm_name: &str) -> Option<(String, Tracked)> {
        let mut s = self.lock();
        let row = if !vm_id.is_empty() {
            s.vms.by_id_mut(vm_id).map(|r| r.owner.clone())
        } else if !vm_name.is_empty() {
            s.vms.get(vm_name).map(|r| r.owner.clone())
        } else {
            None
        };
        let key = row.flatten()?;
        let claim = s.pods.get(&key)?.claim.as_ref()?;
        matches!(claim.phase, Phase::Running { .. }).then(|| (key.to_string(), s.view(claim)))
    }

    /// Drops a provisional claim of incarnation `uid` (its intent stays).
    pub fn untrack(&self, key: &str, uid: &str) {
        let mut s = self.lock();
        if s.pods.get(key).and_then(|e| e.claim_of(uid)).is_some() {
            s.entry(key).claim = None;
        }
        s.prune(key);
    }

    /// Forgets incarnation `uid`: its claim, its VM's row, its intent, its guest work and any
    /// retry owed to it.
    pub fn forget(&self, key: &str, uid: &str, vm_name: &str) {
        let mut s = self.lock();
        if s.pods.get(key).and_then(|e| e.claim_of(uid)).is_some() {
            s.drop_vm_of(key);
            s.entry(key).claim = None;
        }
        if !vm_name.is_empty() {
            s.remove_row_of(key, vm_name);
        }
        if let Some(e) = s.pods.get_mut(key) {
            if e.intent.as_ref().is_some_and(|i| i.intent.uid == uid) {
                e.intent = None;
            }
            if e.guest_work.as_ref().is_some_and(|w| w.uid == uid)
                && let Some(work) = e.guest_work.take()
            {
                work.stop.cancel();
            }
            if e.retry.as_ref().is_some_and(|r| r.uid == uid) {
                e.retry = None;
            }
        }
        s.prune(key);
    }

    pub fn vm_by_name(&self, name: &str) -> Option<VmRecord> {
        self.lock().vms.get(name).map(|r| r.record.clone())
    }

    // ---- VM name holders ----

    /// What VM name `name` is to pod `key`.
    pub fn name_claim(&self, name: &str, key: &str) -> NameClaim {
        self.lock().name_claim(name, key)
    }

    /// Pod `key` holds VM name `name`.
    pub fn holds(&self, key: &str, name: &str) -> bool {
        self.lock().holds(key, name)
    }

    /// Whether VM name `name` is held by pod `key` (`None`: nobody holds it). Copies nothing:
    /// the startup asks it for every listed VM.
    pub fn name_held_by(&self, name: &str, key: &str) -> Option<bool> {
        self.lock().holders.get(name).map(|h| h.is(key))
    }

    /// Whether the tracked incarnation `uid` of `key` runs on a VM (`None`: that incarnation is
    /// not tracked). Copies nothing, unlike [`Self::tracked_as`].
    pub fn has_vm_as(&self, key: &str, uid: &str) -> Option<bool> {
        let s = self.lock();
        let claim = s.pods.get(key)?.claim_of(uid)?;
        Some(match &claim.phase {
            Phase::Running { vm } => s.vms.get(vm).is_some(),
            Phase::Hibernated | Phase::NoVm => false,
        })
    }

    /// The holder of `name`, and whether a pod of its key exists now.
    pub fn holder_of(&self, name: &str) -> Option<(Holder, bool)> {
        let s = self.lock();
        let h = s.holders.get(name)?.clone();
        let live = s.live(h.key().as_str());
        Some((h, live))
    }

    /// Pod `key` (incarnation `uid`) takes VM name `name`, unless another pod that exists now
    /// holds it (`Err` with that holder). Checked and recorded under one lock, so of two pods
    /// racing for a name exactly one gets it.
    pub fn take_name(&self, name: &str, key: &str, uid: &str) -> Result<(), Holder> {
        let mut s = self.lock();
        if let NameClaim::Other { holder, live: true } = s.name_claim(name, key) {
            return Err(holder);
        }
        s.holders.put(name, Holder::new(key, uid));
        Ok(())
    }

    /// The `:hibernate` snapshot id VM name `name`'s guest was last woken from here.
    pub fn woken_from(&self, name: &str) -> Option<String> {
        self.lock().woken.get(name).cloned()
    }

    /// VM name `name`'s guest was woken from snapshot `id` (`None`: it was hibernated again, its
    /// tag holds a new guest).
    pub fn set_woken_from(&self, name: &str, id: Option<&str>) {
        let mut s = self.lock();
        match id {
            Some(id) => s.woken.put(name, id.to_string()),
            None => s.woken.release(name),
        }
    }

    /// Pod `key` gives up VM name `name` (its VM and its snapshots are gone); another pod's
    /// hold is left alone.
    pub fn release_name(&self, key: &str, name: &str) {
        let mut s = self.lock();
        if s.holds(key, name) {
            s.holders.release(name);
        }
    }

    /// The name of a VM another pod than `key` owns that the cocoon ref `reference` may resolve
    /// to (cocoon resolves an exact id, then a name, then a unique id prefix of at least 3
    /// characters).
    pub fn foreign_vm_of_ref(&self, reference: &str, key: &str) -> Option<String> {
        if reference.is_empty() {
            return None;
        }
        let s = self.lock();
        s.vms.rows().find_map(|(name, row)| {
            row.owner.as_ref().filter(|o| o.as_str() != key)?;
            let hit = row.record.id == reference
                || name == reference
                || (reference.len() >= 3 && row.record.id.starts_with(reference));
            hit.then(|| name.to_string())
        })
    }

    /// Calls `f` with the name, record and owner of every VM row a pod other than `key` owns.
    pub fn for_each_foreign_vm(&self, key: &str, mut f: impl FnMut(&str, &VmRecord)) {
        let s = self.lock();
        for (name, row) in s.vms.rows() {
            if row.owner.as_ref().is_some_and(|o| o.as_str() != key) {
                f(name, &row.record);
            }
        }
    }

    /// Indexes a VM no pod owns yet (a CreatePod adopts it by name).
    pub fn index_vm(&self, name: &str, vm: VmRecord) {
        let mut s = self.lock();
        let owner = s
            .vms
            .get(name)
            .filter(|r| r.record.id == vm.id)
            .and_then(|r| r.owner.clone());
        s.vms.put(name, vm, owner);
    }

    /// VMs in the table.
    pub fn vm_count(&self) -> usize {
        self.lock().vms.len()
    }

    pub fn tracked_keys(&self) -> Vec<String> {
        let s = self.lock();
        s.pods
            .iter()
            .filter(|(_, e)| e.claim.is_some())
            .map(|(k, _)| k.to_string())
            .collect()
    }

    /// Calls `f` for every tracked pod under the table's lock (readers copy only what they
    /// need: the stats sampler reads 1,000 rows per scrape).
    pub fn for_each_tracked(&self, mut f: impl FnMut(&str, &Claim, Option<&VmRecord>)) {
        let s = self.lock();
        for (key, e) in &s.pods {
            let Some(claim) = &e.claim else { continue };
            let vm = match &claim.phase {
                Phase::Running { vm } => s.vms.get(vm).map(|r| &r.record),
                _ => None,
            };
            f(key.as_str(), claim, vm);
        }
    }

    // ---- fences: resumed work, deletes ----

    /// Claims `key` for work resumed after a restart; false when already claimed.
    pub fn claim_resume(&self, key: &str) -> bool {
        let mut s = self.lock();
        let e = s.entry(key);
        !std::mem::replace(&mut e.resumed, true)
    }

    pub fn release_resume(&self, key: &str) {
        let mut s = self.lock();
        if let Some(e) = s.pods.get_mut(key) {
            e.resumed = false;
        }
        s.prune(key);
    }

    pub fn resume_claimed(&self, key: &str) -> bool {
        self.lock().pods.get(key).is_some_and(|e| e.resumed)
    }

    /// The delete fence: false when a delete of `key` is already running.
    pub fn begin_delete(&self, key: &str) -> bool {
        let mut s = self.lock();
        let e = s.entry(key);
        !std::mem::replace(&mut e.deleting, true)
    }

    pub fn end_delete(&self, key: &str) {
        let mut s = self.lock();
        if let Some(e) = s.pods.get_mut(key) {
            e.deleting = false;
        }
        s.prune(key);
    }

    pub fn is_deleting(&self, key: &str) -> bool {
        self.lock().pods.get(key).is_some_and(|e| e.deleting)
    }

    /// Waits for the lock serialising the operations that change the pod's VM (UpdatePod's
    /// transitions, their owed retries, resumed hibernates, DeletePod).
    pub async fn lock_op(&self, key: &str) -> OpGuard<'_> {
        let lock = self.lock().entry(key).op_lock.clone();
        let guard = lock.lock_owned().await;
        OpGuard {
            table: self,
            key: PodKey::from(key),
            guard: Some(guard),
        }
    }

    /// The operation lock when it is free now.
    pub fn try_lock_op(&self, key: &str) -> Option<OpGuard<'_>> {
        let mut s = self.lock();
        let lock = s.entry(key).op_lock.clone();
        let guard = lock.try_lock_owned().ok();
        drop(s);
        match guard {
            Some(guard) => Some(OpGuard {
                table: self,
                key: PodKey::from(key),
                guard: Some(guard),
            }),
            None => {
                self.lock().prune(key);
                None
            }
        }
    }

    // ---- evictions ----

    /// Records the final status of an evicted incarnation and drops its claim.
    pub fn evicted(&self, key: &str, uid: &str, status: ProviderPodStatus) {
        let mut s = self.lock();
        if let Some(c) = s.pods.get(key).and_then(|e| e.claim_of(uid)) {
            let name = c.vm_name.clone();
            s.drop_vm_of(key);
            s.remove_row_of(key, &name);
            s.entry(key).claim = None;
        }
        let now = Instant::now();
        let expired: Vec<PodKey> = s
            .pods
            .iter_mut()
            .filter_map(|(k, e)| {
                let old = e
                    .terminal
                    .as_ref()
                    .is_some_and(|t| now.saturating_duration_since(t.at) >= TERMINAL_TTL);
                old.then(|| {
                    e.terminal = None;
                    k.clone()
                })
            })
            .collect();
        for k in expired {
            s.prune(k.as_str());
        }
        s.entry(key).terminal = Some(Terminal {
            uid: Uid::from(uid),
            status,
            at: now,
        });
    }

    pub fn terminal_status(&self, key: &str, uid: &str) -> Option<ProviderPodStatus> {
        self.lock()
            .pods
            .get(key)?
            .terminal
            .as_ref()
            .filter(|t| t.uid == uid)
            .map(|t| t.status.clone())
    }

    // ---- guest work ----

    /// Registers the guest work of incarnation `uid`, stopping any earlier work of the pod.
    pub fn begin_guest_work(&self, key: &str, uid: &str) -> GuestWork {
        let mut s = self.lock();
        s.next_token += 1;
        let work = GuestWork {
            id: s.next_token,
            uid: Uid::from(uid),
            stop: CancellationToken::new(),
        };
        if let Some(old) = s.entry(key).guest_work.replace(work.clone()) {
            old.stop.cancel();
        }
        work
    }

    /// Stops the pod's guest work (hibernate, delete, eviction).
    pub fn stop_guest_work(&self, key: &str) {
        let mut s = self.lock();
        if let Some(work) = s.pods.get_mut(key).and_then(|e| e.guest_work.take()) {
            work.stop.cancel();
        }
        s.prune(key);
    }

    /// The guest work `work` finished (a later registration is left alone).
    pub fn end_guest_work(&self, key: &str, work: &GuestWork) {
        let mut s = self.lock();
        if let Some(e) = s.pods.get_mut(key)
            && e.guest_work.as_ref().is_some_and(|w| w.id == work.id)
        {
            e.guest_work = None;
        }
        s.prune(key);
    }

    pub fn guest_work_running(&self, key: &str) -> bool {
        self.lock().pods.get(key).is_some_and(|e| e.guest_work.is_some())
    }

    // ---- the VM watcher's memory (on the VM's row) ----

    /// When VM `vm_id` was last restarted in place.
    pub fn last_restart(&self, vm_id: &str) -> Option<Instant> {
        self.lock().vms.by_id_mut(vm_id).and_then(|r| r.last_restart)
    }

    pub fn record_restart(&self, vm_id: &str, at: Instant) {
        if let Some(row) = self.lock().vms.by_id_mut(vm_id) {
            row.last_restart = Some(at);
        }
    }

    /// Drops restart records older than `age` (after a clean end of the event stream).
    pub fn gc_restarts(&self, now: Instant, age: Duration) {
        self.lock().vms.gc_restarts(now, age);
    }

    /// Starts a deferred recheck of VM `vm_id`; false when one is already running (or the VM
    /// left the table).
    pub fn begin_recheck(&self, vm_id: &str) -> bool {
        self.lock()
            .vms
            .by_id_mut(vm_id)
            .is_some_and(|r| !std::mem::replace(&mut r.rechecking, true))
    }

    pub fn end_recheck(&self, vm_id: &str) {
        if let Some(row) = self.lock().vms.by_id_mut(vm_id) {
            row.rechecking = false;
        }
    }

    /// Starts handling an event of VM `vm_id`; false when one is already being handled.
    pub fn begin_vm_event(&self, vm_id: &str) -> bool {
        self.lock()
            .vms
            .by_id_mut(vm_id)
            .is_some_and(|r| !std::mem::replace(&mut r.handling, true))
    }

    pub fn end_vm_event(&self, vm_id: &str) {
        if let Some(row) = self.lock().vms.by_id_mut(vm_id) {
            row.handling = false;
        }
    }

    // ---- owed retries (`DECISIONS.md` row 10) ----

    /// Owes incarnation `uid` a retry of its failed transition, on `schedule`.
    pub fn owe_retry(&self, key: &str, uid: &str, schedule: Schedule) {
        self.lock().entry(key).retry = Some(OwedRetry {
            uid: Uid::from(uid),
            schedule,
        });
    }

    /// The retry owed to incarnation `uid` while it is tracked.
    pub fn owed_retry_of(&self, key: &str, uid: &str) -> Option<OwedRetry> {
        let s = self.lock();
        let e = s.pods.get(key)?;
        e.claim_of(uid)?;
        e.retry.clone().filter(|r| r.uid == uid)
    }

    pub fn owed_retry(&self, key: &str) -> Option<OwedRetry> {
        self.lock().pods.get(key)?.retry.clone()
    }

    /// The operation succeeded (or is no longer owed): no retry.
    pub fn settle_retry(&self, key: &str, uid: &str) {
        let mut s = self.lock();
        if let Some(e) = s.pods.get_mut(key)
            && e.retry.as_ref().is_some_and(|r| r.uid == uid)
        {
            e.retry = None;
        }
        s.prune(key);
    }

    /// Records in the table (for tests of its upkeep).
    pub fn records(&self) -> usize {
        self.lock().pods.len()
    }
}

/// `pod` as the provider wrote it: `write` applied when the copy does not show it yet (a copy
/// that does is shared, not copied).
fn with_own_write(pod: &Arc<Pod>, write: Option<BTreeMap<String, Option<String>>>) -> Arc<Pod> {
    let Some(changes) = write else {
        return Arc::clone(pod);
    };
    let annotations = pod.metadata.annotations.as_ref();
    if changes
        .iter()
        .all(|(k, v)| annotations.and_then(|a| a.get(k)) == v.as_ref())
    {
        return Arc::clone(pod);
    }
    let mut copy = Pod::clone(pod);
    apply(&mut copy, changes);
    Arc::new(copy)
}

fn apply(pod: &mut Pod, changes: impl IntoIterator<Item = (String, Option<String>)>) {
    let a = pod.metadata.annotations.get_or_insert_with(Default::default);
    for (k, v) in changes {
        match v {
            Some(v) => a.insert(k, v),
            None => a.remove(&k),
        };
    }
}

#[cfg(test)]
mod tests;
