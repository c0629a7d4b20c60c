use super::*;

fn report() -> ReadReportRecord {
    ReadReportRecord {
        thread: 0,
        muted_until: None,
        conversation_id: "G".into(),
        user_id: "alice".into(),
        seq: 42,
        device_id: Some("phone".into()),
        reported_at: 1_700_000_000_000,
        private: false,
        action: ReadAction::Read,
    }
}

#[test]
fn every_schema_parses_with_the_documented_field_order() {
    let names = |schema: &Schema| match schema {
        Schema::Record(r) => r.fields.iter().map(|f| f.name.clone()).collect::<Vec<_>>(),
        _ => panic!("not a record"),
    };
    let s = schemas();
    assert_eq!(
        names(&s.read_report),
        [
            "conversation_id",
            "user_id",
            "seq",
            "device_id",
            "reported_at",
            "private",
            "action",
            "muted_until",
            "thread"
        ]
    );
    assert_eq!(
        names(&s.conversation_event),
        ["conversation_id", "seq", "at", "event"]
    );
    assert_eq!(names(&s.cursor_key), ["conversation_id", "user_id"]);
    assert_eq!(names(&s.user_cursor_key), ["user_id", "conversation_id"]);
    assert_eq!(
        names(&s.cursor_update),
        [
            "conversation_id",
            "user_id",
            "cursor",
            "join_seq",
            "latest_seq",
            "updated_at",
            "private_cursor",
            "unread_mark",
            "delivered_cursor",
            "unread_mentions",
            "muted_until"
        ]
    );
    assert_eq!(
        names(&s.member_state)[10..],
        ["mentions", "mute_at", "muted_until"]
    );
}

#[test]
fn read_report_round_trips_plain_and_confluent() {
    let bytes = encode_read_report(&report());
    assert_eq!(decode_read_report(&bytes, WireFormat::Auto).unwrap(), report());
    assert_eq!(decode_read_report(&bytes, WireFormat::Plain).unwrap(), report());
    let framed = frame_confluent(7, &bytes);
    assert_eq!(decode_read_report(&framed, WireFormat::Auto).unwrap(), report());
    assert_eq!(
        decode_read_report(&framed, WireFormat::Confluent).unwrap(),
        report()
    );
    let no_device = ReadReportRecord {
        device_id: None,
        private: true,
        action: ReadAction::Read,
        ..report()
    };
    let bytes = encode_read_report(&no_device);
    assert_eq!(decode_read_report(&bytes, WireFormat::Auto).unwrap(), no_device);
}

#[test]
fn conversation_events_round_trip_every_branch() {
    for event in [
        EventRecord::MessageSent {
            starter_id: None,
            thread: 0,
            thread_seq: 0,
            mention_all: false,
            mentions: Default::default(),
            sender_id: "a".into(),
        },
        EventRecord::MemberJoined { user_id: "b".into() },
        EventRecord::MemberLeft { user_id: "c".into() },
    ] {
        let record = ConversationEventRecord {
            conversation_id: "G".into(),
            seq: 3,
            at: 9,
            event,
        };
        let bytes = encode_conversation_event(&record);
        assert_eq!(
            decode_conversation_event(&bytes, WireFormat::Auto).unwrap(),
            record
        );
        let framed = frame_confluent(1, &bytes);
        assert_eq!(
            decode_conversation_event(&framed, WireFormat::Confluent).unwrap(),
            record
        );
    }
}

#[test]
fn changelog_records_round_trip() {
    let key = CursorKeyRecord {
        conversation_id: "G".into(),
        user_id: "u".into(),
    };
    assert_eq!(decode_cursor_key(&encode_cursor_key(&key)).unwrap(), key);
    let ukey = UserCursorKeyRecord {
        user_id: "u".into(),
        conversation_id: "G".into(),
    };
    assert_eq!(
        decode_user_cursor_key(&encode_user_cursor_key(&ukey)).unwrap(),
        ukey
    );
    let update = CursorUpdateRecord {
        muted_until: None,
        unread_mentions: None,
        conversation_id: "G".into(),
        user_id: "u".into(),
        cursor: 5,
        join_seq: 1,
        latest_seq: 6,
        updated_at: 123,
        private_cursor: None,
        unread_mark: None,
        delivered_cursor: None,
    };
    assert_eq!(
        decode_cursor_update(&encode_cursor_update(&update)).unwrap(),
        update
    );
}

