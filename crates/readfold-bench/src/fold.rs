//! `readfold-bench fold`: the pure fold with a synthetic workload (one hot
//! group, many 1:1 chats), with no I/O: fold speed, and what each flush
//! would send to Redis and CQL.

use std::time::Instant;

use std::collections::HashMap;

use readfold_core::fold::{
    ConversationEvent, DeliveryReport, EventKind, Input, PartitionState, ReadReport, ThreadReadReport,
};
use readfold_core::{ConversationId, Seq, UserId};

/// The workload's shape.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Reports through the pure fold.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub reports: u64,
    /// Members of the one group that takes half of the reports.
    #[arg(long, default_value_t = 500)]
    pub group_members: u64,
    /// 1:1 chats that take the other half.
    #[arg(long, default_value_t = 10_000)]
    pub direct_chats: u64,
    /// Reports between flushes (input rate x flush interval).
    #[arg(long, default_value_t = 5_000)]
    pub flush_every: u64,
    /// Share of the reports that are delivery reports of the latest
    /// message (0..=1).
    #[arg(long, default_value_t = 0.0)]
    pub delivery_share: f64,
    /// Share of the group's reports that are in threads (0..=1): reads of
    /// the threads of its last five messages, and one reply for every nine
    /// reads.
    #[arg(long, default_value_t = 0.0)]
    pub thread_share: f64,
}

/// Workload shape.
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub reports: u64,
    pub group_members: u64,
    pub direct_chats: u64,
    /// Reports folded between two flushes (rate x flush interval).
    pub flush_every: u64,
    /// In 1/1000ths: reports that are deliveries.
    pub delivery_permille: u64,
    /// In 1/1000ths: the group's reports that are in threads.
    pub thread_permille: u64,
    /// `redis.conversations_per_call`: how the flushes' Redis calls are
    /// counted.
    pub conversations_per_call: usize,
}

impl Workload {
    /// `args`' workload, its Redis calls counted `conversations_per_call`
    /// conversations to a call.
    pub fn new(args: &Args, conversations_per_call: usize) -> Self {
        Workload {
            reports: args.reports,
            group_members: args.group_members.max(1),
            direct_chats: args.direct_chats.max(1),
            flush_every: args.flush_every.max(1),
            delivery_permille: (args.delivery_share.clamp(0.0, 1.0) * 1000.0).round() as u64,
            thread_permille: (args.thread_share.clamp(0.0, 1.0) * 1000.0).round() as u64,
            conversations_per_call,
        }
    }
}

/// What the run measured.
#[derive(Clone, Copy, Debug)]
pub struct Figures {
    pub reports: u64,
    /// The flushes' changes encoded as the processor encodes them.
    pub encoded: Encoded,
    /// The flushes' changes grouped by conversation for the stores.
    pub grouped: Grouped,
    pub flushes: u64,
    pub cursor_updates: u64,
    /// Thread followers' changes published, and of the reports, those in
    /// threads.
    pub thread_updates: u64,
    pub thread_reports: u64,
    /// Threads and follower entries held at the end.
    pub threads: (usize, usize),
    pub redis_calls: u64,
    pub elapsed_secs: f64,
    pub cursors: usize,
}

/// A small deterministic generator (xorshift), so runs are comparable.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

