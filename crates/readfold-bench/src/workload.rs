//! The chat workload the broker benches produce: 20 groups of 200 members
//! and 20,000 1:1 chats, a third of the records to the groups; each chat's
//! messages and reports move forward together (one message event per six
//! reports or so). Deterministic for a given record index sequence.

use readfold_wire::codec::{ConversationEventRecord, EventRecord, ReadAction, ReadReportRecord};

const GROUPS: u64 = 20;
const GROUP_MEMBERS: u64 = 200;
const DIRECT: u64 = 20_000;

/// One generated input record.
pub enum Generated {
    Report(ReadReportRecord),
    Event(ConversationEventRecord),
}

/// The workload's generator.
pub struct ChatWorkload {
    latest: Vec<i64>,
    rng: u64,
    /// Reports for a dedicated conversation get this prefix, so that runs
    /// on shared topics never collide.
    prefix: String,
}

impl ChatWorkload {
    pub fn new(prefix: &str) -> Self {
        ChatWorkload {
            latest: vec![0; (GROUPS + DIRECT) as usize],
            rng: 0x2545_f491_4f6c_dd1d,
            prefix: prefix.to_owned(),
        }
    }

    fn next_random(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// The next record, stamped `at` (epoch ms).
    pub fn next(&mut self, at: i64) -> Generated {
        let r = self.next_random();
        let chat = if r.is_multiple_of(3) {
            r / 3 % GROUPS
        } else {
            GROUPS + r / 3 % DIRECT
        } as usize;
        let members = if chat < GROUPS as usize { GROUP_MEMBERS } else { 2 };
        let conversation = format!("{}chat-{chat}", self.prefix);
        let user = format!("user-{chat}-{}", self.next_random() % members);
        if self.next_random().is_multiple_of(7) || self.latest[chat] == 0 {
            self.latest[chat] += 1;
            Generated::Event(ConversationEventRecord {
                conversation_id: conversation,
                seq: self.latest[chat],
                at,
                event: EventRecord::MessageSent {
                    starter_id: None,
                    thread: 0,
                    thread_seq: 0,
                    mention_all: false,
                    mentions: Default::default(),
                    sender_id: user,
                },
            })
        } else {
            Generated::Report(ReadReportRecord {
                thread: 0,
                muted_until: None,
                conversation_id: conversation,
                user_id: user,
                seq: self.latest[chat],
                device_id: None,
                reported_at: at,
                private: false,
                action: ReadAction::Read,
            })
        }
    }
}
