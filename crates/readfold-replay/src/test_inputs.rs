//! Fold inputs for the unit tests, built from plain strings.

use readfold_core::fold::{ConversationEvent, EventKind, Input, ReadReport};
use readfold_core::{ConversationId, Seq, UserId};

pub fn c(s: &str) -> ConversationId {
    s.parse().unwrap()
}

pub fn u(s: &str) -> UserId {
    s.parse().unwrap()
}

pub fn sent(conv: &str, sender: &str, seq: u64, at: i64) -> Input {
    Input::Event(ConversationEvent {
        conversation_id: c(conv),
        seq: Seq(seq),
        at,
        kind: EventKind::MessageSent {
            sender_id: u(sender),
            mentions: Default::default(),
        },
    })
}

/// `user` joined when the latest seq was `seq`.
pub fn joined(conv: &str, user: &str, seq: u64) -> Input {
    Input::Event(ConversationEvent {
        conversation_id: c(conv),
        seq: Seq(seq),
        at: 0,
        kind: EventKind::MemberJoined { user_id: u(user) },
    })
}

/// A public read report at event time `at`.
pub fn read(conv: &str, user: &str, seq: u64, at: i64) -> Input {
    Input::Report(ReadReport {
        conversation_id: c(conv),
        user_id: u(user),
        seq: Seq(seq),
        reported_at: at,
        private: false,
    })
}

pub fn private_read(conv: &str, user: &str, seq: u64) -> Input {
    Input::Report(ReadReport {
        conversation_id: c(conv),
        user_id: u(user),
        seq: Seq(seq),
        reported_at: 0,
        private: true,
    })
}

/// Reply `thread_seq` by `sender` in the thread of message `root`, sent when
/// the latest seq was `seq`, at `at`.
pub fn replied(conv: &str, root: u64, thread_seq: u64, sender: &str, seq: u64, at: i64) -> Input {
    Input::Event(ConversationEvent {
        conversation_id: c(conv),
        seq: Seq(seq),
        at,
        kind: EventKind::ReplySent {
            thread: Seq(root),
            thread_seq: Seq(thread_seq),
            sender_id: u(sender),
            mentions: Vec::new(),
            starter_id: None,
        },
    })
}

/// A read in the thread of message `root`, up to reply `seq`.
pub fn thread_read(conv: &str, root: u64, user: &str, seq: u64, private: bool) -> Input {
    Input::ThreadRead(readfold_core::fold::ThreadReadReport {
        conversation_id: c(conv),
        thread: Seq(root),
        user_id: u(user),
        seq: Seq(seq),
        reported_at: 0,
        private,
    })
}
