//! The stage's two inputs, read into what the pure state takes.

use readfold_kafka::queue_batch::QueuedMessage;

use readfold_core::badge::{Badges, MarkRead, OwnConversation, OwnThread};
use readfold_core::partitioner::partition_for_key;
use readfold_core::{ConversationId, Seq, UserId};
use readfold_wire::badge::{decode_user_action, UserActionKind};
use readfold_wire::changelog::{decode_changelog, ChangelogEntry, ChangelogKind, OwnUpdate, ThreadEntry};
use readfold_wire::codec::{encode_read_report, ReadAction, ReadReportRecord};
use readfold_wire::{validate, OutRecord, RejectReason, Rejection};

use crate::BadgeSettings;

/// One input record, read.
pub(crate) enum Input {
    /// A by-user changelog record: the member's view, `None` once they left.
    Own {
        user: UserId,
        conversation: ConversationId,
        view: Option<OwnConversation>,
    },
    /// A by-user thread changelog record: the follower's view of one
    /// thread, `None` once they left the conversation.
    OwnThread {
        user: UserId,
        conversation: ConversationId,
        thread: Seq,
        view: Option<OwnThread>,
    },
    MarkAllRead {
        user: UserId,
        at: i64,
    },
    Rejected(Rejection),
}

/// What applying a record asks the stage to send.
pub(crate) enum Applied {
    Nothing,
    /// Reports for the first stage's input.
    MarkAllRead(Vec<Report>),
    Rejected(Rejection),
}

impl Input {
    pub(crate) fn read(
        settings: &BadgeSettings,
        message: &QueuedMessage<'_>,
        action_partitions: i32,
    ) -> Input {
        if message.topic == settings.topics.user_read_cursors {
            return Input::read_own(settings, message.key, message.payload);
        }
        if message.topic == settings.topics.user_thread_cursors {
            return Input::read_own_thread(settings, message.key, message.payload);
        }
        let reject = |reason, detail: String| Input::Rejected(Rejection { reason, detail });
        let Some(value) = message.payload else {
            return reject(RejectReason::MissingValue, "a user action without a value".into());
        };
        let action = match decode_user_action(value, settings.input.format) {
            Ok(action) => action,
            Err(e) => return reject(RejectReason::Decode, e.to_string()),
        };
        let user = match validate::id("user_id", &action.user_id, &settings.input, UserId::parse) {
            Ok(user) => user,
            Err(rejection) => return Input::Rejected(rejection),
        };
        // The user's state lives on murmur2(user_id)'s partition only.
        let placed = partition_for_key(user.as_str().as_bytes(), action_partitions);
        if settings.input.check_partitioning && placed != message.partition {
            return reject(
                RejectReason::WrongPartition,
                format!(
                    "user {:?} belongs on partition {placed}, not {}",
                    user.as_str(),
                    message.partition
                ),
            );
        }
        match action.action {
            UserActionKind::MarkAllRead => Input::MarkAllRead { user, at: action.at },
        }
    }

    /// A record of the by-user changelog, read.
    pub(crate) fn read_own(settings: &BadgeSettings, key: Option<&[u8]>, value: Option<&[u8]>) -> Input {
        let reject = |detail: String| {
            Input::Rejected(Rejection {
                reason: RejectReason::Decode,
                detail,
            })
        };
        let entry = decode_changelog(ChangelogKind::ByUser, key, value, settings.input.max_id_bytes);
        match entry {
            Ok(ChangelogEntry::Own(own)) => Input::Own {
                user: own.update.user_id.clone(),
                conversation: own.update.conversation_id.clone(),
                view: Some(view(&own)),
            },
            Ok(ChangelogEntry::Left(key)) => Input::Own {
                user: key.user_id,
                conversation: key.conversation_id,
                view: None,
            },
            Ok(_) => reject("not a by-user changelog record".into()),
            Err(e) => reject(e.to_string()),
        }
    }