pub fn run(w: Workload) -> Figures {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut state = PartitionState::new();
    let group: ConversationId = "hot-group".parse().expect("id");
    let members: Vec<UserId> = (0..w.group_members)
        .map(|i| UserId::parse(&format!("m{i}"), 64).expect("id"))
        .collect();
    let chats: Vec<ConversationId> = (0..w.direct_chats)
        .map(|i| ConversationId::parse(&format!("dm{i}"), 64).expect("id"))
        .collect();
    let pair = [
        UserId::parse("a", 8).expect("id"),
        UserId::parse("b", 8).expect("id"),
    ];
    let mut group_latest = 0u64;
    let mut chat_latest = vec![0u64; chats.len()];
    let (mut flushes, mut cursor_updates, mut redis_calls) = (0u64, 0u64, 0u64);
    let (mut thread_updates, mut thread_reports) = (0u64, 0u64);
    let mut thread_latest: HashMap<u64, u64> = HashMap::new();
    // The inputs of one flush window are made before the clock runs, as a
    // decoder would hand them over: the figure is the fold's and the
    // flush's, not the generator's.
    let mut window: Vec<Input> = Vec::with_capacity(w.flush_every as usize * 11 / 10 + 1);
    let mut elapsed = std::time::Duration::ZERO;
    let mut encoded = Encoded::default();
    let mut grouped = Grouped::default();
    let mut i = 0;
    while i < w.reports {
        window.clear();
        let end = (i + w.flush_every).min(w.reports);
        for i in i..end {
            if i % 2 == 0 {
                // The hot group: a message every 10 reports, everyone reads near the end.
                if i % 20 == 0 {
                    group_latest += 1;
                    window.push(Input::Event(ConversationEvent {
                        conversation_id: group.clone(),
                        seq: Seq(group_latest),
                        at: i as i64,
                        kind: EventKind::MessageSent {
                            mentions: Default::default(),
                            sender_id: members[0].clone(),
                        },
                    }));
                }
                let reader = &members[(rng.next() % w.group_members) as usize];
                // With no thread share no number is drawn, so a seed gives
                // the same conversation workload with or without threads.
                if w.thread_permille > 0 && rng.next() % 1000 < w.thread_permille && group_latest > 0 {
                    thread_reports += 1;
                    let root = group_latest.saturating_sub(rng.next() % 5).max(1);
                    let latest = thread_latest.entry(root).or_insert(0);
                    if *latest == 0 || rng.next().is_multiple_of(10) {
                        *latest += 1;
                        window.push(Input::Event(ConversationEvent {
                            conversation_id: group.clone(),
                            seq: Seq(group_latest),
                            at: i as i64,
                            kind: EventKind::ReplySent {
                                thread: Seq(root),
                                thread_seq: Seq(*latest),
                                sender_id: reader.clone(),
                                mentions: Vec::new(),
                                starter_id: Some(members[0].clone()),
                            },
                        }));
                        continue;
                    }
                    window.push(Input::ThreadRead(ThreadReadReport {
                        conversation_id: group.clone(),
                        thread: Seq(root),
                        user_id: reader.clone(),
                        seq: Seq(latest.saturating_sub(rng.next() % 2).max(1)),
                        reported_at: i as i64,
                        private: false,
                    }));
                    continue;
                }
                if rng.next() % 1000 < w.delivery_permille {
                    window.push(delivery(&group, reader, group_latest.max(1), i));
                    continue;
                }
                let seq = group_latest.saturating_sub(rng.next() % 3).max(1);
                window.push(Input::Report(ReadReport {
                    conversation_id: group.clone(),
                    user_id: reader.clone(),
                    seq: Seq(seq),
                    reported_at: i as i64,
                    private: false,
                }));
            } else {
                let c = (rng.next() % w.direct_chats) as usize;
                if rng.next().is_multiple_of(2) {
                    chat_latest[c] += 1;
                }
                let seq = chat_latest[c].max(1);
                let user = &pair[(rng.next() % 2) as usize];
                if rng.next() % 1000 < w.delivery_permille {
                    window.push(delivery(&chats[c], user, seq, i));
                    continue;
                }
                window.push(Input::Report(ReadReport {
                    conversation_id: chats[c].clone(),
                    user_id: user.clone(),
                    seq: Seq(seq),
                    reported_at: i as i64,
                    private: false,
                }));
            }
        }
        i = end;
        let started = Instant::now();
        for input in &window {
            state.apply(input);
        }
        let (threads, thread_states) = state.pending_thread_changes();
        let changes = state.drain();
        elapsed += started.elapsed();
        encoded += encode(&changes);
        encoded += encode_threads(&threads, &thread_states);
        thread_updates += threads.len() as u64;
        let grouping = Instant::now();
        let conversations = readfold_core::flush::group_by_conversation(&changes);
        grouped.changes += changes.len() as u64;
        grouped.conversations += conversations.len() as u64;
        grouped.secs += grouping.elapsed().as_secs_f64();
        flushes += 1;
        cursor_updates += changes.len() as u64;
        redis_calls += readfold_store::redis::calls(&conversations, w.conversations_per_call).count() as u64;
    }
    Figures {
        reports: w.reports,
        encoded,
        grouped,
        flushes,
        cursor_updates,
        thread_updates,
        thread_reports,
        threads: state.thread_counts(),
        redis_calls,
        elapsed_secs: elapsed.as_secs_f64(),
        cursors: state.cursor_count(),
    }
}

