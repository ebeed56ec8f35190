//! Watches: the current state as synthetic ADDED events, or the history after a resourceVersion.

use super::*;

impl Store {
    /// Opens a watch.
    ///
    /// `since`: `None` or `Some(0)` ⇒ synthetic ADDED events for the current state (as the
    /// apiserver does for `resourceVersion` unset or "0"); `Some(n)` ⇒ every change after `n` from
    /// the history, or 410 Gone (`Expired`) when `n` is older than the retained history.
    pub fn watch(&self, rt: ResourceType, filter: &Filter, since: Option<u64>) -> Result<WatchStart, ApiError> {
        let inner = self.lock();
        let live = self.tx.subscribe();
        match since {
            None | Some(0) => {
                let initial = inner
                    .objects
                    .iter()
                    .filter(|((r, _, _), obj)| *r == rt && filter.matches(obj))
                    .map(|(_, obj)| {
                        Arc::new(Change {
                            resource: rt,
                            kind: ChangeKind::Added,
                            rv: meta_str(obj, "resourceVersion")
                                .and_then(|s| s.parse().ok())
                                .unwrap_or(0),
                            object: obj.clone(),
                            previous: None,
                        })
                    })
                    .collect();
                Ok(WatchStart {
                    initial,
                    initial_rv: inner.rv,
                    live,
                })
            }
            Some(n) => {
                if n < inner.floor {
                    return Err(ApiError::expired(n, inner.floor));
                }
                let initial = inner
                    .history
                    .iter()
                    .filter(|c| c.rv > n && c.resource == rt)
                    .cloned()
                    .collect();
                Ok(WatchStart {
                    initial,
                    initial_rv: inner.rv.max(n),
                    live,
                })
            }
        }
    }
}