#[test]
fn keys_encode_deterministically_for_compaction() {
    let key = CursorKeyRecord {
        conversation_id: "G".into(),
        user_id: "u".into(),
    };
    // Avro binary: zigzag length + UTF-8, per field.
    assert_eq!(encode_cursor_key(&key), vec![2, b'G', 2, b'u']);
}

#[test]
fn rejects_garbage_without_panicking() {
    let cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xff; 3],
        vec![0, 0, 0, 1],
        b"hello world, not avro".to_vec(),
        vec![0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
        // A length prefix claiming ~1 GB.
        vec![0xfe, 0xff, 0xff, 0xff, 0x07, b'x'],
    ];
    for bytes in cases {
        assert!(decode_read_report(&bytes, WireFormat::Auto).is_err(), "{bytes:?}");
        assert!(
            decode_conversation_event(&bytes, WireFormat::Auto).is_err(),
            "{bytes:?}"
        );
    }
}

#[test]
fn confluent_format_requires_magic_zero() {
    let bytes = frame_confluent(1, &encode_read_report(&report()));
    let mut wrong = bytes.clone();
    wrong[0] = 1;
    assert_eq!(
        decode_read_report(&wrong, WireFormat::Confluent),
        Err(DecodeError::BadMagic(1))
    );
    assert!(decode_read_report(&wrong, WireFormat::Auto).is_err());
}

#[test]
fn trailing_bytes_are_rejected() {
    let mut bytes = encode_read_report(&report());
    bytes.push(0);
    assert!(matches!(
        decode_read_report(&bytes, WireFormat::Plain),
        Err(DecodeError::TrailingBytes(1))
    ));
}

/// v1.2 appends symbols to the action enum and `muted_until`: what a v1.1
/// producer writes is a v1.2 record cut before `muted_until`, and reads
/// (by the fast decoder too) with it null.
#[test]
fn v1_1_read_reports_read_as_v1_2_read_reports() {
    let schema = Schema::parse_str(READ_REPORT_V1_1_AVSC).unwrap();
    let v1_1 = GenericDatumWriter::builder(&schema).build().unwrap();
    for action in [
        ReadAction::Read,
        ReadAction::MarkUnread,
        ReadAction::ClearUnreadMark,
    ] {
        let record = ReadReportRecord { action, ..report() };
        let mut value = record.to_value();
        if let Value::Record(fields) = &mut value {
            fields.retain(|(name, _)| name != "muted_until" && name != "thread");
        }
        let old = v1_1.write_value_to_vec(value).unwrap();
        let new = encode_read_report(&record);
        // A null union and a zero long: one byte each.
        assert_eq!(old, new[..new.len() - 2]);
        assert_eq!(old, encode_v1_1_read_report(&record));
        assert!(matches!(
            decode_read_report_view(&old, WireFormat::Auto),
            Ok(Decoded::Borrowed(_))
        ));
        assert_eq!(decode_read_report(&old, WireFormat::Auto).unwrap(), record);
    }
    let muted = ReadReportRecord {
        action: ReadAction::Mute,
        muted_until: Some(1_700_000_000_000),
        ..report()
    };
    let bytes = encode_read_report(&muted);
    assert_eq!(decode_read_report(&bytes, WireFormat::Auto).unwrap(), muted);
    let delivered = ReadReportRecord {
        action: ReadAction::Delivered,
        ..report()
    };
    let bytes = encode_read_report(&delivered);
    assert_eq!(decode_read_report(&bytes, WireFormat::Auto).unwrap(), delivered);
}

