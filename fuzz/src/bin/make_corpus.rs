//! Writes the seed corpora, `corpus/<target>/`, from the crate's own
//! encoders: a few valid records of each kind (plain, framed and v1.0), laid
//! out as each target reads its input. Run from `fuzz/` (see README.md);
//! rewrites the files it names and leaves others alone.

use std::fs;
use std::path::Path;

use readfold_core::fold::{
    ConversationEvent, EventKind, Input, PartitionState, ReadReport, UnreadMarkReport,
};
use readfold_core::Seq;
use readfold_fuzz::join_key;
use readfold_wire::checkpoint::{self, CheckpointMeta};
use readfold_wire::codec::{self, *};

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new("corpus").join(target);
    fs::create_dir_all(&dir).expect("create corpus dir");
    fs::write(dir.join(name), bytes).expect("write seed");
}

fn main() {
    let report = ReadReportRecord {
        conversation_id: "G".into(),
        user_id: "alice".into(),
        seq: 42,
        device_id: Some("phone".into()),
        reported_at: 1_700_000_000_000,
        private: false,
        action: ReadAction::Read,
    };
    let mark = ReadReportRecord {
        device_id: None,
        seq: 0,
        private: true,
        action: ReadAction::MarkUnread,
        ..report.clone()
    };
    let reports = [
        ("read", codec::encode_read_report(&report)),
        ("mark", codec::encode_read_report(&mark)),
        ("framed", frame_confluent(7, &codec::encode_read_report(&report))),
        ("v1_0", codec::encode_historic_read_report(&report)),
    ];
    for (name, bytes) in &reports {
        write("decode_read_report", name, bytes);
    }

    let event = |event| ConversationEventRecord {
        conversation_id: "G".into(),
        seq: 3,
        at: 1_700_000_000_000,
        event,
    };
    let events = [
        (
            "sent",
            codec::encode_conversation_event(&event(EventRecord::MessageSent {
                sender_id: "bob".into(),
            })),
        ),
        (
            "joined",
            codec::encode_conversation_event(&event(EventRecord::MemberJoined {
                user_id: "carol".into(),
            })),
        ),
        (
            "left_framed",
            frame_confluent(
                1,
                &codec::encode_conversation_event(&event(EventRecord::MemberLeft {
                    user_id: "dave".into(),
                })),
            ),
        ),
    ];
    for (name, bytes) in &events {
        write("decode_conversation_event", name, bytes);
    }

    let key = codec::encode_cursor_key(&CursorKeyRecord {
        conversation_id: "G".into(),
        user_id: "alice".into(),
    });
    let user_key = codec::encode_user_cursor_key(&UserCursorKeyRecord {
        user_id: "alice".into(),
        conversation_id: "G".into(),
    });
    let update = CursorUpdateRecord {
        conversation_id: "G".into(),
        user_id: "alice".into(),
        cursor: 5,
        join_seq: 1,
        latest_seq: 6,
        updated_at: 1_700_000_000_000,
        private_cursor: None,
        unread_mark: None,
    };
    let own = CursorUpdateRecord {
        private_cursor: Some(6),
        unread_mark: Some(true),
        ..update.clone()
    };
    let state = MemberStateRecord {
        conversation_id: "G".into(),
        user_id: "alice".into(),
        private_cursor: 6,
        mark_at: Some(1_700_000_000_000),
        mark_seq: Some(5),
        left: false,
        membership_seq: Some(0),
        membership_at: Some(1_699_000_000_000),
        epoch: 1,
        updated_at: 1_700_000_000_000,
    };
    // [selector][key length][key][value]; selector 0 by-conversation,
    // 1 by-user, 2 member-state, 8 (bit 3) a tombstone.
    let changelog = |selector: u8, key: &[u8], value: &[u8]| {
        let mut out = vec![selector];
        out.extend(join_key(key, value));
        out
    };
    write(
        "decode_changelog",
        "upsert",
        &changelog(0, &key, &codec::encode_cursor_update(&update)),
    );
    write(
        "decode_changelog",
        "upsert_v1_0",
        &changelog(0, &key, &codec::encode_historic_cursor_update(&update)),
    );
    write(
        "decode_changelog",
        "own",
        &changelog(1, &user_key, &codec::encode_cursor_update(&own)),
    );
    write(
        "decode_changelog",
        "state",
        &changelog(2, &key, &codec::encode_member_state(&state)),
    );
    write("decode_changelog", "tombstone", &changelog(8, &key, &[]));

    // [flags][limits][partition count][partition][key length][key][value];
    // flags bit 0 events, bit 3 check_partitioning (partition 0 of 1 is
    // always right), bits 1-2 the format.
    let ingest = |flags: u8, value: &[u8]| {
        let mut out = vec![flags, 0, 0, 0];
        out.extend(join_key(b"G", value));
        out
    };
    write("ingest", "read", &ingest(8, &reports[0].1));
    write("ingest", "mark_plain", &ingest(8 | 2, &reports[1].1));
    write("ingest", "read_confluent", &ingest(8 | 4, &reports[2].1));
    write("ingest", "sent", &ingest(8 | 1, &events[0].1));
    write("ingest", "joined", &ingest(1, &events[1].1));

    // [selector][header length][header][body]: selector 0x40 seals them
    // (bit 0 clear) and allows ids of 33 bytes.
    let mut state = PartitionState::new();
    for input in [
        Input::Event(ConversationEvent {
            conversation_id: "G".parse().unwrap(),
            seq: Seq(0),
            at: 1,
            kind: EventKind::MemberJoined {
                user_id: "alice".parse().unwrap(),
            },
        }),
        Input::Event(ConversationEvent {
            conversation_id: "G".parse().unwrap(),
            seq: Seq(3),
            at: 2,
            kind: EventKind::MessageSent {
                sender_id: "bob".parse().unwrap(),
            },
        }),
        Input::Report(ReadReport {
            conversation_id: "G".parse().unwrap(),
            user_id: "alice".parse().unwrap(),
            seq: Seq(2),
            reported_at: 3,
            private: true,
        }),
        Input::Mark(UnreadMarkReport {
            conversation_id: "G".parse().unwrap(),
            user_id: "alice".parse().unwrap(),
            seq: Seq(2),
            at: 4,
            marked: true,
        }),
    ] {
        state.apply(&input);
    }
    let meta = CheckpointMeta {
        group_id: "readfold".into(),
        public_topic: "chat.read-cursors".into(),
        state_topic: "chat.member-state".into(),
        partition: 0,
        partition_count: 3,
        public_offset: 10,
        state_offset: 4,
        written_at_ms: 1_700_000_000_000,
        snapshotted_to: None,
    };
    for (name, state) in [("state", state), ("empty", PartitionState::new())] {
        let file = checkpoint::encode(&meta, &state).expect("a state in memory");
        let (header, body) = checkpoint::unseal(&file).expect("a file just written");
        let mut seed = vec![0x40];
        seed.extend_from_slice(&(header.len() as u32).to_le_bytes());
        seed.extend_from_slice(header);
        seed.extend_from_slice(body);
        write("decode_checkpoint", name, &seed);
    }
}
