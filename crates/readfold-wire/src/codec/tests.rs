use super::*;

fn report() -> ReadReportRecord {
    ReadReportRecord {
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
            "action"
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
            "unread_mark"
        ]
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
        conversation_id: "G".into(),
        user_id: "u".into(),
        cursor: 5,
        join_seq: 1,
        latest_seq: 6,
        updated_at: 123,
        private_cursor: None,
        unread_mark: None,
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
        conversation_id: "G".into(),
        user_id: "u".into(),
        cursor: 5,
        join_seq: 1,
        latest_seq: 6,
        updated_at: 123,
        private_cursor: None,
        unread_mark: None,
    };
    let old = encode_historic_cursor_update(&update);
    assert_eq!(decode_cursor_update(&old).unwrap(), update);
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
        conversation_id: "G".into(),
        user_id: "u".into(),
        cursor: 5,
        join_seq: 1,
        latest_seq: 6,
        updated_at: 123,
        private_cursor: Some(6),
        unread_mark: Some(true),
    };
    assert_eq!(decode_cursor_update(&encode_cursor_update(&own)).unwrap(), own);
    let state = MemberStateRecord {
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
