//! The crate's one bounded cache type, and its one hasher.
//!
//! Owns: [`Lru`], a map that keeps at most `capacity` entries and, when full, drops the least
//! recently used one (the `lru` crate); [`FastMap`]/[`FastSet`], the hash maps of per-sample
//! lookups. Every cache of target-derived data (files, frames, names, processes) is an [`Lru`]:
//! memory is bounded on a host-wide run however many processes come and go, and the entries
//! still in use are the ones kept (a "clear when full" cache would forget them all at once).
//!
//! The hasher is foldhash (already built as hashbrown's default): about as fast as FxHash on
//! the integer keys of the hot path (pids, addresses, ids) and faster on strings, and seeded
//! per process, so a target cannot precompute collisions for names or addresses it controls
//! (FxHash's fixed multiplier can be inverted; std's SipHash showed in the profile).

use std::borrow::Borrow;
use std::hash::Hash;
use std::num::NonZeroUsize;

/// The hasher of every per-sample map.
pub type FastHasher = foldhash::fast::RandomState;
/// A `HashMap` with [`FastHasher`].
pub type FastMap<K, V> = std::collections::HashMap<K, V, FastHasher>;
/// A `HashSet` with [`FastHasher`].
pub type FastSet<K> = std::collections::HashSet<K, FastHasher>;

/// A bounded map that evicts its least recently used entry.
pub struct Lru<K, V> {
    /// Unbounded in the crate, bounded here: the crate's bounded constructor allocates its
    /// table for the whole capacity up front (several MiB for the frame caches, before a
    /// single entry), so the table grows with what is cached instead.
    inner: lru::LruCache<K, V, FastHasher>,
    cap: NonZeroUsize,
}

impl<K: Hash + Eq, V> Lru<K, V> {
    /// A cache of at most `capacity` entries (at least one).
    pub fn new(capacity: usize) -> Self {
        Lru {
            inner: lru::LruCache::unbounded_with_hasher(FastHasher::default()),
            cap: NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN),
        }
    }

    /// The value of `k`, marking it used.
    pub fn get<Q: Hash + Eq + ?Sized>(&mut self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.inner.get(k)
    }

    /// The value of `k`, mutable, marking it used.
    pub fn get_mut<Q: Hash + Eq + ?Sized>(&mut self, k: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.inner.get_mut(k)
    }

    /// The value of `k` without marking it used.
    pub fn peek<Q: Hash + Eq + ?Sized>(&self, k: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.inner.peek(k)
    }

    /// Whether `k` is cached (not marking it used).
    pub fn contains<Q: Hash + Eq + ?Sized>(&self, k: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.inner.contains(k)
    }

    /// Inserts or replaces `k`; returns the entry it displaced: the old value of `k`, or the
    /// least recently used entry evicted to make room.
    pub fn insert(&mut self, k: K, v: V) -> Option<(K, V)> {
        if self.inner.len() >= self.cap.get() && !self.inner.contains(&k) {
            let evicted = self.inner.pop_lru();
            self.inner.put(k, v);
            return evicted;
        }
        self.inner.push(k, v)
    }

    /// Removes `k`.
    pub fn remove<Q: Hash + Eq + ?Sized>(&mut self, k: &Q) -> Option<V>
    where
        K: Borrow<Q>,
    {
        self.inner.pop(k)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// The bound.
    pub fn capacity(&self) -> usize {
        self.cap.get()
    }

    /// Removes least recently used entries, oldest first, while `expired` says so; returns how
    /// many. For caches whose entries are inserted in time order and looked up with
    /// [`Self::peek`] (which does not reorder): the expired ones go without a scan.
    pub fn pop_lru_while(&mut self, mut expired: impl FnMut(&K, &V) -> bool) -> usize {
        let mut n = 0;
        while self.inner.peek_lru().is_some_and(|(k, v)| expired(k, v)) {
            self.inner.pop_lru();
            n += 1;
        }
        n
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.inner.clear();
    }

    /// Entries, most recently used first.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.inner.iter()
    }
}

impl<K: Hash + Eq, V> std::fmt::Debug for Lru<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lru")
            .field("len", &self.inner.len())
            .field("capacity", &self.cap)
            .finish()
    }
}

impl<K: Hash + Eq + Clone, V> Lru<K, V> {
    /// Removes every entry for which `keep` is false (a scan: for rare events such as a
    /// process exit, not per sample).
    pub fn retain(&mut self, mut keep: impl FnMut(&K, &V) -> bool) {
        let doomed: Vec<K> = self
            .inner
            .iter()
            .filter(|(k, v)| !keep(k, v))
            .map(|(k, _)| k.clone())
            .collect();
        for k in doomed {
            self.inner.pop(&k);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_its_capacity() {
        let mut c = Lru::new(100);
        for i in 0..1000 {
            c.insert(i, i);
        }
        assert_eq!((c.len(), c.capacity()), (100, 100));
        assert!(c.contains(&999) && !c.contains(&899));
        assert_eq!(Lru::<u32, u32>::new(0).capacity(), 1, "at least one entry");
    }

    #[test]
    fn evicts_the_least_recently_used() {
        let mut c = Lru::new(2);
        assert!(c.insert(1, "a").is_none());
        assert!(c.insert(2, "b").is_none());
        assert_eq!(c.get(&1), Some(&"a")); // 2 is now the oldest
        assert_eq!(c.insert(3, "c"), Some((2, "b")));
        assert!(c.contains(&1) && c.contains(&3) && !c.contains(&2));
        assert_eq!(
            c.insert(3, "d"),
            Some((3, "c")),
            "a replaced value is returned"
        );
        assert_eq!(c.len(), 2);
        c.retain(|k, _| *k != 1);
        assert_eq!(c.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [3]);
        let mut t = Lru::new(10);
        for i in 0..5 {
            t.insert(i, i * 10);
        }
        assert_eq!(t.peek(&0), Some(&0), "peek does not reorder");
        assert_eq!(t.pop_lru_while(|_, v| *v < 20), 2, "the oldest two");
        assert_eq!(
            t.pop_lru_while(|_, v| *v < 20),
            0,
            "stops at the first kept"
        );
        assert_eq!(t.len(), 3);
        assert_eq!(
            Lru::<u8, u8>::new(0).capacity(),
            1,
            "never unbounded, never zero"
        );
    }
}
