//! The local snapshot reclaimer (issue 18): after the startup reconcile and
//! then every `Timings::reclaim_interval`, drop the local snapshots no pod on this node can wake
//! or clone from, so the disk does not fill with stale guest memory.
//!
//! Rules, first match wins ([`first_rule`] is pure; [`verdict`] judges the registry's answer):
//! 1. not named `vk-*` — not ours: kept;
//! 2. the name is a tracked pod's VM, the import (`<vm>-hibernate-import`) of a tracked pod that
//!    has no VM yet (its wake or restore clones from it), or the tag-aware local name of a
//!    tracked pod's image — in use (a wake, a clone, a warm cache): kept;
//! 3. a leftover `<vm>-hibernate-import` (its wake is gone, or done: a crash after the clone
//!    left it behind): removed;
//! 4. registry-less node: kept (there is nothing to verify against);
//! 5. verified against `<name>:hibernate`: the tag is absent, or its snapshot id is not the local
//!    one — removed, with its fork snapshot; a registry error keeps it (logged); current: kept.
//!
//! The in-use set is read again just before each removal, so a pod that arrived during the pass
//! keeps its snapshot; cocoon itself refuses to remove a snapshot an active clone holds.

use std::collections::HashSet;

use super::CocoonProvider;
use super::plan;
use crate::model::vm_spec;
use crate::registry::RegistryError;

const IMPORT_SUFFIX: &str = "-hibernate-import";

/// What the first rules say about one local snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    NotOurs,
    InUse,
    StaleImport,
    /// Registry-less node: only the local rules apply.
    Unverifiable,
    /// Ask the registry ([`verdict`]).
    Verify,
}

/// Rules 1–4 for snapshot `name`; `in_use` holds the names tracked pods need.
pub fn first_rule(name: &str, in_use: &HashSet<String>, registry: bool) -> Rule {
    if !name.starts_with("vk-") {
        return Rule::NotOurs;
    }
    if in_use.contains(name) {
        return Rule::InUse;
    }
    if name.ends_with(IMPORT_SUFFIX) {
        return Rule::StaleImport;
    }
    if !registry {
        return Rule::Unverifiable;
    }
    Rule::Verify
}

/// Rule 5: the registry's answer about `<name>:hibernate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Current,
    NoHibernateTag,
    StaleId,
    /// Could not tell: kept.
    RegistryError(String),
}

pub fn verdict(local_id: &str, lookup: &Result<Option<String>, RegistryError>) -> Verdict {
    match lookup {
        Ok(Some(id)) if id == local_id => Verdict::Current,
        Ok(Some(_)) => Verdict::StaleId,
        Ok(None) => Verdict::NoHibernateTag,
        Err(e) => Verdict::RegistryError(e.to_string()),
    }
}

/// The snapshot names the tracked pods need: their VM names and their images' local names.
fn snapshots_in_use(p: &CocoonProvider) -> HashSet<String> {
    let mut used = HashSet::new();
    for key in p.state.tracked_keys() {
        let Some(t) = p.state.tracked(&key) else { continue };
        let spec = vm_spec::of_pod(&t.pod);
        if !spec.vm_name.is_empty() {
            used.insert(spec.vm_name.clone());
            // Its import is needed only until the clone gave the pod its VM: the restore
            // drops it after the clone, and one a crash left behind must not stay for as
            // long as the pod lives.
            if t.vm.is_none() {
                used.insert(plan::hibernate_import_name(&spec.vm_name));
            }
        }
        if !spec.image.is_empty() {
            let (repo, tag) = plan::parse_ref(&spec.image);
            used.insert(plan::local_snapshot_name(repo, tag));
            used.insert(spec.image.clone());
        }
    }
    used
}