    /// A record of the by-user thread changelog, read.
    pub(crate) fn read_own_thread(
        settings: &BadgeSettings,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Input {
        let entry = decode_changelog(
            ChangelogKind::ThreadByUser,
            key,
            value,
            settings.input.max_id_bytes,
        );
        let reject = |detail: String| {
            Input::Rejected(Rejection {
                reason: RejectReason::Decode,
                detail,
            })
        };
        match entry {
            Ok(ChangelogEntry::Thread(ThreadEntry::Cursor(c))) => Input::OwnThread {
                view: Some(OwnThread {
                    latest_seq: c.latest_seq,
                    read_up_to: c.cursor.max(c.private_cursor.unwrap_or_default()),
                }),
                user: c.key.user_id,
                conversation: c.key.conversation_id,
                thread: c.key.thread,
            },
            Ok(ChangelogEntry::Thread(ThreadEntry::Left(key))) => Input::OwnThread {
                user: key.user_id,
                conversation: key.conversation_id,
                thread: key.thread,
                view: None,
            },
            Ok(_) => reject("not a by-user thread changelog record".into()),
            Err(e) => reject(e.to_string()),
        }
    }

    /// Folds the record live, at `now_ms`.
    pub(crate) fn apply(self, badges: &mut Badges, now_ms: i64) -> Applied {
        match self {
            Input::Own {
                user,
                conversation,
                view,
            } => {
                badges.apply(&user, &conversation, view, now_ms);
                Applied::Nothing
            }
            Input::OwnThread {
                user,
                conversation,
                thread,
                view,
            } => {
                badges.apply_thread(&user, &conversation, thread, view);
                Applied::Nothing
            }
            Input::MarkAllRead { user, at } => Applied::MarkAllRead(
                badges
                    .mark_all_read(&user)
                    .into_iter()
                    .flat_map(|m| Report::of(&user, m, at))
                    .collect(),
            ),
            Input::Rejected(rejection) => Applied::Rejected(rejection),
        }
    }

    /// Folds the record as a restore does: the state it made when it was
    /// published at `at`; nothing is sent.
    pub(crate) fn restore(self, badges: &mut Badges, at: i64) {
        if matches!(self, Input::Own { .. } | Input::OwnThread { .. }) {
            self.apply(badges, at);
        }
    }
}

/// The member's own view as the badge counts it.
fn view(own: &OwnUpdate) -> OwnConversation {
    let read_up_to = own.update.cursor.max(own.private_cursor);
    let unread = own.update.latest_seq.get().saturating_sub(read_up_to.get());
    OwnConversation {
        unread: if own.unread_mark { unread.max(1) } else { unread },
        marked_unread: own.unread_mark,
        unread_mentions: own.unread_mentions,
        muted_until: own.muted_until,
        latest_seq: own.update.latest_seq,
        read_up_to,
    }
}

/// A read report (or a clear of a mark) a mark-all-read sends.
pub(crate) struct Report(ReadReportRecord);

impl Report {
    fn of(user: &UserId, m: MarkRead, at: i64) -> Vec<Report> {
        let record = |action, seq: Seq| {
            Report(ReadReportRecord {
                thread: m.thread.map_or(0, |t| t.get() as i64),
                conversation_id: m.conversation_id.to_string(),
                user_id: user.to_string(),
                seq: seq.get() as i64,
                device_id: Some("mark-all-read".into()),
                reported_at: at,
                private: false,
                action,
                muted_until: None,
            })
        };
        let mut out = Vec::new();
        if let Some(seq) = m.seq {
            out.push(record(ReadAction::Read, seq));
        }
        if m.clear_mark {
            out.push(record(ReadAction::ClearUnreadMark, m.seq.unwrap_or(Seq::ZERO)));
        }
        out
    }

    /// The record for the read-reports topic, placed as the first stage
    /// expects: keyed and partitioned by conversation.
    pub(crate) fn into_record(self, topic: &str, partitions: i32) -> OutRecord {
        let key = self.0.conversation_id.as_bytes().to_vec();
        OutRecord {
            topic: topic.to_owned(),
            partition: partition_for_key(&key, partitions),
            key: Some(key),
            value: Some(encode_read_report(&self.0)),
            headers: Vec::new(),
        }
    }
}