fn delivery(conversation: &ConversationId, user: &UserId, seq: u64, at: u64) -> Input {
    Input::Delivery(DeliveryReport {
        conversation_id: conversation.clone(),
        user_id: user.clone(),
        seq: Seq(seq),
        reported_at: at as i64,
    })
}

/// The flushes' changes grouped by conversation, as the stores take them,
/// timed apart from the fold.
#[derive(Clone, Copy, Debug, Default)]
pub struct Grouped {
    pub changes: u64,
    pub conversations: u64,
    pub secs: f64,
}

/// Changelog encoding, as a flush does it, timed apart from the fold.
#[derive(Clone, Copy, Debug, Default)]
pub struct Encoded {
    pub changes: u64,
    pub records: u64,
    pub secs: f64,
}

impl std::ops::AddAssign for Encoded {
    fn add_assign(&mut self, other: Encoded) {
        self.changes += other.changes;
        self.records += other.records;
        self.secs += other.secs;
    }
}

/// Encodes `changes` into the changelogs' records as a flush does, in its
/// chunks (partition 0, six by-user partitions, no framing).
fn encode(changes: &[readfold_core::fold::Change]) -> Encoded {
    use readfold_wire::changelog::{ChangelogFrames, EncodedRecords, OutputLayout};
    let layout = OutputLayout {
        user_thread_cursors_partitions: 6,
        user_read_cursors_partitions: 6,
        dlq_partitions: 6,
    };
    let started = Instant::now();
    let mut records = 0;
    for part in changes.chunks(2048) {
        let mut encoded = EncodedRecords::with_capacity(part.len());
        for change in part {
            encoded.push_change(change, 0, &layout, &ChangelogFrames::default());
        }
        records += encoded.len() as u64;
        std::hint::black_box(&encoded);
    }
    Encoded {
        changes: changes.len() as u64,
        records,
        secs: started.elapsed().as_secs_f64(),
    }
}

/// Encodes a flush's thread changes as the processor does.
fn encode_threads(
    changes: &[readfold_core::fold::ThreadChange],
    states: &[readfold_core::fold::ThreadStateChange],
) -> Encoded {
    use readfold_wire::changelog::{ChangelogFrames, EncodedRecords, OutputLayout};
    let layout = OutputLayout {
        user_thread_cursors_partitions: 6,
        user_read_cursors_partitions: 6,
        dlq_partitions: 6,
    };
    let started = Instant::now();
    let mut encoded = EncodedRecords::with_capacity(changes.len());
    for change in changes {
        encoded.push_thread_change(change, 0, &layout, &ChangelogFrames::default());
    }
    for state in states {
        encoded.push_thread_state(state, 0, &ChangelogFrames::default());
    }
    std::hint::black_box(&encoded);
    Encoded {
        changes: (changes.len() + states.len()) as u64,
        records: encoded.len() as u64,
        secs: started.elapsed().as_secs_f64(),
    }
}

