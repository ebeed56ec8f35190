//! The object store with apiserver semantics: one increasing resourceVersion counter, uid and
//! creationTimestamp on create, optimistic concurrency, preconditions, and writes; `delete`
//! (graceful pod deletion, finalizers), `watch` (a bounded event history, 410 Gone) and `typed`
//! (typed reads and seeds for tests) add to the same `Store`.

use crate::error::ApiError;
use crate::resource::ResourceType;
use crate::selector::Filter;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::broadcast;

mod delete;
mod typed;
mod watch;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One committed change, as kept in the watch history.
#[derive(Debug, Clone)]
pub struct Change {
    pub resource: ResourceType,
    pub kind: ChangeKind,
    pub rv: u64,
    /// The object after the change (for `Deleted`: the last state, carrying the deletion's resourceVersion).
    pub object: Value,
    /// The object before the change (`None` for `Added`).
    pub previous: Option<Value>,
}

/// A message on the live watch channel.
#[derive(Debug, Clone)]
pub enum Broadcast {
    Change(Arc<Change>),
    /// A bookmark at this resourceVersion: every change up to it has been broadcast.
    Bookmark(u64),
}

/// Which part of an object a write targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Main,
    Status,
}

/// The patch flavours of the apiserver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// RFC 6902 `application/json-patch+json`.
    Json,
    /// RFC 7386 `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`: keyed lists merge by their patch-merge key,
    /// `finalizers` is a union, `$patch` and `$deleteFromPrimitiveList` directives apply (see
    /// [`crate::strategic`] for what is modelled).
    Strategic,
}

/// The parts of `DeleteOptions` the server honours.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_resource_version: Option<String>,
}

impl DeleteOptions {
    /// Reads a `DeleteOptions` JSON body (as kube's `DeleteParams` serialises it); empty body = defaults.
    pub fn from_body(body: &[u8]) -> Result<Self, ApiError> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions body: {e}")))?;
        Ok(Self {
            grace_period_seconds: v.get("gracePeriodSeconds").and_then(Value::as_i64),
            precondition_uid: v
                .pointer("/preconditions/uid")
                .and_then(Value::as_str)
                .map(str::to_string),
            precondition_resource_version: v
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }
}

/// The start of a watch: what to send first, then the live channel.
pub struct WatchStart {
    /// Synthetic ADDED events (initial state) or replayed history, oldest first.
    pub initial: Vec<Arc<Change>>,
    /// The resourceVersion the initial part brings the watcher up to.
    pub initial_rv: u64,
    pub live: broadcast::Receiver<Broadcast>,
}

type Key = (ResourceType, String, String);

struct Inner {
    rv: u64,
    uid_seq: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Arc<Change>>,
    /// Every change with rv > floor is still in `history`.
    floor: u64,
    capacity: usize,
}

/// The shared object store. It survives server restarts.
pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Broadcast>,
    uid_salt: u64,
}

fn now() -> Timestamp {
    Timestamp::now()
}

