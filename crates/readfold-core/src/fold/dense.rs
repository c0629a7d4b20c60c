//! A map whose entries sit densely in one vector, numbered by insertion,
//! with a hash table of 4-byte numbers to find them.
//!
//! A partition holds millions of conversations and users. In a hash map
//! each entry takes a bucket of its own size, and a map is a quarter to a
//! half empty at any time (hashbrown keeps 1/8 free and grows by doubling),
//! so the spare room was a third of a 1:1 chat's memory. Here the spare
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

    /// Appends an entry without indexing it, for a bulk load: `find` does
    /// not see it until [`DenseMap::index_from`] indexes it.
    pub(crate) fn append_unindexed(&mut self, key: K, value: V) -> u32 {
        let i = u32::try_from(self.entries.len()).expect("fewer than 2^32 entries in one partition");
        self.entries.push((key, value));
        i
    }

    /// Indexes the entries from number `first` on, appended unindexed.
    /// Inserted one by one as they came, each would cost a cache miss or
    /// two in a table of millions of buckets (its control byte and its
    /// number sit in random places): the largest share of loading a
    /// checkpoint of 1:1 chats. So they go in roughly in the
    /// order of the buckets they land in, which writes the table front to
    /// back. Returns the number of an entry whose key came before it.
    pub(crate) fn index_from(&mut self, first: u32) -> Result<(), u32> {
        let DenseMap {
            entries,
            index,
            hasher,
        } = self;
        let first = first as usize;
        let count = entries.len().saturating_sub(first);
        if count == 0 {
            return Ok(());
        }
        let rehash = |&j: &u32| hasher.hash_one(&entries[j as usize].0);
        index.reserve(count, rehash);
        // hashbrown places an entry at `hash & (buckets - 1)` or just after,
        // and holds 7/8 of its buckets. A wrong guess here would only cost
        // speed, never correctness.
        let buckets = (index.capacity() * 8 / 7).next_power_of_two().max(1) as u64;
        let bin_bits = buckets.trailing_zeros().saturating_sub(BUCKETS_PER_BIN_BITS);
        let shift = buckets.trailing_zeros() - bin_bits;
        let bin = |hash: u64| ((hash & (buckets - 1)) >> shift) as usize;
        // Each key is hashed once, reading the entries front to back; a
        // counting sort by bin then orders (hash, number) pairs, so that the
        // inserts read nothing else.
        let hashes: Vec<u64> = entries[first..]
            .iter()
            .map(|(key, _)| hasher.hash_one(key))
            .collect();
        let mut starts = vec![0u32; (1 << bin_bits) + 1];
        for &hash in &hashes {
            starts[bin(hash) + 1] += 1;
        }
        for b in 1..starts.len() {
            starts[b] += starts[b - 1];
        }
        let mut order = vec![(0u64, 0u32); count];
        for (j, &hash) in hashes.iter().enumerate() {
            let at = &mut starts[bin(hash)];
            order[*at as usize] = (hash, (first + j) as u32);
            *at += 1;
        }
        drop(hashes);
        for (hash, i) in order {
            let key = &entries[i as usize].0;
            match index.entry(hash, |&j| entries[j as usize].0 == *key, rehash) {
                hashbrown::hash_table::Entry::Occupied(_) => return Err(i),
                hashbrown::hash_table::Entry::Vacant(slot) => {
                    slot.insert(i);
                }
            }
        }
        Ok(())
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

/// A bin of the bulk index spans 2^10 buckets: their control bytes and
/// numbers, 5 KiB, stay in the core's cache while the bin is written.
const BUCKETS_PER_BIN_BITS: u32 = 10;

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

    #[test]
    fn entries_indexed_in_bulk_are_found_and_repeats_are_named() {
        let mut map: DenseMap<String, u64> = DenseMap::default();
        for n in 0..100u64 {
            map.find_or_insert_with(&n.to_string(), || n);
        }
        // Enough for several bins of the bulk index.
        for n in 100..50_000u64 {
            assert_eq!(map.append_unindexed(n.to_string(), n), n as u32);
        }
        assert_eq!(map.index_from(100), Ok(()));
        for n in 0..50_000u64 {
            assert_eq!(map.find(&n.to_string()), Some(n as u32), "{n}");
        }
        assert_eq!(map.find(&"x".to_string()), None);
        assert_eq!(map.find_or_insert_with(&"x".to_string(), || 7), (50_000, true));

        map.append_unindexed("y".to_string(), 0);
        map.append_unindexed("42".to_string(), 0);
        assert_eq!(map.index_from(50_001), Err(50_002), "42 was there before");
    }
}
