use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use readfold_core::fold::{
    ConversationEvent, DeliveryReport, EventKind, Input, PartitionState, ReadReport, UnreadMarkReport,
};
use readfold_core::{ConversationId, Seq, UserId};

use super::*;
use crate::changelog::{
    changelog_records, decode_changelog, ChangelogKind, OutRecord, OutputLayout, OutputTopics,
};

fn topics() -> OutputTopics {
    OutputTopics {
        thread_cursors: "chat.thread-cursors".into(),
        thread_state: "chat.read-thread-state".into(),
        user_thread_cursors: "chat.user-thread-cursors".into(),
        read_cursors: "public".into(),
        user_read_cursors: "own".into(),
        member_state: "state".into(),
        dlq: "dlq".into(),
        layout: OutputLayout {
            user_thread_cursors_partitions: 4,
            user_read_cursors_partitions: 1,
            dlq_partitions: 1,
        },
    }
}

fn meta(public_offset: i64, state_offset: i64) -> CheckpointMeta {
    CheckpointMeta {
        group_id: "g".into(),
        public_topic: "chat.read-cursors".into(),
        state_topic: "chat.read-member-state".into(),
        partition: 3,
        partition_count: 6,
        public_offset,
        state_offset,
        written_at_ms: 1_700_000_000_000,
        snapshotted_to: None,
    }
}

fn input(op: u8, c: u8, u: u8, seq: u8, at: u8) -> Input {
    let conversation_id: ConversationId = format!("c{}", c % 3).parse().unwrap();
    let user_id: UserId = format!("u{}", u % 4).parse().unwrap();
    let (seq, at) = (Seq(u64::from(seq % 20)), i64::from(at));
    let event = |kind| {
        Input::Event(ConversationEvent {
            conversation_id: conversation_id.clone(),
            seq,
            at,
            kind,
        })
    };
    match op % 8 {
        0 | 1 => Input::Report(ReadReport {
            conversation_id,
            user_id,
            seq: Seq(seq.get().max(1)),
            reported_at: at,
            private: false,
        }),
        2 => Input::Report(ReadReport {
            conversation_id,
            user_id,
            seq: Seq(seq.get().max(1)),
            reported_at: at,
            private: true,
        }),
        3 => Input::Mark(UnreadMarkReport {
            conversation_id,
            user_id,
            seq,
            at,
            marked: at % 2 == 0,
        }),
        4 => event(EventKind::MessageSent {
            mentions: Default::default(),
            sender_id: user_id,
        }),
        7 => Input::Delivery(DeliveryReport {
            conversation_id,
            user_id,
            seq: Seq(seq.get().max(1)),
            reported_at: at,
        }),
        5 => event(EventKind::MemberJoined { user_id }),
        _ => event(EventKind::MemberLeft { user_id }),
    }
}

/// `input`, as a client would send it: reads and marks only of messages
/// already sent (a report of an unsent seq would raise the conversation's
/// latest seq in a restore but not in the live fold, which only messages
/// raise; with events and reports in order, as here, no client sends one).
fn realistic(input: Input, live: &PartitionState) -> Input {
    let latest = |c: &ConversationId| live.conversation(c).map_or(Seq::ZERO, |conv| conv.latest_seq());
    match input {
        Input::Report(mut r) => {
            if latest(&r.conversation_id) == Seq::ZERO {
                return Input::Event(ConversationEvent {
                    conversation_id: r.conversation_id,
                    seq: r.seq,
                    at: r.reported_at,
                    kind: EventKind::MessageSent {
                        mentions: Default::default(),
                        sender_id: r.user_id,
                    },
                });
            }
            r.seq = r.seq.min(latest(&r.conversation_id));
            Input::Report(r)
        }
        Input::Mark(mut m) => {
            m.seq = m.seq.min(latest(&m.conversation_id));
            Input::Mark(m)
        }
        event => event,
    }
}

/// The changelog records of a flush of `state`, public and member-state.
fn flush(state: &mut PartitionState, public: &mut Vec<OutRecord>, private: &mut Vec<OutRecord>) {
    for change in state.drain() {
        for record in changelog_records(&change, 0, &topics()) {
            match record.topic.as_str() {
                "public" => public.push(record),
                "state" => private.push(record),
                _ => {}
            }
        }
    }
}