#[test]
fn v1_0_records_still_decode_with_the_added_fields_at_their_defaults() {
    let old = encode_historic_read_report(&report());
    assert!(old.len() < encode_read_report(&report()).len());
    assert_eq!(decode_read_report(&old, WireFormat::Auto).unwrap(), report());
    let framed = frame_confluent(1, &old);
    assert_eq!(
        decode_read_report(&framed, WireFormat::Confluent).unwrap(),
        report()
    );
    let update = CursorUpdateRecord {
        muted_until: None,
        unread_mentions: None,
        conversation_id: "G".into(),
        user_id: "u".into(),
        cursor: 5,
        join_seq: 1,
        latest_seq: 6,
        updated_at: 123,
        private_cursor: None,
        unread_mark: None,
        delivered_cursor: None,
    };
    let old = encode_historic_cursor_update(&update);
    assert_eq!(decode_cursor_update(&old).unwrap(), update);
    // Every version's conversation and latest seq read without the record.
    let full = CursorUpdateRecord {
        private_cursor: Some(6),
        unread_mark: Some(true),
        delivered_cursor: Some(6),
        unread_mentions: Some(2),
        muted_until: Some(9),
        ..update.clone()
    };
    for bytes in [old, encode_v1_1_cursor_update(&full), encode_cursor_update(&full)] {
        assert_eq!(cursor_update_latest(&bytes), Some(("G", 6)));
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(cursor_update_latest(&longer), None);
        assert_eq!(cursor_update_latest(&bytes[..bytes.len() - 1]), None);
    }
}

#[test]
fn v1_1_fields_round_trip() {
    let mark = ReadReportRecord {
        action: ReadAction::ClearUnreadMark,
        private: true,
        ..report()
    };
    assert_eq!(
        decode_read_report(&encode_read_report(&mark), WireFormat::Auto).unwrap(),
        mark
    );
    let own = CursorUpdateRecord {
        muted_until: None,
        unread_mentions: None,
        conversation_id: "G".into(),
        user_id: "u".into(),
        cursor: 5,
        join_seq: 1,
        latest_seq: 6,
        updated_at: 123,
        private_cursor: Some(6),
        unread_mark: Some(true),
        delivered_cursor: None,
    };
    assert_eq!(decode_cursor_update(&encode_cursor_update(&own)).unwrap(), own);
    let state = MemberStateRecord {
        mentions: Default::default(),
        mute_at: None,
        muted_until: None,
        conversation_id: "G".into(),
        user_id: "u".into(),
        private_cursor: 9,
        mark_at: Some(100),
        mark_seq: None,
        left: true,
        membership_seq: Some(4),
        membership_at: Some(50),
        epoch: 3,
        updated_at: 7,
    };
    assert_eq!(decode_member_state(&encode_member_state(&state)).unwrap(), state);
}

/// The largest allocation each test thread has made since it last asked,
/// for the tests that a decoder allocates no more than its input warrants.
mod largest_allocation {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static LARGEST: Cell<usize> = const { Cell::new(0) };
    }

    struct Tracking;

    fn note(size: usize) {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
    }

    unsafe impl GlobalAlloc for Tracking {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            note(new_size);
            unsafe { System.realloc(ptr, layout, new_size) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[global_allocator]
    static TRACKING: Tracking = Tracking;

    /// The largest allocation of this thread since the last call.
    pub fn take() -> usize {
        LARGEST.with(|l| l.replace(0))
    }
}

/// Found by `fuzz/` (target decode_read_report, the allocation guard): a
/// length prefix larger than the record can make the generic reader
/// allocate and zero that many bytes, up to `MAX_AVRO_ALLOCATION`, before
/// finding them missing. Every decoder rejects such bytes allocating no
/// more than a few kilobytes.
#[test]
fn a_length_prefix_beyond_the_record_allocates_nothing_near_it() {
    // Readers and schemas are the process's: built before measuring.
    let _ = decode_read_report(&encode_read_report(&report()), WireFormat::Plain);
    let _ = (
        decode_conversation_event(b"", WireFormat::Plain),
        decode_cursor_key(b""),
    );
    let _ = (
        decode_user_cursor_key(b""),
        decode_cursor_update(b""),
        decode_member_state(b""),
    );
    // 8 MiB and 16 MiB (zigzag varints), each followed by one byte.
    let eight = [0x80, 0x80, 0x80, 0x08, b'x'];
    let sixteen = [0x80, 0x80, 0x80, 0x10, b'x'];
    // A valid first string, then a user id claiming 16 MiB.
    let second = [0x02, b'G', 0x80, 0x80, 0x80, 0x10, b'u'];
    // A read report whose device id claims 9 MiB.
    let device = [0x02, b'G', 0x02, b'u', 0x02, 0x02, 0x80, 0x80, 0x80, 0x09, b'p'];
    // The fuzzer's, minimized: a Confluent frame whose first string claims
    // 401,023 bytes.
    let found = [0x00, 0x30, 0x30, 0x30, 0x30, 0xfe, 0xf9, 0x30];
    // Whether each decoder rejects the bytes (some are valid records of
    // another schema: `device` is a v1.0 CursorUpdate).
    type Rejects = fn(&[u8]) -> bool;
    let decoders: [(&str, Rejects); 8] = [
        ("read report", |b| {
            decode_read_report(b, WireFormat::Plain).is_err()
        }),
        ("auto read report", |b| {
            decode_read_report(b, WireFormat::Auto).is_err()
        }),
        ("framed read report", |b| {
            decode_read_report(&frame_confluent(1, b), WireFormat::Confluent).is_err()
        }),
        ("conversation event", |b| {
            decode_conversation_event(b, WireFormat::Auto).is_err()
        }),
        ("cursor key", |b| decode_cursor_key(b).is_err()),
        ("user cursor key", |b| decode_user_cursor_key(b).is_err()),
        ("cursor update", |b| decode_cursor_update(b).is_err()),
        ("member state", |b| decode_member_state(b).is_err()),
    ];
    for bytes in [&eight[..], &sixteen, &second, &device, &found] {
        for (name, rejects) in decoders {
            largest_allocation::take();
            let rejected = rejects(bytes);
            let largest = largest_allocation::take();
            assert!(largest < 4096, "{name}: {largest} bytes allocated for {bytes:?}");
            if bytes != device {
                assert!(rejected, "{name}: {bytes:?}");
            }
        }
    }
    let error = decode_read_report(&sixteen, WireFormat::Plain)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("length prefix of 16777216 bytes where 1 are left"),
        "{error}"
    );
}

