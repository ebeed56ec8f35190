//! The lifecycle intents of the table's records: staged under the admission rules,
//! flushed to the apiserver by their caller, re-flushed by the lifecycle reconciler.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;

use super::super::lifecycle::{self, Dropped, Intent};
use super::{StoredIntent, Table, apply};

impl Table {
    /// Stages an intent under [`crate::provider::lifecycle::admit`]'s rules; the caller flushes it.
    pub fn stage_intent(&self, key: &str, mut intent: Intent, pod: Option<&Pod>) -> Result<Intent, Dropped> {
        let mut s = self.lock();
        let e = s.entry(key);
        if let Some(c) = &e.claim {
            let g = lifecycle::pod_generation(c.pod.metadata.annotations.as_ref().unwrap_or(&Default::default()));
            intent.generation = intent.generation.max(g);
        }
        let tracked_uid = e.claim.as_ref().map(|c| c.uid.clone());
        let admitted = lifecycle::admit(
            e.intent.as_ref().map(|i| &i.intent),
            tracked_uid.as_ref().map(crate::kubelet::Uid::as_str),
            &intent,
        );
        if let Err(dropped) = admitted {
            s.prune(key);
            return Err(dropped);
        }
        let e = s.entry(key);
        let claimed = e.claim_of_mut(&intent.uid).map(|c| {
            apply(Arc::make_mut(&mut c.pod), intent.annotations());
            Arc::clone(&c.pod)
        });
        e.intent = Some(StoredIntent {
            intent: intent.clone(),
            flushed: false,
            pod: claimed.or_else(|| pod.map(|p| Arc::new(p.clone()))),
        });
        Ok(intent)
    }

    /// Seeds an intent read from the pod at startup (already on the apiserver).
    pub fn seed_intent(&self, key: &str, intent: Intent) {
        self.lock().entry(key).intent = Some(StoredIntent {
            intent,
            flushed: true,
            pod: None,
        });
    }

    pub fn intent(&self, key: &str) -> Option<Intent> {
        Some(self.lock().pods.get(key)?.intent.as_ref()?.intent.clone())
    }

    /// Whether `intent` is still the stored one (a flush aborts when it changed).
    pub fn is_current(&self, key: &str, intent: &Intent) -> bool {
        self.lock()
            .pods
            .get(key)
            .and_then(|e| e.intent.as_ref())
            .is_some_and(|i| i.intent == *intent)
    }

    pub fn mark_flushed(&self, key: &str, intent: &Intent) {
        if let Some(i) = self
            .lock()
            .pods
            .get_mut(key)
            .and_then(|e| e.intent.as_mut())
            .filter(|i| i.intent == *intent)
        {
            i.flushed = true;
            // On the apiserver now: nothing re-flushes it, so its object is not kept.
            i.pod = None;
        }
    }

    pub fn drop_intent(&self, key: &str, uid: &str) {
        let mut s = self.lock();
        if let Some(e) = s.pods.get_mut(key)
            && e.intent.as_ref().is_some_and(|i| i.intent.uid == uid)
        {
            e.intent = None;
        }
        s.prune(key);
    }

    /// Intents not yet on the apiserver (re-flushed by the lifecycle reconciler).
    pub fn unflushed(&self) -> Vec<(String, Intent, Option<Arc<Pod>>)> {
        self.lock()
            .pods
            .iter()
            .filter_map(|(k, e)| {
                let i = e.intent.as_ref().filter(|i| !i.flushed)?;
                Some((k.to_string(), i.intent.clone(), i.pod.clone()))
            })
            .collect()
    }
}