/// One reclaimer pass; returns how many snapshots it removed.
pub(super) async fn reclaim_snapshots(p: &CocoonProvider) -> usize {
    let listed = match p.ports.runtime.snapshot_list(None).await {
        Ok(l) => l,
        Err(error) => {
            tracing::warn!(%error, "snapshot reclaimer: cocoon snapshot list failed; next pass");
            return 0;
        }
    };
    let mut removed = 0;
    for snap in listed {
        let name = snap.name.as_str();
        let reason = match first_rule(name, &snapshots_in_use(p), p.ports.registry.is_some()) {
            Rule::NotOurs | Rule::InUse | Rule::Unverifiable => continue,
            Rule::StaleImport => "stale_import",
            Rule::Verify => {
                let registry = p.ports.registry.as_ref().expect("Verify only with a registry");
                let lookup = registry
                    .snapshot_meta(name, plan::HIBERNATE_SNAPSHOT_TAG)
                    .await
                    .map(|m| m.map(|m| m.snapshot_id));
                match verdict(&snap.id, &lookup) {
                    Verdict::Current => continue,
                    Verdict::NoHibernateTag => "no_hibernate_tag",
                    Verdict::StaleId => "stale_id",
                    Verdict::RegistryError(error) => {
                        tracing::warn!(snapshot = name, %error, "snapshot reclaimer: cannot verify against the registry; keeping it");
                        continue;
                    }
                }
            }
        };
        // A pod may have arrived while the registry answered.
        if first_rule(name, &snapshots_in_use(p), true) == Rule::InUse {
            continue;
        }
        if reclaim_one(p, name, reason).await {
            removed += 1;
        }
    }
    removed
}

async fn reclaim_one(p: &CocoonProvider, name: &str, reason: &str) -> bool {
    match p.ports.runtime.snapshot_remove_if_exists(name).await {
        Ok(()) => {
            p.metrics.snapshot_reclaimed.with_label_values(&[reason]).inc();
            tracing::info!(snapshot = name, reason, "snapshot reclaimer removed a local snapshot");
            if reason != "stale_import" {
                let fork = plan::fork_snapshot_name(name);
                if let Err(error) = p.ports.runtime.snapshot_remove_if_exists(&fork).await {
                    tracing::warn!(snapshot = %fork, %error, "snapshot reclaimer: removing the fork snapshot failed");
                }
            }
            true
        }
        Err(error) => {
            tracing::warn!(snapshot = name, %error, "snapshot reclaimer: removal failed (in use?); next pass");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn used(names: &[&str]) -> HashSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_first_rules_in_order() {
        // Pod a is waking (no VM yet: its import is in use); pod c runs its VM.
        let u = used(&[
            "vk-ns-a-111111",
            "vk-ns-a-111111-hibernate-import",
            "vk-ns-c-333333",
            "vk-base:v2",
        ]);
        let cases = [
            ("fork-vk-ns-a-111111", true, Rule::NotOurs),
            ("ubuntu", true, Rule::NotOurs),
            ("vk-ns-a-111111", true, Rule::InUse),
            ("vk-ns-a-111111-hibernate-import", true, Rule::InUse),
            ("vk-ns-c-333333", true, Rule::InUse),
            ("vk-ns-c-333333-hibernate-import", true, Rule::StaleImport),
            ("vk-base:v2", true, Rule::InUse),
            ("vk-ns-b-222222-hibernate-import", true, Rule::StaleImport),
            ("vk-ns-b-222222-hibernate-import", false, Rule::StaleImport),
            ("vk-ns-b-222222", false, Rule::Unverifiable),
            ("vk-ns-b-222222", true, Rule::Verify),
        ];
        for (name, registry, want) in cases {
            assert_eq!(first_rule(name, &u, registry), want, "{name} registry={registry}");
        }
    }

    #[test]
    fn the_registry_answer_decides_the_rest() {
        assert_eq!(verdict("S1", &Ok(Some("S1".into()))), Verdict::Current);
        assert_eq!(verdict("S1", &Ok(Some("S2".into()))), Verdict::StaleId);
        assert_eq!(verdict("S1", &Ok(None)), Verdict::NoHibernateTag);
        let down = RegistryError::Unavailable {
            op: "GET".into(),
            artifact: "vk-a:hibernate".into(),
            registry: "127.0.0.1:5000".into(),
            detail: "connection refused".into(),
            cause: None,
        };
        assert!(matches!(verdict("S1", &Err(down)), Verdict::RegistryError(_)));
    }
}
