//! DELETE with the apiserver's graceful semantics for pods and finalizers.

use super::*;

impl Store {
    /// DELETE with the apiserver's graceful semantics.
    ///
    /// A pod bound to a node (and not terminal) deleted with a grace period > 0 (default: its
    /// `terminationGracePeriodSeconds`, else 30) only gets `deletionTimestamp` /
    /// `deletionGracePeriodSeconds`; a later delete with grace 0 (what the kubelet sends) removes it.
    /// Objects with finalizers get a `deletionTimestamp` and stay until the finalizers are gone.
    pub fn delete(
        &self,
        rt: ResourceType,
        ns: Option<&str>,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let mut inner = self.lock();
        let current = inner
            .objects
            .get(&Self::key(rt, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt.group, rt.plural, name))?;
        let cur_uid = meta_str(&current, "uid").unwrap_or("").to_string();
        let cur_rv = meta_str(&current, "resourceVersion").unwrap_or("").to_string();
        if let Some(uid) = &opts.precondition_uid
            && *uid != cur_uid
        {
            return Err(ApiError::precondition_failed(
                rt.group,
                rt.plural,
                rt.kind,
                name,
                format!(
                    "the UID in the precondition ({uid}) does not match the UID in record ({cur_uid}). The object might have been deleted and then recreated"
                ),
            ));
        }
        if let Some(rv) = &opts.precondition_resource_version
            && *rv != cur_rv
        {
            return Err(ApiError::precondition_failed(
                rt.group,
                rt.plural,
                rt.kind,
                name,
                format!(
                    "the ResourceVersion in the precondition ({rv}) does not match the ResourceVersion in record ({cur_rv}). The object might have been modified"
                ),
            ));
        }

        let grace = if rt.is_pod() {
            let bound = current
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            let terminal = matches!(
                current.pointer("/status/phase").and_then(Value::as_str),
                Some("Succeeded" | "Failed")
            );
            if !bound || terminal {
                0
            } else {
                opts.grace_period_seconds
                    .or_else(|| {
                        current
                            .pointer("/spec/terminationGracePeriodSeconds")
                            .and_then(Value::as_i64)
                    })
                    .unwrap_or(30)
                    .max(0)
            }
        } else {
            0
        };

        let existing_grace = current
            .pointer("/metadata/deletionGracePeriodSeconds")
            .and_then(Value::as_i64);
        let already_deleting = current.pointer("/metadata/deletionTimestamp").is_some();
        if grace > 0 || has_finalizers(&current) {
            if already_deleting && existing_grace.is_some_and(|g| g <= grace) {
                // A second graceful delete cannot extend the grace period.
                return Ok(current);
            }
            let mut new = current.clone();
            let m = meta_mut(&mut new);
            m.insert(
                "deletionTimestamp".into(),
                json!(fmt_time(now() + SignedDuration::from_secs(grace))),
            );
            m.insert("deletionGracePeriodSeconds".into(), json!(grace));
            return Ok(self.commit(&mut inner, rt, ChangeKind::Modified, new, Some(current)));
        }
        let mut gone = current.clone();
        if rt.is_pod() {
            let m = meta_mut(&mut gone);
            m.entry("deletionTimestamp").or_insert_with(|| json!(fmt_time(now())));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
        }
        Ok(self.commit(&mut inner, rt, ChangeKind::Deleted, gone, Some(current)))
    }
}
