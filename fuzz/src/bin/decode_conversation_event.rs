//! `codec::decode_conversation_event` on arbitrary bytes, in the three wire
//! formats, then `validate::conversation_event` on what decodes. Checks as in
//! `decode_read_report`: no panic, the guard's allocation bound, agreement
//! with the generic Avro reader, framing, re-encoding, and validation.

use readfold_core::fold::EventKind;
use readfold_core::Seq;
use readfold_fuzz as fz;
use readfold_wire::codec::{self, EventRecord, WireFormat};
use readfold_wire::validate;

#[global_allocator]
static ALLOC: fz::AllocGuard = fz::AllocGuard;

fn main() {
    fz::warm_up();
    afl::fuzz!(|data: &[u8]| fz::guarded(data, run));
}

fn run(data: &[u8]) {
    let plain = fz::check_framing(data, codec::decode_conversation_event);
    assert_eq!(
        plain.as_ref().ok(),
        fz::generic_conversation_event(data).as_ref(),
        "the decoder and the generic reader disagree"
    );
    let Ok(record) = plain else { return };
    let again = codec::encode_conversation_event(&record);
    assert_eq!(
        codec::decode_conversation_event(&again, WireFormat::Plain).as_ref(),
        Ok(&record)
    );

    let limits = fz::default_limits();
    let (user, min_seq) = match &record.event {
        EventRecord::MessageSent { sender_id } => (sender_id, 1),
        EventRecord::MemberJoined { user_id } | EventRecord::MemberLeft { user_id } => (user_id, 0),
    };
    let expected = fz::expected_rejection(&[&record.conversation_id, user], record.seq, min_seq, &limits);
    match validate::conversation_event(record.clone(), &limits) {
        Ok(event) => {
            assert_eq!(expected, None, "{record:?} passed validation");
            assert_eq!(event.conversation_id.as_str(), record.conversation_id);
            assert_eq!((event.seq, event.at), (Seq(record.seq as u64), record.at));
            let same = match (&event.kind, &record.event) {
                (EventKind::MessageSent { sender_id: a }, EventRecord::MessageSent { sender_id: b })
                | (EventKind::MemberJoined { user_id: a }, EventRecord::MemberJoined { user_id: b })
                | (EventKind::MemberLeft { user_id: a }, EventRecord::MemberLeft { user_id: b }) => {
                    a.as_str() == b
                }
                _ => false,
            };
            assert!(same, "{event:?} is not {record:?}");
        }
        Err(rejection) => assert_eq!(
            Some(rejection.reason),
            expected,
            "{record:?}: {}",
            rejection.detail
        ),
    }
}
