//! A small TTL cache for review answers: each entry carries its own lifetime (an allow lives
//! longer than a deny). When full, the least recently used entry goes: constant time per
//! operation under the lock, however full the cache (callers flooding it with new keys cost
//! no more than any other).

use std::hash::Hash;
use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use lru::LruCache;

pub struct TtlCache<K: Hash + Eq, V> {
    entries: Mutex<LruCache<K, (V, Instant)>>,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(LruCache::new(NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN))),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<K, (V, Instant)>> {
        // A panic while the lock was held leaves the cache consistent (each operation is one
        // call into it): go on with it.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The live entry for `key` (an expired one is dropped).
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        let mut entries = self.lock();
        match entries.get(key) {
            Some((v, expires)) if *expires > now => Some(v.clone()),
            Some(_) => {
                entries.pop(key);
                None
            }
            None => None,
        }
    }

    /// Stores `value` for `ttl` (a zero ttl stores nothing); when full, the least recently used
    /// entry goes.
    pub fn insert(&self, key: K, value: V, ttl: Duration, now: Instant) {
        if ttl.is_zero() {
            return;
        }
        self.lock().put(key, (value, now + ttl));
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_at_their_own_ttl() {
        let c = TtlCache::new(10);
        let t = Instant::now();
        c.insert("allow", true, Duration::from_secs(300), t);
        c.insert("deny", false, Duration::from_secs(30), t);
        assert_eq!(c.get(&"allow", t + Duration::from_secs(31)), Some(true));
        assert_eq!(c.get(&"deny", t + Duration::from_secs(31)), None);
        assert_eq!(c.get(&"allow", t + Duration::from_secs(301)), None);
        c.insert("zero", true, Duration::ZERO, t);
        assert_eq!(c.get(&"zero", t), None);
    }

    #[test]
    fn a_full_cache_evicts_the_least_recently_used() {
        let c = TtlCache::new(2);
        let t = Instant::now();
        c.insert(1, 1, Duration::from_secs(100), t);
        c.insert(2, 2, Duration::from_secs(100), t);
        assert_eq!(c.get(&1, t), Some(1), "1 is now the more recently used");
        c.insert(3, 3, Duration::from_secs(100), t);
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(&2, t), None, "the least recently used went");
        assert_eq!((c.get(&1, t), c.get(&3, t)), (Some(1), Some(3)));
        // An expired entry is dropped when looked up.
        c.insert(4, 4, Duration::from_secs(1), t);
        assert_eq!(c.get(&4, t + Duration::from_secs(2)), None);
        assert_eq!(c.len(), 1);
    }
}
