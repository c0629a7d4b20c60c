//! The workload, pure: a seeded generator of chat records that a caller
//! stamps with the time it sends them.
//!
//! - **Conversations.** `direct_share` of them are 1:1; the others are
//!   groups whose sizes follow a Zipf law over 3..=`max_group`. Members are
//!   drawn from a population of `users`, so that users share conversations.
//!   A conversation's members join (events at seq 0) the first time it is
//!   active.
//! - **Sends.** A conversation sends with a weight of the square root of its
//!   size (a 5,000-member group is busier than a 1:1 chat, but not 2,500
//!   times), from a random member. `send_share` of the records are sends.
//! - **Reads.** After a send, each other member who has no read pending
//!   reads with probability `online_share`, after an exponential delay
//!   (mean `direct_read_delay_ms` in 1:1 chats, `group_read_delay_ms` in
//!   groups), and reports the conversation's latest seq then (reading is a
//!   prefix, so one pending read covers every later message). The offered
//!   rate is fixed, so the mix is kept: while sends are ahead of
//!   `send_share`, the next pending read comes early rather than another
//!   send (time is compressed when the delays would leave too few reads).
//! - **Noise, as real clients make it.** A report is repeated from a second
//!   device (`duplicate_share`), carries a seq below what that member
//!   reported before (`stale_share`: a retry from an old device), or is a
//!   private receipt (`private_share`).
//! - **Deliveries.** After a send, each other member's device reports the
//!   message delivered with probability `delivered_share` (none by
//!   default), right after the send.
//! - **Membership.** `membership_share` of the sends in groups come with a
//!   departure of a member or a new member joining at the latest seq.
//! - **Threads.** `reply_share` of the sends in groups are replies in the
//!   thread of one of the conversation's last 20 messages, by a random
//!   member. The reply's sender, the root's sender and whoever reads the
//!   thread follow it; after a reply each other follower reads it with
//!   probability `online_share` (after a group's read delay), and now and
//!   then a member who does not follow it opens it. Thread reads carry the
//!   same noise as the conversation's.
//!
//! The same seed and the same sequence of `now` values give the same
//! records.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use readfold_wire::codec::{ConversationEventRecord, EventRecord, ReadAction, ReadReportRecord};

use crate::random::Random;
use crate::zipf::Zipf;
use crate::Error;

/// What to generate. The defaults are a chat app's mix; `readfold loadgen
/// --help` names each.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadSpec {
    pub seed: u64,
    pub conversations: u32,
    pub users: u32,
    pub direct_share: f64,
    pub max_group: u32,
    pub zipf_exponent: f64,
    pub send_share: f64,
    pub online_share: f64,
    pub direct_read_delay_ms: f64,
    pub group_read_delay_ms: f64,
    pub duplicate_share: f64,
    pub stale_share: f64,
    pub private_share: f64,
    pub delivered_share: f64,
    pub membership_share: f64,
    pub reply_share: f64,
    /// Put before every conversation and user id, so that runs on shared
    /// topics never collide.
    pub prefix: String,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            seed: 1,
            conversations: 10_000,
            users: 50_000,
            direct_share: 0.7,
            max_group: 5_000,
            zipf_exponent: 1.5,
            send_share: 0.15,
            online_share: 0.6,
            direct_read_delay_ms: 2_000.0,
            group_read_delay_ms: 20_000.0,
            duplicate_share: 0.1,
            stale_share: 0.03,
            private_share: 0.02,
            delivered_share: 0.0,
            membership_share: 0.02,
            reply_share: 0.0,
            prefix: String::new(),
        }
    }
}

