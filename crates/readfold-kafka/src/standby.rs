//! A warm standby, as Kafka Streams' standby replicas: a thread follows
//! the public changelog and the member-state topic of the partitions this
//! instance does not own, so that taking one over reads only the tails
//! written since, not the whole changelog.
//!
//! A followed partition keeps the public changelog applied to a state and
//! the member-state topic as its latest record per key, not applied: a
//! restore applies the member-state topic after the whole public one (a
//! public record would otherwise undo a membership version set before it),
//! and [`Standby::take`] hands both over as a [`LocalCheckpoint`] that
//! [`crate::changelog::Restorer::restore_many_from`] finishes in that
//! order.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::Offset;
use readfold_core::fold::{MemberStateUpdate, PartitionState};
use readfold_core::CursorKey;
use readfold_wire::changelog::{decode_changelog, ChangelogEntry, ChangelogKind};

use crate::changelog::LocalCheckpoint;
use crate::config::{KafkaConfig, TopicsConfig};
use crate::error::Result;
use crate::reader::TopicReader;

/// How long the thread polls before it looks at its commands again.
const POLL_BUDGET: Duration = Duration::from_millis(50);
/// How long [`Standby::take`] waits for the thread's answer.
const TAKE_WAIT: Duration = Duration::from_secs(5);

/// What the standby's thread holds of one partition.
struct Followed {
    /// The public changelog, applied.
    public: PartitionState,
    /// The member-state topic: each key's latest record.
    member_states: HashMap<CursorKey, MemberStateUpdate>,
    /// The next offset of each topic to apply; `None` before the first.
    public_next: Option<i64>,
    state_next: Option<i64>,
}

impl Followed {
    fn new() -> Self {
        Followed {
            public: PartitionState::new(),
            member_states: HashMap::new(),
            public_next: None,
            state_next: None,
        }
    }

    /// The state, as a checkpoint of where the standby got to. A topic it
    /// read nothing of is read from its start (offset 0, or the log start
    /// past it).
    fn into_checkpoint(self) -> LocalCheckpoint {
        LocalCheckpoint {
            state: self.public,
            public_offset: self.public_next.unwrap_or(0),
            state_offset: self.state_next.unwrap_or(0),
            // Taken from the changelog, as a restore: CQL may lack any of it.
            in_cql: false,
            member_states: self.member_states.into_values().collect(),
        }
    }
}

enum Command {
    Follow(Vec<i32>),
    Take(Vec<i32>, mpsc::SyncSender<BTreeMap<i32, LocalCheckpoint>>),
    Forget(Vec<i32>),
}

/// Counts for telemetry, kept by the thread.
#[derive(Default)]
pub struct StandbyStats {
    /// Partitions followed.
    pub partitions: AtomicUsize,
    /// Cursors held, over every followed partition.
    pub cursors: AtomicUsize,
    /// Member-state records held, not yet applied.
    pub member_states: AtomicUsize,
}

/// The standby: its thread, and the way to tell it what to follow. The
/// thread ends once this is dropped (its commands' channel closes).
pub struct Standby {
    commands: mpsc::Sender<Command>,
    stats: Arc<StandbyStats>,
}

impl Standby {
    /// Starts the thread, following nothing yet.
    pub fn start(kafka: &KafkaConfig, topics: &TopicsConfig, max_id_bytes: usize) -> Result<Standby> {
        let reader = TopicReader::new(kafka, &format!("{}-standby", kafka.group_id), true)?;
        let (commands, inbox) = mpsc::channel();
        let stats = Arc::new(StandbyStats::default());
        let mut follower = Follower {
            reader,
            follows: Follows {
                public_topic: topics.read_cursors.clone(),
                state_topic: topics.member_state.clone(),
                max_id_bytes,
                followed: BTreeMap::new(),
            },
            stats: Arc::clone(&stats),
        };
        std::thread::Builder::new()
            .name("standby".into())
            .spawn(move || follower.run(inbox))
            .expect("spawn the standby thread");
        Ok(Standby { commands, stats })
    }

    /// Follows `partitions` too, each from its beginning (those followed
    /// already go on where they are).
    pub fn follow(&self, partitions: Vec<i32>) {
        if !partitions.is_empty() {
            let _ = self.commands.send(Command::Follow(partitions));
        }
    }

    /// Stops following `partitions` without handing anything over.
    pub fn forget(&self, partitions: Vec<i32>) {
        if !partitions.is_empty() {
            let _ = self.commands.send(Command::Forget(partitions));
        }
    }

    /// Stops following `partitions` and hands over what it has of them,
    /// for their restore; those it does not follow are left out. Blocks
    /// until the thread answers (within its next poll).
    pub fn take(&self, partitions: &[i32]) -> BTreeMap<i32, LocalCheckpoint> {
        let (answer, answered) = mpsc::sync_channel(1);
        if partitions.is_empty()
            || self
                .commands
                .send(Command::Take(partitions.to_vec(), answer))
                .is_err()
        {
            return BTreeMap::new();
        }
        answered.recv_timeout(TAKE_WAIT).unwrap_or_else(|_| {
            tracing::warn!(
                ?partitions,
                "the standby did not answer; restoring from the changelogs"
            );
            BTreeMap::new()
        })
    }