/// Found by `fuzz/` (target decode_changelog, the hand-written decoder held
/// to the generic reader): apache-avro reads a union index, a boolean or a
/// string that the bytes end before as null, so a CursorUpdate cut short
/// inside `unread_mark` would decode, as `unread_mark: None`. A record cut
/// short is an error; an earlier version's record (none of the later
/// fields at all) still decodes.
#[test]
fn a_record_cut_short_does_not_decode() {
    let own = CursorUpdateRecord {
        conversation_id: "G".into(),
        user_id: "u".into(),
        cursor: 5,
        join_seq: 1,
        latest_seq: 6,
        updated_at: 123,
        private_cursor: Some(6),
        unread_mark: Some(true),
        delivered_cursor: Some(6),
        unread_mentions: Some(3),
        muted_until: Some(7),
    };
    let bytes = encode_cursor_update(&own);
    // Cut inside or between v1.2's fields, inside the mark's boolean, and
    // before its union index. (Without all of v1.2's fields, it is the
    // version before: see below.)
    for cut in [1, 2, 3, 4, 5, 7, 8] {
        let short = &bytes[..bytes.len() - cut];
        assert!(decode_cursor_update(short).is_err(), "{short:?}");
    }
    // The fuzzer's, as it found it.
    let found = [
        0x0a, 0x02, 0x0a, 0x61, 0x6c, 0x65, 0x02, 0x47, 0x02, 0x47, 0x0c, 0x80, 0xa0, 0xa0, 0xab, 0xfe, 0xf9,
        0x62, 0x02, 0x0c, 0x02,
    ];
    assert!(decode_cursor_update(&found).is_err());
    let old = encode_historic_cursor_update(&own);
    let expected = CursorUpdateRecord {
        private_cursor: None,
        unread_mark: None,
        delivered_cursor: None,
        unread_mentions: None,
        muted_until: None,
        ..own.clone()
    };
    assert_eq!(decode_cursor_update(&old), Ok(expected));
    let v1_1 = encode_v1_1_cursor_update(&own);
    assert_eq!(v1_1.as_slice(), &bytes[..bytes.len() - 6]);
    let expected = CursorUpdateRecord {
        delivered_cursor: None,
        unread_mentions: None,
        muted_until: None,
        ..own
    };
    assert_eq!(decode_cursor_update(&v1_1), Ok(expected));
    // A string cut short at the end of a key.
    assert!(decode_cursor_key(&[0x02, b'G', 0x04, b'u']).is_err());
}