impl WorkloadSpec {
    pub fn validate(&self) -> Result<(), Error> {
        let share = |name: &str, v: f64| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(Error::Spec(format!("{name} must be within 0..=1, not {v}")))
            }
        };
        share("direct_share", self.direct_share)?;
        share("send_share", self.send_share)?;
        share("online_share", self.online_share)?;
        share("duplicate_share", self.duplicate_share)?;
        share("stale_share", self.stale_share)?;
        share("private_share", self.private_share)?;
        share("delivered_share", self.delivered_share)?;
        share("membership_share", self.membership_share)?;
        share("reply_share", self.reply_share)?;
        if self.conversations == 0 {
            return Err(Error::Spec("conversations must be at least 1".into()));
        }
        if self.max_group < 3 || self.max_group > self.users {
            return Err(Error::Spec(format!(
                "max_group must be within 3..=users ({}), not {}",
                self.users, self.max_group
            )));
        }
        if self.send_share == 0.0 {
            return Err(Error::Spec("send_share must be above 0".into()));
        }
        if self.zipf_exponent.is_nan() || self.zipf_exponent <= 0.0 {
            return Err(Error::Spec("zipf_exponent must be above 0".into()));
        }
        if self.direct_read_delay_ms < 0.0 || self.group_read_delay_ms < 0.0 {
            return Err(Error::Spec("read delays must not be negative".into()));
        }
        Ok(())
    }
}

/// One record to produce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Generated {
    Report(ReadReportRecord),
    Event(ConversationEventRecord),
}

#[derive(Clone, Copy, Debug)]
struct Member {
    user: u32,
    read_pending: bool,
    /// The highest seq this member reported.
    reported: u32,
}

#[derive(Debug)]
struct Conversation {
    size: u32,
    active: bool,
    latest: u32,
    members: Vec<Member>,
    /// Member user id -> index in `members`.
    index: HashMap<u32, u32>,
    /// Users who left; they never rejoin (a join and a leave of one user at
    /// one seq would have no order).
    departed: Vec<u32>,
    /// The last messages' (seq, sender), the roots replies pick from.
    recent: VecDeque<(u32, u32)>,
    /// Threads by root seq.
    threads: HashMap<u32, ThreadLoad>,
}

/// One thread of a conversation.
#[derive(Debug, Default)]
struct ThreadLoad {
    latest: u32,
    /// Users who follow it, and whether a read of theirs is due.
    followers: HashMap<u32, bool>,
    /// The highest thread seq each follower reported.
    reported: HashMap<u32, u32>,
}

/// Roots a reply picks from: the conversation's last messages.
const RECENT_ROOTS: usize = 20;

/// Counts of what was generated, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub sends: u64,
    pub reads: u64,
    pub duplicates: u64,
    pub stale: u64,
    pub private: u64,
    pub deliveries: u64,
    pub joins: u64,
    pub leaves: u64,
    /// Of `sends`: replies in threads.
    pub replies: u64,
    /// Of `reads` and `stale`: reads in threads.
    pub thread_reads: u64,
}

impl Counts {
    pub fn records(&self) -> u64 {
        self.sends + self.reads + self.duplicates + self.stale + self.deliveries + self.joins + self.leaves
    }
}

/// The generator.
pub struct Workload {
    spec: WorkloadSpec,
    random: Random,
    conversations: Vec<Conversation>,
    /// Cumulative send weights by conversation.
    activity: Vec<f64>,
    /// Reads due: (due ms, conversation, member user, thread root or 0).
    reads: BinaryHeap<Reverse<(i64, u32, u32, u32)>>,
    /// Records an action made beyond the one returned (joins, duplicates).
    queued: VecDeque<Generated>,
    counts: Counts,
}