/// RFC 3339 at second precision, as `metav1.Time` serialises.
pub(crate) fn fmt_time(ts: Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

fn meta(obj: &Value) -> Option<&Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    meta(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    obj["metadata"].as_object_mut().expect("metadata is an object")
}

fn has_finalizers(obj: &Value) -> bool {
    meta(obj)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
}

impl Store {
    /// An empty store keeping at most `history_capacity` changes for watch resumption.
    pub fn new(history_capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(4096);
        let salt = {
            use std::hash::{BuildHasher, RandomState};
            RandomState::new().hash_one(std::process::id())
        };
        Self {
            inner: Mutex::new(Inner {
                rv: 0,
                uid_seq: 0,
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                floor: 0,
                capacity: history_capacity.max(1),
            }),
            tx,
            uid_salt: salt,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// The oldest resourceVersion a watch may still resume from.
    pub fn oldest_resumable(&self) -> u64 {
        self.lock().floor
    }

    /// Drops the whole watch history: every watch resuming from an older resourceVersion than the
    /// current one now gets 410 Gone (as after an etcd compaction).
    pub fn compact_history(&self) {
        let mut inner = self.lock();
        inner.history.clear();
        inner.floor = inner.rv;
    }

    /// A receiver for live changes (used for watches that end with an error before streaming).
    pub fn subscribe(&self) -> broadcast::Receiver<Broadcast> {
        self.tx.subscribe()
    }

    /// Broadcasts a bookmark at the current resourceVersion to every open watch that asked for bookmarks.
    pub fn bookmark(&self) {
        let inner = self.lock();
        let _ = self.tx.send(Broadcast::Bookmark(inner.rv));
    }

    fn new_uid(&self, inner: &mut Inner) -> String {
        inner.uid_seq += 1;
        let a = self.uid_salt ^ inner.uid_seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            (a >> 32) as u32,
            (a >> 16) as u16,
            (a >> 4) & 0xfff,
            inner.uid_seq & 0xfff,
            inner.uid_seq
        )
    }

    fn commit(
        &self,
        inner: &mut Inner,
        rt: ResourceType,
        kind: ChangeKind,
        mut object: Value,
        previous: Option<Value>,
    ) -> Value {
        inner.rv += 1;
        let rv = inner.rv;
        meta_mut(&mut object).insert("resourceVersion".into(), json!(rv.to_string()));
        let ns = meta_str(&object, "namespace").unwrap_or("").to_string();
        let name = meta_str(&object, "name").unwrap_or("").to_string();
        let key = (rt, ns, name);
        match kind {
            ChangeKind::Deleted => {
                inner.objects.remove(&key);
            }
            _ => {
                inner.objects.insert(key, object.clone());
            }
        }
        let change = Arc::new(Change {
            resource: rt,
            kind,
            rv,
            object: object.clone(),
            previous,
        });
        inner.history.push_back(change.clone());
        while inner.history.len() > inner.capacity {
            if let Some(evicted) = inner.history.pop_front() {
                inner.floor = evicted.rv;
            }
        }
        let _ = self.tx.send(Broadcast::Change(change));
        object
    }

    fn key(rt: ResourceType, ns: Option<&str>, name: &str) -> Key {
        (
            rt,
            if rt.namespaced {
                ns.unwrap_or("").to_string()
            } else {
                String::new()
            },
            name.to_string(),
        )
    }

    /// One object.
    pub fn get(&self, rt: ResourceType, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
        self.lock()
            .objects
            .get(&Self::key(rt, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))
    }

    /// The matching objects and the resourceVersion of the list.
    pub fn list(&self, rt: ResourceType, filter: &Filter) -> (Vec<Value>, u64) {
        let inner = self.lock();
        let items = inner
            .objects
            .iter()
            .filter(|((r, _, _), obj)| *r == rt && filter.matches(obj))
            .map(|(_, obj)| obj.clone())
            .collect();
        (items, inner.rv)
    }

    /// Creates an object: sets uid, creationTimestamp, resourceVersion (and generateName).
    pub fn create(&self, rt: ResourceType, ns: Option<&str>, mut body: Value) -> Result<Value, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        }
        let mut inner = self.lock();
        let seq = inner.uid_seq + 1;
        let m = meta_mut(&mut body);
        let name = match m.get("name").and_then(Value::as_str).filter(|s| !s.is_empty()) {
            Some(n) => n.to_string(),
            None => match m.get("generateName").and_then(Value::as_str).filter(|s| !s.is_empty()) {
                Some(prefix) => format!("{prefix}{:05x}", (self.uid_salt as u32 ^ seq as u32) & 0xfffff),
                None => {
                    return Err(ApiError::invalid(
                        rt.group,
                        rt.plural,
                        "",
                        "metadata.name: Required value: name or generateName is required",
                    ));
                }
            },
        };
        if rt.namespaced {
            let path_ns = ns.ok_or_else(|| {
                ApiError::bad_request(format!(
                    "{} is namespaced: POST to /namespaces/<ns>/{}",
                    rt.plural, rt.plural
                ))
            })?;
            match m.get("namespace").and_then(Value::as_str).filter(|s| !s.is_empty()) {
                Some(body_ns) if body_ns != path_ns => {
                    return Err(ApiError::bad_request(format!(
                        "the namespace of the provided object ({body_ns}) does not match the namespace sent on the request ({path_ns})"
                    )));
                }
                _ => {
                    m.insert("namespace".into(), json!(path_ns));
                }
            }
        } else {
            m.remove("namespace");
        }
        m.insert("name".into(), json!(name));
        let key = Self::key(rt, ns, &name);
        if inner.objects.contains_key(&key) {
            return Err(ApiError::already_exists(rt.group, rt.plural, &name));
        }
        let uid = self.new_uid(&mut inner);
        let m = meta_mut(&mut body);
        m.insert("uid".into(), json!(uid));
        m.insert("creationTimestamp".into(), json!(fmt_time(now())));
        m.remove("deletionTimestamp");
        m.remove("deletionGracePeriodSeconds");
        m.remove("resourceVersion");
        body["apiVersion"] = json!(rt.api_version());
        body["kind"] = json!(rt.kind);
        if rt.is_pod() && body.pointer("/status/phase").is_none() {
            body["status"] = json!({"phase": "Pending"});
        }
        Ok(self.commit(&mut inner, rt, ChangeKind::Added, body, None))
    }

    /// PUT: replaces the object (or only its status), with optimistic concurrency on `metadata.resourceVersion`.
    pub fn update(
        &self,
        rt: ResourceType,
        ns: Option<&str>,
        name: &str,
        target: Target,
        body: Value,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let current = inner
            .objects
            .get(&Self::key(rt, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))?;
        self.write(&mut inner, rt, name, target, current, body)
    }

    /// PATCH: applies a patch to the current object (or its status).
    pub fn patch(
        &self,
        rt: ResourceType,
        ns: Option<&str>,
        name: &str,
        target: Target,
        kind: PatchKind,
        patch: Value,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let current = inner
            .objects
            .get(&Self::key(rt, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))?;
        let mut doc = current.clone();
        match kind {
            PatchKind::Merge => json_patch::merge(&mut doc, &patch),
            PatchKind::Strategic => crate::strategic::merge(&mut doc, &patch),
            PatchKind::Json => {
                let ops: json_patch::Patch = serde_json::from_value(patch)
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
                json_patch::patch(&mut doc, &ops).map_err(|e| {
                    ApiError::invalid(
                        rt.group,
                        rt.plural,
                        name,
                        format!("the JSON patch could not be applied: {e}"),
                    )
                })?;
            }
        }
        self.write(&mut inner, rt, name, target, current, doc)
    }

    /// The common write path of update and patch.
    fn write(
        &self,
        inner: &mut Inner,
        rt: ResourceType,
        name: &str,
        target: Target,
        current: Value,
        mut new: Value,
    ) -> Result<Value, ApiError> {
        if !new.is_object() {
            return Err(ApiError::bad_request("the request body must be a JSON object"));
        }
        let cur_uid = meta_str(&current, "uid").unwrap_or("").to_string();
        let cur_rv = meta_str(&current, "resourceVersion").unwrap_or("").to_string();
        if let Some(body_name) = meta_str(&new, "name")
            && body_name != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(uid) = meta_str(&new, "uid")
            && uid != cur_uid
        {
            return Err(ApiError::immutable_uid(rt.group, rt.plural, rt.kind, name, uid));
        }
        if let Some(rv) = meta_str(&new, "resourceVersion")
            && rv != cur_rv
        {
            return Err(ApiError::stale_resource_version(rt.group, rt.plural, name));
        }

        if rt.status_subresource {
            match target {
                Target::Main => match current.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        new.as_object_mut().expect("object").remove("status");
                    }
                },
                // As the apiserver's status strategies: the spec stays as stored, metadata (labels,
                // annotations, finalizers) may change with the status; a pod keeps its owner
                // references (old kubelets corrupted them through /status).
                Target::Status => {
                    match current.get("spec") {
                        Some(spec) => new["spec"] = spec.clone(),
                        None => {
                            new.as_object_mut().expect("object").remove("spec");
                        }
                    }
                    if rt.is_pod() {
                        let owners = meta(&current).and_then(|m| m.get("ownerReferences")).cloned();
                        let m = meta_mut(&mut new);
                        match owners {
                            Some(o) => m.insert("ownerReferences".into(), o),
                            None => m.remove("ownerReferences"),
                        };
                    }
                }
            }
        } else if target == Target::Status {
            return Err(ApiError::no_such_resource());
        }

        // System-owned metadata stays as stored.
        let cur_meta = meta(&current).cloned().unwrap_or_default();
        let m = meta_mut(&mut new);
        for field in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "name",
            "generation",
        ] {
            match cur_meta.get(field) {
                Some(v) => {
                    m.insert(field.into(), v.clone());
                }
                None => {
                    m.remove(field);
                }
            }
        }
        m.insert("resourceVersion".into(), json!(cur_rv));
        new["apiVersion"] = json!(rt.api_version());
        new["kind"] = json!(rt.kind);

        if new == current {
            // A no-op write does not bump the resourceVersion.
            return Ok(current);
        }
        // An object being deleted goes away once its last finalizer is removed.
        if meta(&new).is_some_and(|m| m.contains_key("deletionTimestamp"))
            && !has_finalizers(&new)
            && (!rt.is_pod()
                || new
                    .pointer("/metadata/deletionGracePeriodSeconds")
                    .and_then(Value::as_i64)
                    == Some(0))
        {
            return Ok(self.commit(inner, rt, ChangeKind::Deleted, new, Some(current)));
        }
        Ok(self.commit(inner, rt, ChangeKind::Modified, new, Some(current)))
    }
}