/// Changelog records decoded per second (key and value), the restore's
/// inner loop.
pub fn decode_rate(records: u64) -> f64 {
    use readfold_wire::codec::{
        decode_cursor_key, decode_cursor_update, encode_cursor_key, encode_cursor_update,
    };
    use readfold_wire::codec::{CursorKeyRecord, CursorUpdateRecord};
    let key = encode_cursor_key(&CursorKeyRecord {
        conversation_id: "conv-12345".into(),
        user_id: "user-42".into(),
    });
    let value = encode_cursor_update(&CursorUpdateRecord {
        muted_until: None,
        unread_mentions: None,
        conversation_id: "conv-12345".into(),
        user_id: "user-42".into(),
        cursor: 1234,
        join_seq: 1,
        latest_seq: 1300,
        updated_at: 1_700_000_000_000,
        private_cursor: None,
        unread_mark: None,
        delivered_cursor: None,
    });
    let started = Instant::now();
    let mut sum = 0i64;
    for _ in 0..records {
        let k = decode_cursor_key(&key).expect("valid key");
        let v = decode_cursor_update(&value).expect("valid value");
        sum += v.cursor + k.user_id.len() as i64;
    }
    std::hint::black_box(sum);
    records as f64 / started.elapsed().as_secs_f64()
}

pub fn print(w: Workload, f: Figures) {
    let per = |n: u64| n as f64 / f.reports as f64;
    println!(
        "workload: {} reports, half to one {}-member group, half to {} 1:1 chats; a flush every {} reports; {:.1}% deliveries; {:.1}% of the group's in threads",
        w.reports,
        w.group_members,
        w.direct_chats,
        w.flush_every,
        w.delivery_permille as f64 / 10.0,
        w.thread_permille as f64 / 10.0
    );
    println!(
        "fold (pure, one core):            {:>12.0} reports/s   (fold and flush planning; the inputs are made outside the clock)",
        f.reports as f64 / f.elapsed_secs
    );
    let e = f.encoded;
    println!(
        "changelog encode (one core):      {:>12.0} records/s   ({:.0} changes/s, {:.2} records each)",
        e.records as f64 / e.secs.max(1e-9),
        e.changes as f64 / e.secs.max(1e-9),
        e.records as f64 / e.changes.max(1) as f64
    );
    let g = f.grouped;
    println!(
        "stores' grouping (one core):      {:>12.0} changes/s   (by conversation, {:.2} changes each)",
        g.changes as f64 / g.secs.max(1e-9),
        g.changes as f64 / g.conversations.max(1) as f64
    );
    println!(
        "changelog decode (one core):      {:>12.0} records/s",
        decode_rate(200_000)
    );
    println!("flushes:                          {:>12}", f.flushes);
    if f.thread_reports > 0 {
        println!(
            "thread reports, replies:          {:>12}   ({} threads, {} thread cursors held; {:.4} thread cursor updates per thread report)",
            f.thread_reports,
            f.threads.0,
            f.threads.1,
            f.thread_updates as f64 / f.thread_reports as f64
        );
    }
    println!("cursors held:                     {:>12}", f.cursors);
    println!(
        "Redis script calls per report:    {:>12.4}   (seed design: 1 EVAL per report; ratio {:.1}x fewer)",
        per(f.redis_calls),
        1.0 / per(f.redis_calls).max(f64::MIN_POSITIVE)
    );
    println!("cursor updates per report:        {:>12.4}   (= CQL rows and changelog records per report; seed: 1; ratio {:.1}x fewer)",
        per(f.cursor_updates), 1.0 / per(f.cursor_updates).max(f64::MIN_POSITIVE));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coalescing_never_writes_more_than_one_update_per_report() {
        let w = Workload {
            reports: 10_000,
            group_members: 50,
            direct_chats: 100,
            flush_every: 500,
            delivery_permille: 300,
            thread_permille: 300,
            conversations_per_call: 64,
        };
        let f = run(w);
        assert!(f.cursor_updates <= f.reports);
        // A reply publishes its sender and, the first time, the starter.
        assert!(f.thread_reports > 0 && f.thread_updates <= 2 * f.thread_reports);
        assert!(f.redis_calls <= f.cursor_updates);
        assert_eq!(f.flushes, 20);
    }
}