    pub fn stats(&self) -> &StandbyStats {
        &self.stats
    }
}

struct Follower {
    reader: TopicReader,
    follows: Follows,
    stats: Arc<StandbyStats>,
}

/// What the standby follows, and where each partition got to: the
/// follower's state, apart from its reader.
struct Follows {
    public_topic: String,
    state_topic: String,
    max_id_bytes: usize,
    followed: BTreeMap<i32, Followed>,
}

/// A fetched record, as the standby takes it in.
#[derive(Clone, Copy)]
struct Fetched<'a> {
    topic: &'a str,
    partition: i32,
    offset: i64,
    key: Option<&'a [u8]>,
    payload: Option<&'a [u8]>,
}

impl<'a> Fetched<'a> {
    fn of(message: &'a BorrowedMessage<'_>) -> Self {
        Fetched {
            topic: message.topic(),
            partition: message.partition(),
            offset: message.offset(),
            key: message.key(),
            payload: message.payload(),
        }
    }
}

impl Follower {
    fn run(&mut self, inbox: mpsc::Receiver<Command>) {
        loop {
            let mut changed = false;
            loop {
                match inbox.try_recv() {
                    Ok(command) => changed |= self.follows.apply(command),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            }
            if changed {
                if let Err(e) = self.reader.assign_topics(&self.follows.starts()) {
                    tracing::warn!(error = %e, "standby: cannot assign its partitions; trying again");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
                self.publish_stats();
            }
            if self.follows.followed.is_empty() {
                std::thread::sleep(POLL_BUDGET);
                continue;
            }
            let mut applied = false;
            let follows = &mut self.follows;
            let polled = self
                .reader
                .poll_within(Duration::from_millis(20), POLL_BUDGET, |message| {
                    applied |= follows.take_in(Fetched::of(message));
                });
            if let Err(e) = polled {
                tracing::warn!(error = %e, "standby: read failed; retrying");
                std::thread::sleep(Duration::from_secs(1));
            }
            if applied {
                self.publish_stats();
            }
        }
    }

    fn publish_stats(&self) {
        let (stats, followed) = (&self.stats, &self.follows.followed);
        stats.partitions.store(followed.len(), Ordering::Relaxed);
        let cursors = followed.values().map(|f| f.public.cursor_count()).sum();
        stats.cursors.store(cursors, Ordering::Relaxed);
        let states = followed.values().map(|f| f.member_states.len()).sum();
        stats.member_states.store(states, Ordering::Relaxed);
    }
}

impl Follows {
    /// Applies a command; whether the set of followed partitions changed.
    fn apply(&mut self, command: Command) -> bool {
        let before: Vec<i32> = self.followed.keys().copied().collect();
        match command {
            Command::Follow(partitions) => {
                for p in partitions {
                    self.followed.entry(p).or_insert_with(Followed::new);
                }
            }
            Command::Take(partitions, answer) => {
                let _ = answer.send(self.take(&partitions));
            }
            Command::Forget(partitions) => {
                for p in partitions {
                    self.followed.remove(&p);
                }
            }
        }
        !self.followed.keys().copied().eq(before)
    }

    /// Stops following `partitions`; what it had of them.
    fn take(&mut self, partitions: &[i32]) -> BTreeMap<i32, LocalCheckpoint> {
        partitions
            .iter()
            .filter_map(|p| Some((*p, self.followed.remove(p)?.into_checkpoint())))
            .collect()
    }

    /// Where each followed partition of both topics is to be read from.
    fn starts(&self) -> Vec<(&str, i32, Offset)> {
        let at = |next: Option<i64>| next.map_or(Offset::Beginning, Offset::Offset);
        self.followed
            .iter()
            .flat_map(|(&p, f)| {
                [
                    (self.public_topic.as_str(), p, at(f.public_next)),
                    (self.state_topic.as_str(), p, at(f.state_next)),
                ]
            })
            .collect()
    }

    /// Applies one record of a followed partition; whether it did.
    fn take_in(&mut self, record: Fetched<'_>) -> bool {
        let Fetched {
            topic,
            partition,
            offset,
            key,
            payload,
        } = record;
        let public = topic == self.public_topic;
        let Some(followed) = self.followed.get_mut(&partition) else {
            return false;
        };
        // Already applied (fetched again after a new assignment): a public
        // record applied twice out of order would set an older join_seq.
        let next = if public {
            &mut followed.public_next
        } else {
            &mut followed.state_next
        };
        if next.is_some_and(|n| offset < n) {
            return false;
        }
        *next = Some(offset + 1);
        let kind = if public {
            ChangelogKind::ByConversation
        } else {
            ChangelogKind::MemberState
        };
        match decode_changelog(kind, key, payload, self.max_id_bytes) {
            Ok(ChangelogEntry::State(state)) => {
                followed.member_states.insert(state.key.clone(), state);
            }
            Ok(entry) => entry.restore_into(&mut followed.public),
            // As a restore does: logged and skipped.
            Err(e) => {
                tracing::warn!(partition, offset, error = %e, "standby: skipping an unreadable changelog record")
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use readfold_core::fold::{ConversationEvent, EventKind, ReadReport};
    use readfold_core::Seq;
    use readfold_wire::changelog::{changelog_records, OutputTopics};
    use readfold_wire::OutputLayout;

    use super::*;

    fn out() -> OutputTopics {
        OutputTopics {
            thread_cursors: "chat.thread-cursors".into(),
            thread_state: "chat.read-thread-state".into(),
            user_thread_cursors: "chat.user-thread-cursors".into(),
            read_cursors: "public".into(),
            user_read_cursors: "by-user".into(),
            member_state: "state".into(),
            dlq: "dlq".into(),
            layout: OutputLayout {
                user_thread_cursors_partitions: 4,
                user_read_cursors_partitions: 1,
                dlq_partitions: 1,
            },
        }
    }

    fn follows() -> Follows {
        Follows {
            public_topic: "public".into(),
            state_topic: "state".into(),
            max_id_bytes: 256,
            followed: BTreeMap::new(),
        }
    }

    /// The changelog records of alice joining G and reading up to `read`
    /// (privately too, so that a member-state record is among them).
    fn records(read: u64) -> Vec<readfold_wire::OutRecord> {
        let mut state = PartitionState::new();
        let (conversation_id, alice) = ("G".parse().unwrap(), "alice".parse().unwrap());
        state.apply_event(&ConversationEvent {
            conversation_id: "G".parse().unwrap(),
            seq: Seq(9),
            at: 1,
            kind: EventKind::MessageSent {
                sender_id: "bob".parse().unwrap(),
                mentions: Default::default(),
            },
        });
        state.drain();
        for private in [true, false] {
            state.apply_report(&ReadReport {
                conversation_id: Clone::clone(&conversation_id),
                user_id: Clone::clone(&alice),
                seq: Seq(read + u64::from(private)),
                reported_at: 2,
                private,
            });
        }
        let change = state.drain().into_iter().next().expect("alice's change");
        changelog_records(&change, 0, &out())
    }

    fn fetched<'a>(record: &'a readfold_wire::OutRecord, offset: i64) -> Fetched<'a> {
        Fetched {
            topic: if record.topic == "public" {
                "public"
            } else {
                "state"
            },
            partition: record.partition,
            offset,
            key: record.key.as_deref(),
            payload: record.value.as_deref(),
        }
    }

    #[test]
    fn a_followed_partition_is_handed_over_with_where_it_got_to() {
        let mut follows = follows();
        assert!(follows.apply(Command::Follow(vec![0, 1])));
        assert!(!follows.apply(Command::Follow(vec![1])), "followed already");
        let first = records(3);
        let public = first.iter().find(|r| r.topic == "public").unwrap();
        let state = first.iter().find(|r| r.topic == "state").unwrap();
        assert!(follows.take_in(fetched(public, 5)));
        assert!(follows.take_in(fetched(state, 2)));
        // Fetched again after a new assignment: not applied twice.
        assert!(!follows.take_in(fetched(public, 5)));
        assert!(!follows.take_in(fetched(public, 4)));
        // An older record of the same key, at a later offset, is applied:
        // the cursor only moves forward.
        let older = records(1);
        let older = older.iter().find(|r| r.topic == "public").unwrap();
        assert!(follows.take_in(fetched(older, 6)));
        // A partition not followed takes nothing.
        let other = Fetched {
            partition: 7,
            ..fetched(public, 9)
        };
        assert!(!follows.take_in(other));

        let mut taken = follows.take(&[0, 7]);
        assert_eq!(taken.keys().copied().collect::<Vec<_>>(), [0]);
        let checkpoint = taken.remove(&0).unwrap();
        assert_eq!((checkpoint.public_offset, checkpoint.state_offset), (7, 3));
        assert!(!checkpoint.in_cql, "taken from the changelog: CQL may lack it");
        assert_eq!(checkpoint.member_states.len(), 1, "kept, not applied");
        let conversation = checkpoint.state.conversation(&"G".parse().unwrap()).unwrap();
        let alice = conversation.member(&"alice".parse().unwrap()).unwrap();
        assert_eq!(alice.cursor, Seq(3), "the older record moved nothing back");
        // Partition 1 read nothing: handed over to be read from the start.
        let untouched = follows.take(&[1]).remove(&1).unwrap();
        assert_eq!((untouched.public_offset, untouched.state_offset), (0, 0));
        assert!(follows.followed.is_empty());
        assert!(!follows.apply(Command::Forget(vec![3])), "nothing to forget");
    }
}
