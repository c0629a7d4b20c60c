//! A map whose entries sit densely in one vector, numbered by insertion,
//! with a hash table of 4-byte numbers to find them.
//!
//! A partition holds millions of conversations and users. In a hash map
//! each entry takes a bucket of its own size, and a map is a quarter to a
//! half empty at any time (hashbrown keeps 1/8 free and grows by doubling),
//! which weighs on small entries such as a 1:1 chat's. Here the spare
//! room is 5 bytes a bucket (the number and hashbrown's control byte), the
//! entries take exactly their size once shrunk, and an entry's number is a
//! stable 4-byte handle (entries are never removed).

use std::hash::{BuildHasher, Hash};

use hashbrown::HashTable;

#[derive(Clone, Debug)]
pub(crate) struct DenseMap<K, V> {
    entries: Vec<(K, V)>,
    index: HashTable<u32>,
    /// foldhash: several times faster than the standard SipHash on short
    /// strings, with a random seed per process, so that ids chosen by
    /// clients cannot be made to collide the way they could under a fixed
    /// hash.
    hasher: foldhash::fast::RandomState,
}

impl<K, V> Default for DenseMap<K, V> {
    fn default() -> Self {
        DenseMap {
            entries: Vec::new(),
            index: HashTable::new(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl<K: Hash + Eq + Clone, V> DenseMap<K, V> {
    pub(crate) fn find(&self, key: &K) -> Option<u32> {
        let hash = self.hasher.hash_one(key);
        let entries = &self.entries;
        self.index.find(hash, |&i| entries[i as usize].0 == *key).copied()
    }

    /// The key's number, with `make()` as its value when it is new; and
    /// whether it was.
    pub(crate) fn find_or_insert_with(&mut self, key: &K, make: impl FnOnce() -> V) -> (u32, bool) {
        let hash = self.hasher.hash_one(key);
        let DenseMap {
            entries,
            index,
            hasher,
        } = self;
        if let Some(&i) = index.find(hash, |&i| entries[i as usize].0 == *key) {
            return (i, false);
        }
        let i = u32::try_from(entries.len()).expect("fewer than 2^32 entries in one partition");
        entries.push((key.clone(), make()));
        index.insert_unique(hash, i, |&j| hasher.hash_one(&entries[j as usize].0));
        (i, true)
    }

    #[cfg(test)]
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        self.find(key).map(|i| &self.entries[i as usize].1)
    }

    pub(crate) fn key(&self, i: u32) -> &K {
        &self.entries[i as usize].0
    }

    pub(crate) fn value(&self, i: u32) -> &V {
        &self.entries[i as usize].1
    }

    pub(crate) fn value_mut(&mut self, i: u32) -> &mut V {
        &mut self.entries[i as usize].1
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter().map(|(k, v)| (k, v))
    }

    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.entries.iter_mut().map(|(_, v)| v)
    }

    /// Room for `additional` more entries without growing (a restore that
    /// knows its counts: growing by doubling rehashes every entry, a cache
    /// miss each, several times over).
    pub(crate) fn reserve(&mut self, additional: usize) {
        self.entries.reserve_exact(additional);
        let DenseMap {
            entries,
            index,
            hasher,
        } = self;
        index.reserve(additional, |&j| hasher.hash_one(&entries[j as usize].0));
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn shrink_to_fit(&mut self) {
        self.entries.shrink_to_fit();
        let DenseMap {
            entries,
            index,
            hasher,
        } = self;
        index.shrink_to_fit(|&j| hasher.hash_one(&entries[j as usize].0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_keep_their_numbers_as_the_map_grows() {
        let mut map: DenseMap<String, u64> = DenseMap::default();
        for n in 0..10_000u64 {
            let (i, new) = map.find_or_insert_with(&n.to_string(), || n * 2);
            assert!(new);
            assert_eq!(i as u64, n);
        }
        map.shrink_to_fit();
        for n in 0..10_000u64 {
            let key = n.to_string();
            assert_eq!(map.find(&key), Some(n as u32));
            assert_eq!(map.get(&key), Some(&(n * 2)));
            assert_eq!(map.key(n as u32), &key);
            assert_eq!(map.find_or_insert_with(&key, || 0), (n as u32, false));
        }
        assert_eq!(map.find(&"x".to_string()), None);
        *map.value_mut(7) = 1;
        assert_eq!(map.get(&"7".to_string()), Some(&1));
        assert_eq!(map.iter().count(), 10_000);
    }
}
