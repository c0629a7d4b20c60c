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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// Records applied since the start.
    pub records: AtomicU64,
}

/// The standby: its thread, and the way to tell it what to follow.
pub struct Standby {
    commands: mpsc::Sender<Command>,
    stats: Arc<StandbyStats>,
    stop: Arc<AtomicBool>,
}

impl Standby {
    /// Starts the thread, following nothing yet.
    pub fn start(kafka: &KafkaConfig, topics: &TopicsConfig, max_id_bytes: usize) -> Result<Standby> {
        let reader = TopicReader::new(kafka, &format!("{}-standby", kafka.group_id), true)?;
        let (commands, inbox) = mpsc::channel();
        let stats = Arc::new(StandbyStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut follower = Follower {
            reader,
            topics: Topics {
                public: topics.read_cursors.clone(),
                member_state: topics.member_state.clone(),
                max_id_bytes,
            },
            followed: BTreeMap::new(),
            stats: Arc::clone(&stats),
        };
        let stopping = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("standby".into())
            .spawn(move || follower.run(inbox, &stopping))
            .expect("spawn the standby thread");
        Ok(Standby {
            commands,
            stats,
            stop,
        })
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

impl Drop for Standby {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

struct Follower {
    reader: TopicReader,
    topics: Topics,
    followed: BTreeMap<i32, Followed>,
    stats: Arc<StandbyStats>,
}

/// The two topics a standby follows, and how to read their records.
struct Topics {
    public: String,
    member_state: String,
    max_id_bytes: usize,
}

impl Follower {
    fn run(&mut self, inbox: mpsc::Receiver<Command>, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let mut changed = false;
            loop {
                match inbox.try_recv() {
                    Ok(command) => changed |= self.apply(command),
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            }
            if changed {
                if let Err(e) = self.assign() {
                    tracing::warn!(error = %e, "standby: cannot assign its partitions; trying again");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
                self.publish_stats();
            }
            if self.followed.is_empty() {
                std::thread::sleep(POLL_BUDGET);
                continue;
            }
            let mut applied = 0;
            let (followed, topics) = (&mut self.followed, &self.topics);
            let polled = self
                .reader
                .poll_within(Duration::from_millis(20), POLL_BUDGET, |message| {
                    applied += u64::from(topics.take_in(followed, message));
                });
            if let Err(e) = polled {
                tracing::warn!(error = %e, "standby: read failed; retrying");
                std::thread::sleep(Duration::from_secs(1));
            }
            if applied > 0 {
                self.stats.records.fetch_add(applied, Ordering::Relaxed);
                self.publish_stats();
            }
        }
    }

    /// Applies a command; whether the assignment changed.
    fn apply(&mut self, command: Command) -> bool {
        match command {
            Command::Follow(partitions) => {
                let before = self.followed.len();
                for p in partitions {
                    self.followed.entry(p).or_insert_with(Followed::new);
                }
                self.followed.len() != before
            }
            Command::Take(partitions, answer) => {
                let taken: BTreeMap<i32, LocalCheckpoint> = partitions
                    .iter()
                    .filter_map(|p| Some((*p, self.followed.remove(p)?.into_checkpoint())))
                    .collect();
                let _ = answer.send(taken);
                true
            }
            Command::Forget(partitions) => {
                let before = self.followed.len();
                for p in partitions {
                    self.followed.remove(&p);
                }
                self.followed.len() != before
            }
        }
    }

    /// Assigns both topics' followed partitions, each where it got to.
    fn assign(&self) -> Result<()> {
        let at = |next: Option<i64>| next.map_or(Offset::Beginning, Offset::Offset);
        let starts: Vec<(&str, i32, Offset)> = self
            .followed
            .iter()
            .flat_map(|(&p, f)| {
                [
                    (self.topics.public.as_str(), p, at(f.public_next)),
                    (self.topics.member_state.as_str(), p, at(f.state_next)),
                ]
            })
            .collect();
        self.reader.assign_topics(&starts)
    }

    fn publish_stats(&self) {
        let stats = &self.stats;
        stats.partitions.store(self.followed.len(), Ordering::Relaxed);
        let cursors = self.followed.values().map(|f| f.public.cursor_count()).sum();
        stats.cursors.store(cursors, Ordering::Relaxed);
        let states = self.followed.values().map(|f| f.member_states.len()).sum();
        stats.member_states.store(states, Ordering::Relaxed);
    }
}

impl Topics {
    /// Applies one record of a followed partition; whether it did.
    fn take_in(&self, followed: &mut BTreeMap<i32, Followed>, message: &BorrowedMessage<'_>) -> bool {
        let (partition, offset) = (message.partition(), message.offset());
        let public = message.topic() == self.public;
        let Some(followed) = followed.get_mut(&partition) else {
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
        match decode_changelog(kind, message.key(), message.payload(), self.max_id_bytes) {
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
