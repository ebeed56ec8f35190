//! A small TTL cache for review answers: each entry carries its own lifetime (an allow lives
//! longer than a deny), expired entries are dropped when the cache is full.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
    capacity: usize,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// The live entry for `key`.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        let mut entries = self.entries.lock().expect("cache lock");
        match entries.get(key) {
            Some((v, expires)) if *expires > now => Some(v.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Stores `value` for `ttl` (a zero ttl stores nothing). When full, expired entries go
    /// first; if none expired, the one closest to expiry goes.
    pub fn insert(&self, key: K, value: V, ttl: Duration, now: Instant) {
        if ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().expect("cache lock");
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, (_, expires)| *expires > now);
            if entries.len() >= self.capacity
                && let Some(oldest) = entries.iter().min_by_key(|(_, (_, e))| *e).map(|(k, _)| k.clone())
            {
                entries.remove(&oldest);
            }
        }
        entries.insert(key, (value, now + ttl));
    }

    pub fn len(&self) -> usize {
        self.entries.lock().expect("cache lock").len()
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
    fn a_full_cache_evicts_expired_then_the_oldest() {
        let c = TtlCache::new(2);
        let t = Instant::now();
        c.insert(1, 1, Duration::from_secs(1), t);
        c.insert(2, 2, Duration::from_secs(100), t);
        c.insert(3, 3, Duration::from_secs(100), t + Duration::from_secs(2));
        assert_eq!(c.len(), 2);
        assert_eq!(c.get(&2, t + Duration::from_secs(3)), Some(2));
        c.insert(4, 4, Duration::from_secs(100), t + Duration::from_secs(3));
        assert_eq!(c.get(&2, t + Duration::from_secs(3)), None, "closest to expiry went");
        assert_eq!(c.get(&3, t + Duration::from_secs(3)), Some(3));
    }
}