/// Mentions (v1.2) on a message; a v1.0 message, without them, still reads
/// by both decoders. The same for a v1.0 member-state record.
#[test]
fn v1_0_events_and_member_states_read_with_no_mentions() {
    let record = ConversationEventRecord {
        conversation_id: "G".into(),
        seq: 4,
        at: 9,
        event: EventRecord::MessageSent {
            starter_id: None,
            thread: 0,
            thread_seq: 0,
            sender_id: "a".into(),
            mentions: vec!["b".into(), "c".into()],
            mention_all: true,
        },
    };
    let bytes = encode_conversation_event(&record);
    assert_eq!(
        decode_conversation_event(&bytes, WireFormat::Auto).unwrap(),
        record
    );
    let old = encode_historic_conversation_event(&record);
    let plain = ConversationEventRecord {
        event: EventRecord::MessageSent {
            starter_id: None,
            thread: 0,
            thread_seq: 0,
            sender_id: "a".into(),
            mentions: Vec::new(),
            mention_all: false,
        },
        ..record
    };
    assert!(matches!(
        decode_conversation_event_view(&old, WireFormat::Auto),
        Ok(Decoded::Borrowed(_))
    ));
    assert_eq!(decode_conversation_event(&old, WireFormat::Auto).unwrap(), plain);
    let state = MemberStateRecord {
        conversation_id: "G".into(),
        user_id: "b".into(),
        private_cursor: 3,
        mark_at: None,
        mark_seq: None,
        left: false,
        membership_seq: Some(0),
        membership_at: Some(1),
        epoch: 1,
        updated_at: 7,
        mentions: vec![4, 9],
        mute_at: Some(5),
        muted_until: Some(i64::MAX),
    };
    assert_eq!(decode_member_state(&encode_member_state(&state)).unwrap(), state);
    let old = encode_historic_member_state(&state);
    let expected = MemberStateRecord {
        mentions: Vec::new(),
        mute_at: None,
        muted_until: None,
        ..state
    };
    assert_eq!(decode_member_state(&old).unwrap(), expected);
}

/// v1.3 appends `thread` to reports and the thread fields to `MessageSent`:
/// what a v1.2 producer writes is a v1.3 record cut before them, and reads
/// (by the fast decoder too) as a report or message of the conversation.
#[test]
fn v1_2_records_read_as_v1_3_records_of_the_conversation() {
    let record = ReadReportRecord {
        action: ReadAction::Mute,
        muted_until: Some(5),
        ..report()
    };
    let old = encode_v1_2_read_report(&record);
    let new = encode_read_report(&record);
    assert_eq!(old, new[..new.len() - 1]);
    assert!(matches!(
        decode_read_report_view(&old, WireFormat::Auto),
        Ok(Decoded::Borrowed(_))
    ));
    assert_eq!(decode_read_report(&old, WireFormat::Auto).unwrap(), record);

    let message = ConversationEventRecord {
        conversation_id: "G".into(),
        seq: 7,
        at: 1,
        event: EventRecord::MessageSent {
            sender_id: "bob".into(),
            mentions: vec!["alice".into()],
            mention_all: false,
            thread: 0,
            thread_seq: 0,
            starter_id: None,
        },
    };
    let old = encode_v1_2_conversation_event(&message);
    let new = encode_conversation_event(&message);
    // Two zero longs and a null union.
    assert_eq!(old, new[..new.len() - 3]);
    assert!(matches!(
        decode_conversation_event_view(&old, WireFormat::Auto),
        Ok(Decoded::Borrowed(_))
    ));
    assert_eq!(
        decode_conversation_event(&old, WireFormat::Auto).unwrap(),
        message
    );
}

#[test]
fn thread_reads_and_replies_round_trip() {
    let read = ReadReportRecord {
        thread: 7,
        seq: 3,
        private: true,
        ..report()
    };
    let bytes = encode_read_report(&read);
    assert_eq!(decode_read_report(&bytes, WireFormat::Auto).unwrap(), read);
    let reply = ConversationEventRecord {
        conversation_id: "G".into(),
        seq: 9,
        at: 1,
        event: EventRecord::MessageSent {
            sender_id: "bob".into(),
            mentions: vec!["carol".into()],
            mention_all: false,
            thread: 7,
            thread_seq: 2,
            starter_id: Some("alice".into()),
        },
    };
    let bytes = encode_conversation_event(&reply);
    assert_eq!(
        decode_conversation_event(&bytes, WireFormat::Auto).unwrap(),
        reply
    );
    let framed = frame_confluent(3, &bytes);
    assert_eq!(
        decode_conversation_event(&framed, WireFormat::Confluent).unwrap(),
        reply
    );
}
