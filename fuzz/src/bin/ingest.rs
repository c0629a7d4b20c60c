//! `validate::ingest`, the processor's whole per-record transform, on an
//! arbitrary record: kind, wire format, limits, key, value and placement all
//! come from the input. What it accepts is folded into a partition state,
//! and the changelog records of the change are read back.
//!
//! Input: `[flags][limits][partition count][partition][key length][key][value]`.
//! Flags bit 0: conversation events, else read reports; bits 1-2: format
//! (auto, plain, confluent, auto); bit 3: check_partitioning; bit 4: no key;
//! bit 5: no value; bit 6: small limits (`max_id_bytes` 1 + low nibble of
//! the limits byte, `max_seq` 2^(high nibble)), else the defaults. Partition
//! count 1 + byte % 64, partition byte % count.
//!
//! Checks: no panic, the guard's allocation bound; a record without a value
//! is `MissingValue`; a value the decoder rejects is `Decode`, and only
//! such a value; an accepted record is the input kind's, within the limits,
//! keyed by and on the partition of its conversation when partitioning is
//! checked; the fold accepts it and a flush's changelog records decode.

use readfold_core::fold::{EventKind, Input, InputKind, PartitionState};
use readfold_core::partitioner::partition_for_key;
use readfold_fuzz as fz;
use readfold_wire::changelog::{changelog_records, decode_changelog};
use readfold_wire::codec::{self, WireFormat};
use readfold_wire::validate::{ingest, Placement};
use readfold_wire::{ChangelogKind, Limits, OutputLayout, OutputTopics, RejectReason};

#[global_allocator]
static ALLOC: fz::AllocGuard = fz::AllocGuard;

fn main() {
    fz::warm_up();
    afl::fuzz!(|data: &[u8]| fz::guarded(data, run));
}

fn run(data: &[u8]) {
    let [flags, limits_byte, count, partition, rest @ ..] = data else {
        return;
    };
    let Some((key, value)) = fz::split_key(rest) else {
        return;
    };
    let kind = if flags & 1 != 0 {
        InputKind::ConversationEvents
    } else {
        InputKind::ReadReports
    };
    let format = match (flags >> 1) & 3 {
        1 => WireFormat::Plain,
        2 => WireFormat::Confluent,
        _ => WireFormat::Auto,
    };
    let mut limits = Limits {
        format,
        check_partitioning: flags & 8 != 0,
        ..fz::default_limits()
    };
    if flags & 64 != 0 {
        limits.max_id_bytes = 1 + usize::from(limits_byte & 15);
        limits.max_seq = 1 << (limits_byte >> 4);
    }
    assert_eq!(limits.check(), Ok(()));
    let partition_count = 1 + i32::from(*count % 64);
    let placement = Placement {
        key: (flags & 16 == 0).then_some(key),
        partition: i32::from(*partition) % partition_count,
        partition_count,
    };
    let value = (flags & 32 == 0).then_some(value);

    let result = ingest(kind, value, placement, &limits);

    let Some(value) = value else {
        assert_eq!(result.map_err(|r| r.reason), Err(RejectReason::MissingValue));
        return;
    };
    let decodes = match kind {
        InputKind::ReadReports => codec::decode_read_report(value, format).is_ok(),
        InputKind::ConversationEvents => codec::decode_conversation_event(value, format).is_ok(),
    };
    let input = match result {
        Err(rejection) => {
            assert_eq!(
                rejection.reason == RejectReason::Decode,
                !decodes,
                "{rejection:?}"
            );
            if !limits.check_partitioning {
                assert!(
                    !matches!(
                        rejection.reason,
                        RejectReason::KeyMismatch | RejectReason::WrongPartition
                    ),
                    "{rejection:?}"
                );
            }
            return;
        }
        Ok(input) => input,
    };
    assert!(decodes);

    let (conversation, user, seq) = match (&input, kind) {
        (Input::Report(r), InputKind::ReadReports) => (&r.conversation_id, &r.user_id, r.seq),
        (Input::Mark(m), InputKind::ReadReports) => (&m.conversation_id, &m.user_id, m.seq),
        (Input::Event(e), InputKind::ConversationEvents) => match &e.kind {
            EventKind::MessageSent { sender_id: user }
            | EventKind::MemberJoined { user_id: user }
            | EventKind::MemberLeft { user_id: user } => (&e.conversation_id, user, e.seq),
        },
        _ => panic!("{kind:?} validated into {input:?}"),
    };
    for id in [conversation.as_str(), user.as_str()] {
        assert!(!id.is_empty() && id.len() <= limits.max_id_bytes, "{id:?}");
    }
    assert!(seq.get() <= limits.max_seq);
    if limits.check_partitioning {
        let id = conversation.as_str().as_bytes();
        if let Some(key) = placement.key {
            assert_eq!(key, id);
        }
        assert_eq!(placement.partition, partition_for_key(id, partition_count));
    }

    // Fold it, and read back what a flush would write.
    let mut state = PartitionState::new();
    state.apply(&input);
    let out = OutputTopics {
        read_cursors: "c".into(),
        user_read_cursors: "u".into(),
        member_state: "m".into(),
        dlq: "d".into(),
        layout: OutputLayout {
            user_read_cursors_partitions: 3,
            dlq_partitions: 1,
        },
    };
    for change in state.drain() {
        for record in changelog_records(&change, placement.partition, &out) {
            let kind = match record.topic.as_str() {
                "c" => ChangelogKind::ByConversation,
                "u" => ChangelogKind::ByUser,
                _ => ChangelogKind::MemberState,
            };
            let entry = decode_changelog(
                kind,
                record.key.as_deref(),
                record.value.as_deref(),
                limits.max_id_bytes,
            );
            assert!(entry.is_ok(), "{kind:?} {record:?}: {entry:?}");
        }
    }
}
