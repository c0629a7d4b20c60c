//! A short-lived cache of conversation views, per instance. A chat screen
//! asks for the same group's read counts again and again (every member, on
//! every new message); building a view from Redis costs far more than
//! answering from one. Once an entry is `serve.cache_ms` old, the next
//! request still gets it while one background task reads it again
//! (stale-while-revalidate), so requests never queue behind a big group's
//! read. An answer is thus about `cache_ms` behind at most; cursors only
//! grow, so a stale answer is never wrong, only a moment behind. The
//! gateway does not use it: its snapshots must be read after the
//! subscription is registered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use readfold_core::ConversationView;

use crate::source::{ReadSource, Source, Unavailable};

/// A view and the store it came from.
pub type Cached = Arc<(Option<ConversationView>, Source)>;

struct Entry {
    at: Instant,
    value: Cached,
    refreshing: bool,
}

pub struct ViewCache {
    ttl: Duration,
    capacity: usize,
    entries: Mutex<HashMap<String, Entry>>,
}

impl ViewCache {
    /// `ttl` zero: no caching.
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        ViewCache {
            ttl,
            capacity: capacity.max(1),
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The conversation's view, from the cache when there is one, unless
    /// `fresh` asks for one read from the stores now (which then refreshes
    /// the cache too).
    pub async fn conversation(
        self: &Arc<Self>,
        source: &Arc<ReadSource>,
        conversation: &str,
        fresh: bool,
    ) -> Result<Cached, Unavailable> {
        if self.ttl.is_zero() {
            return Ok(Arc::new(source.conversation(conversation).await?));
        }
        if fresh {
            let view: Cached = Arc::new(source.conversation(conversation).await?);
            self.store(conversation, Some(view.clone()));
            return Ok(view);
        }
        let now = Instant::now();
        {
            let mut entries = self.entries.lock().expect("cache lock");
            if let Some(entry) = entries.get_mut(conversation) {
                crate::telemetry::cache(true);
                if now.duration_since(entry.at) >= self.ttl && !entry.refreshing {
                    entry.refreshing = true;
                    let (cache, source, key) = (self.clone(), source.clone(), conversation.to_owned());
                    tokio::spawn(async move {
                        let fresh = source.conversation(&key).await;
                        cache.store(&key, fresh.ok().map(Arc::new));
                    });
                }
                return Ok(entry.value.clone());
            }
        }
        crate::telemetry::cache(false);
        let fresh: Cached = Arc::new(source.conversation(conversation).await?);
        self.store(conversation, Some(fresh.clone()));
        Ok(fresh)
    }

    /// Stores a fresh view; `None` (the stores failed) keeps the old one,
    /// to be read again on the next request.
    fn store(&self, conversation: &str, fresh: Option<Cached>) {
        let now = Instant::now();
        let mut entries = self.entries.lock().expect("cache lock");
        let Some(value) = fresh else {
            if let Some(entry) = entries.get_mut(conversation) {
                entry.refreshing = false;
            }
            return;
        };
        if entries.len() >= self.capacity && !entries.contains_key(conversation) {
            let ttl = self.ttl;
            entries.retain(|_, e| now.duration_since(e.at) < ttl);
            if entries.len() >= self.capacity {
                entries.clear();
            }
        }
        let old = entries.insert(
            conversation.to_owned(),
            Entry {
                at: now,
                value,
                refreshing: false,
            },
        );
        drop(entries);
        // A big view is dropped outside the lock.
        drop(old);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn answers_from_the_cache_until_asked_for_a_fresh_one() {
        let source = Arc::new(ReadSource::new(None, None));
        let cache = Arc::new(ViewCache::new(Duration::from_secs(60), 10));
        let first = cache.conversation(&source, "G", false).await.unwrap();
        let again = cache.conversation(&source, "G", false).await.unwrap();
        assert!(Arc::ptr_eq(&first, &again), "a hit");
        let fresh = cache.conversation(&source, "G", true).await.unwrap();
        assert!(!Arc::ptr_eq(&first, &fresh), "no-cache reads the stores");
        let after = cache.conversation(&source, "G", false).await.unwrap();
        assert!(Arc::ptr_eq(&fresh, &after), "and refreshes the cache");
    }

    #[tokio::test]
    async fn a_full_cache_makes_room() {
        let source = Arc::new(ReadSource::new(None, None));
        let cache = Arc::new(ViewCache::new(Duration::from_secs(60), 2));
        for c in ["a", "b", "c"] {
            cache.conversation(&source, c, false).await.unwrap();
        }
        assert!(cache.entries.lock().unwrap().len() <= 2);
    }
}
