//! Async locks by name that exist only while someone holds or waits for them: concurrent callers
//! of one piece of work (a fork snapshot, a clone source pull, an image pull) serialise on the
//! lock, and the later ones find the work done. The last guard to go removes the lock, so the map
//! holds only work in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

type Slot = Arc<tokio::sync::Mutex<()>>;

#[derive(Default)]
pub struct KeyedLocks {
    slots: Mutex<HashMap<String, Slot>>,
}

/// Holds one name's lock; dropping it releases the lock (and the name, once nobody else wants it).
pub struct KeyedGuard<'a> {
    locks: &'a KeyedLocks,
    name: String,
    slot: Slot,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl KeyedLocks {
    /// Waits for the lock of `name`.
    pub async fn lock(&self, name: &str) -> KeyedGuard<'_> {
        let slot = self
            .slots
            .lock()
            .expect("keyed locks")
            .entry(name.to_string())
            .or_default()
            .clone();
        let guard = slot.clone().lock_owned().await;
        KeyedGuard {
            locks: self,
            name: name.to_string(),
            slot,
            guard: Some(guard),
        }
    }

    /// How many names are locked or waited for.
    pub fn len(&self) -> usize {
        self.slots.lock().expect("keyed locks").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Holders and waiters of `name`.
    #[cfg(test)]
    fn users(&self, name: &str) -> usize {
        self.slots
            .lock()
            .expect("keyed locks")
            .get(name)
            .map_or(0, |s| Arc::strong_count(s) - 1)
    }
}

impl Drop for KeyedGuard<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut slots = self.locks.slots.lock().expect("keyed locks");
        // The map's reference and ours: nobody else holds or waits for it (new waiters clone it
        // under this same map lock, so the count cannot rise meanwhile).
        if Arc::strong_count(&self.slot) == 2 {
            slots.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_name_is_held_by_one_caller_at_a_time_and_forgotten_when_free() {
        let locks = Arc::new(KeyedLocks::default());
        let first = locks.lock("fork:a").await;
        assert_eq!(locks.len(), 1);
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let _g = locks.lock("fork:a").await;
                tx.send(()).unwrap();
            })
        };
        // Another name does not wait.
        drop(locks.lock("fork:b").await);
        while locks.users("fork:a") < 2 {
            tokio::task::yield_now().await;
        }
        assert!(rx.try_recv().is_err(), "the second caller waits for the first");
        drop(first);
        rx.await.unwrap();
        waiter.await.unwrap();
        assert!(locks.is_empty(), "no lock outlives its holders");
    }
}