impl Workload {
    pub fn new(spec: WorkloadSpec) -> Result<Self, Error> {
        spec.validate()?;
        let mut random = Random::new(spec.seed);
        let groups = Zipf::new(3, spec.max_group as u64, spec.zipf_exponent);
        let mut total = 0.0;
        let mut activity = Vec::with_capacity(spec.conversations as usize);
        let conversations = (0..spec.conversations)
            .map(|_| {
                let size = if random.chance(spec.direct_share) {
                    2
                } else {
                    groups.sample(&mut random) as u32
                };
                total += (size as f64).sqrt();
                activity.push(total);
                Conversation {
                    size,
                    active: false,
                    latest: 0,
                    members: Vec::new(),
                    index: HashMap::new(),
                    departed: Vec::new(),
                    recent: VecDeque::new(),
                    threads: HashMap::new(),
                }
            })
            .collect();
        Ok(Workload {
            spec,
            random,
            conversations,
            activity,
            reads: BinaryHeap::new(),
            queued: VecDeque::new(),
            counts: Counts::default(),
        })
    }

    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Conversation sizes as generated (before joins and leaves).
    pub fn sizes(&self) -> impl Iterator<Item = u32> + '_ {
        self.conversations.iter().map(|c| c.size)
    }

    fn conversation_id(&self, c: u32) -> String {
        format!("{}c{c}", self.spec.prefix)
    }

    fn user_id(&self, u: u32) -> String {
        format!("{}u{u}", self.spec.prefix)
    }

    /// The next record, stamped `now` (epoch ms): a queued one, a due read,
    /// or a send.
    pub fn next(&mut self, now: i64) -> Generated {
        loop {
            if let Some(record) = self.queued.pop_front() {
                return record;
            }
            // The rate is fixed, so the mix is kept: while sends are ahead
            // of their share, the next pending read comes, early if need be.
            let sends_ahead =
                (self.counts.sends as f64) >= self.spec.send_share * self.counts.records() as f64;
            let read_due = self.reads.peek().is_some_and(|Reverse((due, ..))| *due <= now);
            if (read_due || sends_ahead) && !self.reads.is_empty() {
                let Reverse((_, c, user, root)) = self.reads.pop().expect("peeked");
                let read = match root {
                    0 => self.read(c, user, now),
                    _ => self.thread_read(c, root, user, now),
                };
                if let Some(record) = read {
                    return record;
                }
            } else {
                return self.send(now);
            }
        }
    }

    fn send(&mut self, now: i64) -> Generated {
        let x = self.random.unit() * self.activity.last().copied().unwrap_or(0.0);
        let c = self
            .activity
            .partition_point(|w| *w <= x)
            .min(self.conversations.len() - 1) as u32;
        if !self.conversations[c as usize].active {
            self.activate(c, now);
        }
        if self.conversations[c as usize].size > 2 && self.random.chance(self.spec.membership_share) {
            self.change_membership(c, now);
        }
        let group = self.conversations[c as usize].size > 2;
        if group
            && !self.conversations[c as usize].recent.is_empty()
            && self.random.chance(self.spec.reply_share)
        {
            // Joins and departures go first.
            let reply = self.reply(c, now);
            self.queued.push_back(reply);
            return self.queued.pop_front().expect("just pushed");
        }
        let conv = &mut self.conversations[c as usize];
        conv.latest += 1;
        let seq = conv.latest;
        let sender = self.random.below(conv.members.len() as u64) as usize;
        // The sender has read their own message.
        conv.members[sender].reported = seq;
        let sender_id = conv.members[sender].user;
        let mean = if conv.size == 2 {
            self.spec.direct_read_delay_ms
        } else {
            self.spec.group_read_delay_ms
        };
        let mut delivered_to = Vec::new();
        for (i, m) in conv.members.iter_mut().enumerate() {
            if i != sender && self.spec.delivered_share > 0.0 && self.random.chance(self.spec.delivered_share)
            {
                delivered_to.push(m.user);
            }
            if i == sender || m.read_pending || !self.random.chance(self.spec.online_share) {
                continue;
            }
            m.read_pending = true;
            let due = now + self.random.exponential(mean) as i64;
            self.reads.push(Reverse((due, c, m.user, 0)));
        }
        conv.recent.push_back((seq, sender_id));
        if conv.recent.len() > RECENT_ROOTS {
            conv.recent.pop_front();
        }
        self.counts.sends += 1;
        let record = Generated::Event(ConversationEventRecord {
            conversation_id: self.conversation_id(c),
            seq: seq as i64,
            at: now,
            event: EventRecord::MessageSent {
                starter_id: None,
                thread: 0,
                thread_seq: 0,
                mention_all: false,
                mentions: Default::default(),
                sender_id: self.user_id(sender_id),
            },
        });
        // Joins and departures go first, deliveries after the message.
        self.queued.push_back(record);
        for user in delivered_to {
            let delivery = self.delivery(c, user, seq, now);
            self.queued.push_back(delivery);
        }
        self.queued.pop_front().expect("just pushed")
    }

    /// A reply in the thread of one of the conversation's last messages.
    fn reply(&mut self, c: u32, now: i64) -> Generated {
        let conv = &mut self.conversations[c as usize];
        let (root, starter) = conv.recent[self.random.below(conv.recent.len() as u64) as usize];
        let sender = conv.members[self.random.below(conv.members.len() as u64) as usize].user;
        let latest = conv.latest;
        let thread = conv.threads.entry(root).or_default();
        thread.latest += 1;
        let thread_seq = thread.latest;
        thread.reported.insert(sender, thread_seq);
        thread.followers.entry(sender).or_insert(false);
        thread.followers.entry(starter).or_insert(false);
        // A member who does not follow it opens it now and then.
        let opener = conv.members[self.random.below(conv.members.len() as u64) as usize].user;
        if self.random.chance(0.3) {
            thread.followers.entry(opener).or_insert(false);
        }
        let mut due = Vec::new();
        for (&user, pending) in thread.followers.iter_mut() {
            if user == sender || *pending || !self.random.chance(self.spec.online_share) {
                continue;
            }
            *pending = true;
            due.push(user);
        }
        for user in due {
            let at = now + self.random.exponential(self.spec.group_read_delay_ms) as i64;
            self.reads.push(Reverse((at, c, user, root)));
        }
        self.counts.sends += 1;
        self.counts.replies += 1;
        Generated::Event(ConversationEventRecord {
            conversation_id: self.conversation_id(c),
            seq: latest as i64,
            at: now,
            event: EventRecord::MessageSent {
                sender_id: self.user_id(sender),
                mentions: Vec::new(),
                mention_all: false,
                thread: root as i64,
                thread_seq: thread_seq as i64,
                starter_id: Some(self.user_id(starter)),
            },
        })
    }

    /// A due thread read by `user`, if they are still a member.
    fn thread_read(&mut self, c: u32, root: u32, user: u32, now: i64) -> Option<Generated> {
        let conv = &mut self.conversations[c as usize];
        conv.index.get(&user)?;
        let thread = conv.threads.get_mut(&root)?;
        thread.followers.insert(user, false);
        let reported = thread.reported.entry(user).or_insert(0);
        let stale = *reported > 1 && self.random.chance(self.spec.stale_share);
        let seq = if stale {
            1 + self.random.below(*reported as u64 - 1) as u32
        } else {
            *reported = thread.latest;
            thread.latest
        };
        let private = !stale && self.random.chance(self.spec.private_share);
        let duplicate = !stale && self.random.chance(self.spec.duplicate_share);
        let report = ReadReportRecord {
            conversation_id: self.conversation_id(c),
            user_id: self.user_id(user),
            seq: seq as i64,
            device_id: Some(format!("d{}", user % 3)),
            reported_at: now,
            private,
            action: ReadAction::Read,
            muted_until: None,
            thread: root as i64,
        };
        self.counts.thread_reads += 1;
        self.count_read(stale, private, duplicate, &report, user);
        Some(Generated::Report(report))
    }

    /// Counts a read and queues its duplicate from the user's other device.
    fn count_read(
        &mut self,
        stale: bool,
        private: bool,
        duplicate: bool,
        report: &ReadReportRecord,
        user: u32,
    ) {
        if stale {
            self.counts.stale += 1;
        } else {
            self.counts.reads += 1;
        }
        if private {
            self.counts.private += 1;
        }
        if duplicate {
            self.counts.duplicates += 1;
            let mut again = report.clone();
            again.device_id = Some(format!("d{}", user % 3 + 1));
            self.queued.push_back(Generated::Report(again));
        }
    }

    fn delivery(&mut self, c: u32, user: u32, seq: u32, now: i64) -> Generated {
        self.counts.deliveries += 1;
        Generated::Report(ReadReportRecord {
            thread: 0,
            muted_until: None,
            conversation_id: self.conversation_id(c),
            user_id: self.user_id(user),
            seq: seq as i64,
            device_id: Some(format!("d{}", user % 3)),
            reported_at: now,
            private: false,
            action: ReadAction::Delivered,
        })
    }

    /// Picks the members and queues their joins at seq 0.
    fn activate(&mut self, c: u32, now: i64) {
        let size = self.conversations[c as usize].size;
        let mut members = Vec::with_capacity(size as usize);
        let mut index = HashMap::with_capacity(size as usize);
        while members.len() < size as usize {
            let user = self.random.below(self.spec.users as u64) as u32;
            if index.contains_key(&user) {
                continue;
            }
            index.insert(user, members.len() as u32);
            members.push(Member {
                user,
                read_pending: false,
                reported: 0,
            });
        }
        let joins: Vec<Generated> = members
            .iter()
            .map(|m| {
                let event = EventRecord::MemberJoined {
                    user_id: self.user_id(m.user),
                };
                self.member_event(c, 0, now, event)
            })
            .collect();
        self.queued.extend(joins);
        self.counts.joins += size as u64;
        let conv = &mut self.conversations[c as usize];
        conv.members = members;
        conv.index = index;
        conv.active = true;
    }

    fn member_event(&self, c: u32, seq: u32, at: i64, event: EventRecord) -> Generated {
        Generated::Event(ConversationEventRecord {
            conversation_id: self.conversation_id(c),
            seq: seq as i64,
            at,
            event,
        })
    }

    /// A member leaves, or a new one joins, at the latest seq.
    fn change_membership(&mut self, c: u32, now: i64) {
        let (leave, latest, len) = {
            let conv = &self.conversations[c as usize];
            let leave = conv.members.len() > 3
                && (conv.members.len() >= self.spec.max_group as usize || self.random.chance(0.5));
            (leave, conv.latest, conv.members.len())
        };
        if leave {
            let i = self.random.below(len as u64) as usize;
            let conv = &mut self.conversations[c as usize];
            let gone = conv.members.swap_remove(i);
            conv.index.remove(&gone.user);
            if let Some(moved) = conv.members.get(i) {
                conv.index.insert(moved.user, i as u32);
            }
            conv.departed.push(gone.user);
            self.counts.leaves += 1;
            let event = EventRecord::MemberLeft {
                user_id: self.user_id(gone.user),
            };
            let record = self.member_event(c, latest, now, event);
            self.queued.push_back(record);
            return;
        }
        let user = self.random.below(self.spec.users as u64) as u32;
        let conv = &mut self.conversations[c as usize];
        if conv.index.contains_key(&user) || conv.departed.contains(&user) {
            return;
        }
        conv.index.insert(user, conv.members.len() as u32);
        conv.members.push(Member {
            user,
            read_pending: false,
            reported: latest,
        });
        self.counts.joins += 1;
        let event = EventRecord::MemberJoined {
            user_id: self.user_id(user),
        };
        let record = self.member_event(c, latest, now, event);
        self.queued.push_back(record);
    }

    /// A due read by `user`, if they are still a member.
    fn read(&mut self, c: u32, user: u32, now: i64) -> Option<Generated> {
        let conv = &mut self.conversations[c as usize];
        let i = *conv.index.get(&user)? as usize;
        let latest = conv.latest;
        let member = &mut conv.members[i];
        member.read_pending = false;
        let stale = member.reported > 1 && self.random.chance(self.spec.stale_share);
        let seq = if stale {
            1 + self.random.below(member.reported as u64 - 1) as u32
        } else {
            member.reported = member.reported.max(latest);
            latest
        };
        let private = !stale && self.random.chance(self.spec.private_share);
        let duplicate = !stale && self.random.chance(self.spec.duplicate_share);
        let report = ReadReportRecord {
            thread: 0,
            muted_until: None,
            conversation_id: self.conversation_id(c),
            user_id: self.user_id(user),
            seq: seq as i64,
            device_id: Some(format!("d{}", user % 3)),
            reported_at: now,
            private,
            action: ReadAction::Read,
        };
        self.count_read(stale, private, duplicate, &report, user);
        Some(Generated::Report(report))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn run(spec: WorkloadSpec, records: usize) -> (Vec<Generated>, Counts) {
        let mut w = Workload::new(spec).unwrap();
        // A virtual clock: 10,000 records a second.
        let out = (0..records).map(|i| w.next(1_000_000 + i as i64 / 10)).collect();
        (out, w.counts())
    }

    #[test]
    fn the_same_seed_gives_the_same_records_and_another_seed_others() {
        let spec = WorkloadSpec {
            conversations: 500,
            ..WorkloadSpec::default()
        };
        let (a, _) = run(spec.clone(), 20_000);
        let (b, _) = run(spec.clone(), 20_000);
        assert_eq!(a, b);
        let (c, _) = run(WorkloadSpec { seed: 2, ..spec }, 20_000);
        assert_ne!(a, c);
    }

    /// Replays the records as a reader would, checking that each is sane:
    /// reports by present members, never past the latest seq; events in seq
    /// order; and that every kind of record the spec asks for is there.
    #[test]
    fn records_are_consistent_and_every_kind_shows_up() {
        let spec = WorkloadSpec {
            conversations: 2_000,
            max_group: 800,
            ..WorkloadSpec::default()
        };
        let (records, counts) = run(spec, 300_000);
        let mut members: HashMap<String, HashSet<String>> = HashMap::new();
        let mut latest: HashMap<String, i64> = HashMap::new();
        let mut reported: HashMap<(String, String), i64> = HashMap::new();
        let (mut stale, mut duplicates) = (0, 0);
        let mut last_report: Option<ReadReportRecord> = None;
        for record in &records {
            match record {
                Generated::Event(e) => {
                    let latest = latest.entry(e.conversation_id.clone()).or_default();
                    let present = members.entry(e.conversation_id.clone()).or_default();
                    match &e.event {
                        EventRecord::MessageSent { sender_id, .. } => {
                            assert_eq!(e.seq, *latest + 1, "seqs go up by one");
                            *latest = e.seq;
                            assert!(present.contains(sender_id));
                        }
                        EventRecord::MemberJoined { user_id } => {
                            assert_eq!(e.seq, *latest);
                            assert!(present.insert(user_id.clone()), "joined twice");
                        }
                        EventRecord::MemberLeft { user_id } => {
                            assert_eq!(e.seq, *latest);
                            assert!(present.remove(user_id), "left without being there");
                        }
                    }
                }
                Generated::Report(r) => {
                    assert!(members[&r.conversation_id].contains(&r.user_id), "{r:?}");
                    assert!(1 <= r.seq && r.seq <= latest[&r.conversation_id], "{r:?}");
                    let key = (r.conversation_id.clone(), r.user_id.clone());
                    let before = reported.get(&key).copied().unwrap_or(0);
                    if r.seq < before {
                        stale += 1;
                    }
                    if last_report.as_ref().is_some_and(|l| {
                        l.conversation_id == r.conversation_id && l.user_id == r.user_id && l.seq == r.seq
                    }) {
                        duplicates += 1;
                    }
                    reported.insert(key, before.max(r.seq));
                    last_report = Some(r.clone());
                }
            }
        }
        assert_eq!(counts.records(), records.len() as u64);
        assert!(counts.sends > 0 && counts.reads > counts.sends, "{counts:?}");
        assert!(counts.joins > 0 && counts.leaves > 0, "{counts:?}");
        assert!(counts.private > 0, "{counts:?}");
        assert!(stale > 0 && stale as u64 <= counts.stale, "{stale} {counts:?}");
        assert!(
            duplicates > 0 && duplicates as u64 >= counts.duplicates,
            "{duplicates} {counts:?}"
        );
        let sends = counts.sends as f64 / counts.records() as f64;
        assert!((0.13..0.17).contains(&sends), "send share {sends}");
    }

    #[test]
    fn deliveries_follow_their_message_from_other_members() {
        let spec = WorkloadSpec {
            conversations: 300,
            max_group: 50,
            delivered_share: 0.5,
            ..WorkloadSpec::default()
        };
        let (records, counts) = run(spec, 50_000);
        assert!(counts.deliveries > 0);
        let (mut latest, mut senders) = (HashMap::new(), HashMap::new());
        let mut deliveries = 0;
        for record in &records {
            match record {
                Generated::Event(e) => {
                    if let EventRecord::MessageSent { sender_id, .. } = &e.event {
                        latest.insert(e.conversation_id.clone(), e.seq);
                        senders.insert((e.conversation_id.clone(), e.seq), sender_id.clone());
                    }
                }
                Generated::Report(r) if r.action == ReadAction::Delivered => {
                    deliveries += 1;
                    let sent = latest.get(&r.conversation_id).copied().unwrap_or(0);
                    assert!(1 <= r.seq && r.seq <= sent, "delivered before it was sent: {r:?}");
                    let sender = &senders[&(r.conversation_id.clone(), r.seq)];
                    assert_ne!(sender, &r.user_id, "a sender's own delivery");
                }
                Generated::Report(_) => {}
            }
        }
        // Counted when queued: the last message's may still be queued.
        assert!(deliveries <= counts.deliveries && counts.deliveries - deliveries < 50);
    }

    /// Replies name a recent message of their conversation and number
    /// their thread 1, 2, 3, ...; thread reads come from members and never
    /// pass the thread's latest reply.
    #[test]
    fn replies_and_thread_reads_are_consistent() {
        let spec = WorkloadSpec {
            conversations: 300,
            max_group: 60,
            reply_share: 0.4,
            ..WorkloadSpec::default()
        };
        let (records, counts) = run(spec, 100_000);
        assert!(counts.replies > 0 && counts.thread_reads > 0, "{counts:?}");
        let mut latest: HashMap<String, i64> = HashMap::new();
        let mut threads: HashMap<(String, i64), i64> = HashMap::new();
        let mut members: HashMap<String, HashSet<String>> = HashMap::new();
        let mut thread_reads = 0;
        for record in &records {
            match record {
                Generated::Event(e) => {
                    let present = members.entry(e.conversation_id.clone()).or_default();
                    match &e.event {
                        EventRecord::MessageSent { thread: 0, .. } => {
                            latest.insert(e.conversation_id.clone(), e.seq);
                        }
                        EventRecord::MessageSent {
                            thread,
                            thread_seq,
                            sender_id,
                            ..
                        } => {
                            assert_eq!(
                                e.seq, latest[&e.conversation_id],
                                "a reply carries the latest seq"
                            );
                            assert!(1 <= *thread && *thread <= e.seq);
                            assert!(present.contains(sender_id));
                            let last = threads.entry((e.conversation_id.clone(), *thread)).or_default();
                            assert_eq!(*thread_seq, *last + 1, "thread seqs go up by one");
                            *last = *thread_seq;
                        }
                        EventRecord::MemberJoined { user_id } => {
                            present.insert(user_id.clone());
                        }
                        EventRecord::MemberLeft { user_id } => {
                            present.remove(user_id);
                        }
                    }
                }
                Generated::Report(r) if r.thread > 0 => {
                    thread_reads += 1;
                    assert!(members[&r.conversation_id].contains(&r.user_id), "{r:?}");
                    let known = threads[&(r.conversation_id.clone(), r.thread)];
                    assert!(1 <= r.seq && r.seq <= known, "{r:?}");
                }
                Generated::Report(_) => {}
            }
        }
        assert!(thread_reads > 0);
        // Of all sends, 1:1 chats' (which never reply in a thread) too.
        let replies = counts.replies as f64 / counts.sends as f64;
        assert!((0.1..0.4).contains(&replies), "reply share of sends {replies}");
    }

    #[test]
    fn sizes_are_mostly_one_to_one_with_a_heavy_tail() {
        let w = Workload::new(WorkloadSpec::default()).unwrap();
        let sizes: Vec<u32> = w.sizes().collect();
        let direct = sizes.iter().filter(|s| **s == 2).count() as f64 / sizes.len() as f64;
        assert!((0.67..0.73).contains(&direct), "{direct}");
        assert!(sizes.iter().all(|s| (2..=5000).contains(s)));
        assert!(sizes.iter().any(|s| *s >= 1000), "some groups are big");
    }

    #[test]
    fn bad_specs_are_refused_with_the_field_named() {
        let bad = WorkloadSpec {
            duplicate_share: 1.5,
            ..WorkloadSpec::default()
        };
        assert!(Workload::new(bad)
            .err()
            .unwrap()
            .to_string()
            .contains("duplicate_share"));
        let bad = WorkloadSpec {
            max_group: 2,
            ..WorkloadSpec::default()
        };
        assert!(Workload::new(bad)
            .err()
            .unwrap()
            .to_string()
            .contains("max_group"));
    }
}