fn apply(state: &mut PartitionState, kind: ChangelogKind, records: &[OutRecord]) {
    for r in records {
        decode_changelog(kind, r.key.as_deref(), r.value.as_deref(), 256)
            .unwrap()
            .restore_into(state);
    }
}

/// Every member's whole state, and each conversation's latest seq.
fn exact(state: &PartitionState) -> Vec<(String, Seq, String, String)> {
    let mut out: Vec<_> = state
        .conversations()
        .flat_map(|(c, conv)| {
            conv.members()
                .map(move |(u, m)| (c.to_string(), conv.latest_seq(), u.to_string(), format!("{m:?}")))
        })
        .collect();
    out.sort();
    out
}

/// What readers are told: each conversation's present members as others
/// see them, and each member's own and membership state; apart, each
/// conversation's latest seq.
fn answers(state: &PartitionState) -> (Vec<String>, BTreeMap<String, Seq>) {
    let mut out: Vec<String> = Vec::new();
    let mut latest = BTreeMap::new();
    for (c, conv) in state.conversations() {
        let mut view: Vec<_> = conv
            .view()
            .members
            .into_iter()
            .map(|(u, m)| format!("{u}:{m:?}"))
            .collect();
        view.sort();
        out.push(format!("{c} {view:?}"));
        latest.insert(c.to_string(), conv.latest_seq());
        for (u, m) in conv.members() {
            out.push(format!(
                "{c}/{u} left={} listed={} epoch={} membership={:?} private={:?} mark={:?}",
                m.left, m.listed, m.epoch, m.membership, m.private_cursor, m.mark
            ));
        }
    }
    out.sort();
    (out, latest)
}

