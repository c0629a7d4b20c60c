//! What a changelog says, read through the crates' changelog reader: each
//! key's committed history, and the read model over its latest values.

use std::collections::BTreeMap;

use readfold::config::Config;
use readfold_core::{ConversationView, MemberCursor, Seq, UserId};
use readfold_kafka::changelog::ChangelogReader;
use readfold_wire::changelog::{ChangelogEntry, ChangelogKind, OwnUpdate};

use super::reference::Own;

/// (conversation, user).
pub type Key = (String, String);
/// A changelog value as the tests compare it: (cursor, join_seq), or `None`
/// for a tombstone.
pub type Cursor = Option<(i64, i64)>;

/// Each key's committed history, in order.
#[derive(Debug, Default)]
pub struct Changelog {
    /// (conversation, user) -> successive values; `None` is a tombstone.
    pub history: BTreeMap<Key, Vec<Cursor>>,
    /// By-user changelog only: the latest own view per key (None: left).
    pub own: BTreeMap<Key, Option<Own>>,
    /// The latest delivered cursor per present key.
    pub delivered: BTreeMap<Key, i64>,
}

impl Changelog {
    /// Every committed record of a changelog topic.
    pub fn read(config: &Config, topic: &str, kind: ChangelogKind) -> Changelog {
        let reader = ChangelogReader::new(
            &config.kafka,
            &format!("{}-test-read", config.kafka.group_id),
            topic,
            kind,
            config.input.max_id_bytes,
        )
        .expect("changelog reader");
        let mut log = Changelog::default();
        for (_, entry) in reader.entries(None).expect("read the changelog") {
            let Some(key) = entry.key() else {
                continue;
            };
            let id = (key.conversation_id.to_string(), key.user_id.to_string());
            match &entry {
                ChangelogEntry::Upsert(u) | ChangelogEntry::Own(OwnUpdate { update: u, .. }) => {
                    log.delivered.insert(id.clone(), u.delivered.get() as i64);
                }
                ChangelogEntry::Left(_) => {
                    log.delivered.remove(&id);
                }
                ChangelogEntry::State(_) | ChangelogEntry::Thread(_) => {}
            }
            let value = match entry {
                ChangelogEntry::Upsert(u) => Some((u.cursor.get() as i64, u.join_seq.get() as i64)),
                ChangelogEntry::Own(OwnUpdate {
                    update: u,
                    private_cursor,
                    unread_mark,
                    unread_mentions,
                    muted_until,
                }) => {
                    log.own.insert(
                        id.clone(),
                        Some(Own {
                            cursor: u.cursor.get() as i64,
                            join_seq: u.join_seq.get() as i64,
                            private_cursor: private_cursor.get() as i64,
                            unread_mark,
                            unread_mentions,
                            muted_until,
                        }),
                    );
                    Some((u.cursor.get() as i64, u.join_seq.get() as i64))
                }
                ChangelogEntry::Left(_) => {
                    log.own.insert(id.clone(), None);
                    None
                }
                ChangelogEntry::State(_) | ChangelogEntry::Thread(_) => continue,
            };
            log.history.entry(id).or_default().push(value);
        }
        log
    }

    /// The latest value per key.
    pub fn latest(&self) -> BTreeMap<Key, Cursor> {
        self.history
            .iter()
            .map(|(k, v)| (k.clone(), *v.last().unwrap()))
            .collect()
    }

    /// Keys whose delivered cursor went down, or below the cursor, within
    /// their latest values (see [`Changelog::delivered`]).
    pub fn delivered_below_cursor(&self) -> Vec<String> {
        self.latest()
            .into_iter()
            .filter_map(|(k, v)| {
                let (cursor, _) = v?;
                let delivered = *self.delivered.get(&k)?;
                (delivered < cursor).then(|| format!("{k:?}: delivered {delivered} < cursor {cursor}"))
            })
            .collect()
    }

    /// Keys whose cursor ever went down between two values (tombstones
    /// aside: a member who leaves and rejoins keeps a cursor at least as high).
    pub fn regressions(&self) -> Vec<String> {
        let mut bad = Vec::new();
        for (key, values) in &self.history {
            let mut high = 0;
            for (cursor, _) in values.iter().flatten() {
                if *cursor < high {
                    bad.push(format!("{key:?}: {values:?}"));
                    break;
                }
                high = *cursor;
            }
        }
        bad
    }

    /// One conversation's present members, from the latest values.
    pub fn view(&self, conversation: &str) -> ConversationView {
        let members = self
            .latest()
            .into_iter()
            .filter(|((c, _), _)| c == conversation)
            .filter_map(|((c, u), v)| {
                let (cursor, join_seq) = v?;
                let delivered = self.delivered.get(&(c, u.clone())).copied().unwrap_or(cursor);
                Some((
                    u.parse::<UserId>().unwrap(),
                    MemberCursor {
                        cursor: Seq(cursor as u64),
                        delivered: Seq(delivered as u64),
                        join_seq: Seq(join_seq as u64),
                    },
                ))
            })
            .collect();
        ConversationView {
            latest_seq: Seq::ZERO,
            members,
        }
    }

    /// Read count of message `seq` sent by `sender`, by the read model over
    /// the changelog's latest values.
    pub fn read_count(&self, conversation: &str, seq: u64, sender: &str) -> usize {
        self.view(conversation)
            .read_count(Seq(seq), &sender.parse().unwrap())
    }
}