proptest! {
    /// A checkpoint holds the state exactly; loading it, then applying the
    /// changelogs from its offsets, tells readers what a full restore of
    /// the changelogs tells them, wherever the checkpoint was taken.
    #[test]
    fn checkpoint_plus_tail_answers_as_a_full_restore(
        before in prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>(), any::<bool>()), 0..60),
        after in prop::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>(), any::<u8>(), any::<bool>()), 0..60),
    ) {
        let (mut live, mut public, mut private) = (PartitionState::new(), Vec::new(), Vec::new());
        for &(op, c, u, seq, at, flush_now) in &before {
            let input = realistic(input(op, c, u, seq, at), &live);
            live.apply(&input);
            if flush_now {
                flush(&mut live, &mut public, &mut private);
            }
        }
        flush(&mut live, &mut public, &mut private);
        let (public_at, private_at) = (public.len(), private.len());
        let bytes = encode(&meta(public_at as i64, private_at as i64), &live).unwrap();
        let (read_meta, loaded) = decode(&bytes, 256).unwrap();
        prop_assert_eq!(read_meta, meta(public_at as i64, private_at as i64));
        prop_assert_eq!(exact(&loaded), exact(&live));
        // A restart does not decode it: the state is over the file.
        let opened = Arc::new(open(bytes, 256).unwrap());
        prop_assert_eq!(&opened.meta, &meta(public_at as i64, private_at as i64));
        let mut fast = Arc::clone(&opened).state();
        prop_assert_eq!(fast.cursor_count(), live.cursor_count());

        for &(op, c, u, seq, at, flush_now) in &after {
            let input = realistic(input(op, c, u, seq, at), &live);
            live.apply(&input);
            if flush_now {
                flush(&mut live, &mut public, &mut private);
            }
        }
        flush(&mut live, &mut public, &mut private);

        let mut full = PartitionState::new();
        apply(&mut full, ChangelogKind::ByConversation, &public);
        apply(&mut full, ChangelogKind::MemberState, &private);
        // As the restorer does: the public tail, then the stored
        // member-state of what it touched (with no public tail, nothing
        // was touched), then the member-state tail.
        let public_tail = &public[public_at..];
        apply(&mut fast, ChangelogKind::ByConversation, public_tail);
        if !public_tail.is_empty() {
            fast.restate_from_store();
        }
        apply(&mut fast, ChangelogKind::MemberState, &private[private_at..]);
        // Whole, as a stop writes it, and as the fold goes on with it.
        let (_, written) = decode(&encode(&meta(0, 0), &fast).unwrap(), 256).unwrap();
        prop_assert!(opened.check_all().is_ok());
        fast.take_all().unwrap();
        prop_assert_eq!(opened.fault(), None);
        prop_assert_eq!(exact(&written), exact(&fast));
        let ((fast_answers, fast_latest), (full_answers, full_latest)) = (answers(&fast), answers(&full));
        prop_assert_eq!(fast_answers, full_answers);
        // A leave raises the latest seq live but publishes a tombstone,
        // which carries none: the checkpoint may know a later latest seq
        // than the changelog, never an earlier one.
        prop_assert_eq!(fast_latest.keys().collect::<Vec<_>>(), full_latest.keys().collect::<Vec<_>>());
        for (c, seq) in &full_latest {
            prop_assert!(fast_latest[c] >= *seq, "{}: {:?} < {:?}", c, fast_latest[c], seq);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// What the checksums cannot catch (a file written wrong, under right
    /// checksums): lengths, counts and offsets out of range are refused as
    /// malformed, never a panic or an allocation past the file, whether the
    /// state reads it a conversation at a time or whole; whatever reads is
    /// a state that works.
    #[test]
    fn a_damaged_file_under_right_checksums_never_panics(
        edits in prop::collection::vec((any::<bool>(), any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in proptest::option::of((any::<bool>(), any::<prop::sample::Index>())),
    ) {
        let mut state = PartitionState::new();
        for i in 0..40u8 {
            state.apply(&input(i, i, i / 3, i, i));
        }
        let good = encode(&meta(1, 1), &state).unwrap();
        let (header, body) = unseal(&good).unwrap();
        let (mut header, mut body) = (header.to_vec(), body.to_vec());
        for (in_header, at, byte) in edits {
            let part = if in_header { &mut header } else { &mut body };
            let i = at.index(part.len());
            part[i] = byte;
        }
        if let Some((in_header, at)) = cut {
            let part = if in_header { &mut header } else { &mut body };
            part.truncate(at.index(part.len()));
        }
        let file = seal(&header, &body);
        if let Ok(opened) = open(file.clone(), 256) {
            let opened = Arc::new(opened);
            let mut over = Arc::clone(&opened).state();
            for i in 0..10u8 {
                over.apply(&input(i, i, i, i, i));
            }
            if let Ok(again) = encode(&opened.meta, &over) {
                prop_assert_eq!(decode_meta(&again), Ok(opened.meta.clone()));
            }
            let _ = opened.check_all();
            if over.take_all().is_ok() {
                prop_assert!(encode(&opened.meta, &over).is_ok());
            }
        }
        if let Ok((meta, state)) = decode(&file, 256) {
            prop_assert_eq!(decode_meta(&encode(&meta, &state).unwrap()), Ok(meta));
        }
    }
}

#[test]
fn the_header_round_trips_and_damage_is_detected() {
    let mut state = PartitionState::new();
    for i in 0..50u8 {
        state.apply(&input(i, i, i / 3, i, i));
    }
    let bytes = encode(&meta(42, 7), &state).unwrap();
    assert_eq!(decode_meta(&bytes).unwrap(), meta(42, 7));
    assert_eq!(exact(&decode(&bytes, 256).unwrap().1), exact(&state));
    for at in [0, 7, 20, bytes.len() / 2, bytes.len() - 5, bytes.len() - 1] {
        let mut bad = bytes.clone();
        bad[at] ^= 0x40;
        assert!(
            decode(&bad, 256).is_err(),
            "a flipped byte at {at} must be caught"
        );
    }
    for len in [0, 5, 10, bytes.len() / 2, bytes.len() - 1] {
        assert!(decode(&bytes[..len], 256).is_err(), "cut at {len}");
        assert!(open(&bytes[..len], 256).is_err(), "cut at {len}");
    }
    assert_eq!(decode(b"RFCKPTxx", 256).unwrap_err(), CheckpointError::Malformed);
    // The formats before, as an upgrade finds them: refused by their
    // version, not read as this one.
    for version in [1u16, 2, 3, 4] {
        let mut older = bytes.clone();
        older[6..8].copy_from_slice(&version.to_le_bytes());
        assert_eq!(
            decode(&older, 256).unwrap_err(),
            CheckpointError::Version(version)
        );
        assert_eq!(
            decode_meta(&older).unwrap_err(),
            CheckpointError::Version(version)
        );
    }
    assert_eq!(
        decode(b"PK\x03\x04 not ours", 256).unwrap_err(),
        CheckpointError::Magic
    );
}

/// A restart reads only the header and the pages' checksums: a damaged
/// page is found when a record first touches a conversation in it, before
/// anything of it is used, or by the check of every page run beside the
/// fold. The state then has a fault, and nothing of it may be published.
#[test]
fn a_damaged_page_is_found_when_read_and_by_the_whole_check() {
    let mut state = PartitionState::new();
    let big = |i: usize| format!("conversation-{i:04}");
    // Enough to fill several pages.
    for i in 0..400 {
        state.apply(&Input::Report(ReadReport {
            conversation_id: big(i).parse().unwrap(),
            user_id: "someone".parse().unwrap(),
            seq: Seq(i as u64 + 1),
            reported_at: 1,
            private: false,
        }));
    }
    let mut bytes = encode(&meta(1, 1), &state).unwrap();
    let (header, body) = unseal(&bytes).unwrap();
    let body_at = 12 + header.len() + 4;
    assert!(body.len() > 4 * PAGE);
    // Damage the first conversation's record.
    let at = body_at + 10;
    bytes[at] ^= 0x01;
    let opened = Arc::new(open(bytes.clone(), 256).expect("the header holds"));
    let mut over = Arc::clone(&opened).state();
    assert_eq!(over.stored_fault(), None);
    // One in a later page reads.
    over.apply(&Input::Report(ReadReport {
        conversation_id: big(399).parse().unwrap(),
        user_id: "someone".parse().unwrap(),
        seq: Seq(1),
        reported_at: 2,
        private: false,
    }));
    assert_eq!(over.stored_fault(), None);
    assert_eq!(
        opened.find(&big(399).parse().unwrap()).unwrap().unwrap().members[0]
            .1
            .cursor,
        Seq(400)
    );
    // The whole check finds the damage.
    assert_eq!(opened.check_all(), Err(CheckpointError::Checksum));
    assert!(over.stored_fault().is_some());
    assert!(encode(&meta(1, 1), &over).is_err());

    // And a touch finds it first, without the whole check.
    let opened = Arc::new(open(bytes.clone(), 256).unwrap());
    let mut over = Arc::clone(&opened).state();
    over.apply(&Input::Report(ReadReport {
        conversation_id: big(0).parse().unwrap(),
        user_id: "someone".parse().unwrap(),
        seq: Seq(1),
        reported_at: 2,
        private: false,
    }));
    assert!(over.stored_fault().is_some());
    assert!(decode(&bytes, 256).is_err());
}

/// The CQL store a checkpoint names round-trips.
#[test]
fn the_cql_store_round_trips() {
    let mut state = PartitionState::new();
    for i in 0..30u8 {
        state.apply(&input(i, i, i / 3, i, i));
    }
    let named = CheckpointMeta {
        snapshotted_to: Some("127.0.0.1:9042/readfold".into()),
        ..meta(5, 6)
    };
    let bytes = encode(&named, &state).unwrap();
    assert_eq!(decode_meta(&bytes).unwrap(), named);
    let bytes = encode(&meta(5, 6), &state).unwrap();
    assert_eq!(decode_meta(&bytes).unwrap(), meta(5, 6));
}

/// A file written wrong under right checksums, with a conversation listed
/// twice, is refused and says which.
#[test]
fn a_conversation_listed_twice_is_refused() {
    let mut state = PartitionState::new();
    for (c, u) in [("conv-a", "user-a"), ("conv-b", "user-b")] {
        state.apply_event(&ConversationEvent {
            conversation_id: ConversationId::parse(c, 64).unwrap(),
            seq: Seq::ZERO,
            at: 1,
            kind: EventKind::MemberJoined {
                user_id: UserId::parse(u, 64).unwrap(),
            },
        });
    }
    let good = encode(&meta(1, 1), &state).unwrap();
    let (header, body) = unseal(&good).unwrap();
    let mut body = body.to_vec();
    let at = body.windows(6).position(|w| w == b"conv-b").expect("in the file");
    body[at..at + 6].copy_from_slice(b"conv-a");
    assert_eq!(
        decode(&seal(header, &body), 256).map(|_| ()).unwrap_err(),
        CheckpointError::State(LoadError::RepeatedConversation(
            ConversationId::parse("conv-a", 64).unwrap()
        ))
    );
}

#[test]
fn crc32c_is_castagnolis() {
    // RFC 3720's check value and test vectors (B.4), plus the usual ones.
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c(b""), 0);
    assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
    let ascending: Vec<u8> = (0..32).collect();
    assert_eq!(crc32c(&ascending), 0x46DD_794E);
    // Every length around the eight-byte steps, the instruction's path and
    // the table's, against a byte at a time.
    let bytes: Vec<u8> = (0..100u32).map(|i| (i * 37 + 11) as u8).collect();
    for len in 0..bytes.len() {
        let bytewise = bitwise_crc(0x82F6_3B78, &bytes[..len]);
        assert_eq!(crc32c(&bytes[..len]), bytewise, "{len} bytes");
        assert_eq!(crc32c_sliced(&bytes[..len]), bytewise, "{len} bytes, by table");
    }
}

/// A CRC of `polynomial` (bits reversed) a bit at a time: the reference.
fn bitwise_crc(polynomial: u32, bytes: &[u8]) -> u32 {
    !bytes.iter().fold(!0u32, |mut c, &b| {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 { polynomial ^ (c >> 1) } else { c >> 1 };
        }
        c
    })
}

/// The fuzz target's seeds (`fuzz/corpus/decode_checkpoint`, a selector
/// byte, a header's length (u32) and a header, then a body, which the target
/// seals as the current format) decode:
/// a format change that leaves them behind would leave the fuzzer starting
/// from bodies that fail at the header.
#[test]
fn the_fuzz_seeds_are_bodies_of_the_current_format() {
    for seed in [
        &include_bytes!("../../../../fuzz/corpus/decode_checkpoint/empty")[..],
        &include_bytes!("../../../../fuzz/corpus/decode_checkpoint/state")[..],
    ] {
        assert_eq!(seed[0] & 1, 0, "sealed by the target");
        let header_len = u32::from_le_bytes(seed[1..5].try_into().unwrap()) as usize;
        let (header, body) = seed[5..].split_at(header_len);
        let file = seal(header, body);
        let max_id_bytes = 1 + usize::from(seed[0] >> 1);
        decode(&file, max_id_bytes).unwrap();
    }
}

/// Every stored conversation is found, large ones (read past a lookup's
/// first read) too, and every other id is not, wherever its search starts
/// in the index (the last buckets' searches go on at the first).
#[test]
fn every_stored_conversation_is_found_and_no_other() {
    let mut state = PartitionState::new();
    let id = |i: u32| format!("conversation-{i}");
    for i in 0..1000u32 {
        let members = if i % 100 == 0 { 40 } else { 1 + i % 3 };
        for m in 0..members {
            state.apply(&Input::Report(ReadReport {
                conversation_id: id(i).parse().unwrap(),
                user_id: format!("a-rather-long-user-id-{m}").parse().unwrap(),
                seq: Seq(u64::from(i + m + 1)),
                reported_at: 1,
                private: false,
            }));
        }
    }
    let bytes = encode(&meta(1, 1), &state).unwrap();
    let opened = open(bytes, 256).unwrap();
    for i in 0..1000 {
        let found = opened.find(&id(i).parse().unwrap()).unwrap().expect("stored");
        let held = state.conversation(&found.id).unwrap();
        assert_eq!(found.members.len(), held.len());
        for (user, member) in &found.members {
            assert_eq!(held.member(user).as_ref(), Some(member));
        }
    }
    for i in 1000..3000 {
        assert_eq!(opened.find(&id(i).parse().unwrap()).unwrap(), None);
    }
    assert_eq!(opened.fault(), None);
    assert_eq!(StoredConversations::counts(&opened), (1000, state.cursor_count()));
}
