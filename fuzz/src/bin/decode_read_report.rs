//! `codec::decode_read_report` on arbitrary bytes, in the three wire formats,
//! then `validate::read_report` on what decodes. Checks: no panic, no
//! allocation beyond the guard's bound; the result equals the generic Avro
//! reader's (current schema, then v1.0); the formats frame as documented;
//! a decoded record re-encodes and decodes to itself; validation rejects
//! exactly the records it should, for the documented reason.

use readfold_core::fold::Input;
use readfold_core::Seq;
use readfold_fuzz as fz;
use readfold_wire::codec::{self, ReadAction, WireFormat};
use readfold_wire::validate;

#[global_allocator]
static ALLOC: fz::AllocGuard = fz::AllocGuard;

fn main() {
    fz::warm_up();
    afl::fuzz!(|data: &[u8]| fz::guarded(data, run));
}

fn run(data: &[u8]) {
    let plain = fz::check_framing(data, codec::decode_read_report);
    assert_eq!(
        plain.as_ref().ok(),
        fz::generic_read_report(data).as_ref(),
        "the decoder and the generic reader disagree"
    );
    let Ok(record) = plain else { return };
    let again = codec::encode_read_report(&record);
    assert_eq!(
        codec::decode_read_report(&again, WireFormat::Plain).as_ref(),
        Ok(&record)
    );

    let limits = fz::default_limits();
    let min_seq = if record.action == ReadAction::Read { 1 } else { 0 };
    let expected = fz::expected_rejection(
        &[&record.conversation_id, &record.user_id],
        record.seq,
        min_seq,
        &limits,
    );
    match validate::read_report(record.clone(), &limits) {
        Ok(input) => {
            assert_eq!(expected, None, "{record:?} passed validation");
            let seq = Seq(record.seq as u64);
            match input {
                Input::Report(r) => {
                    assert_eq!(record.action, ReadAction::Read);
                    assert_eq!(
                        (r.conversation_id.as_str(), r.user_id.as_str()),
                        (&*record.conversation_id, &*record.user_id)
                    );
                    assert_eq!(
                        (r.seq, r.reported_at, r.private),
                        (seq, record.reported_at, record.private)
                    );
                }
                Input::Mark(m) => {
                    assert_ne!(record.action, ReadAction::Read);
                    assert_eq!(
                        (m.conversation_id.as_str(), m.user_id.as_str()),
                        (&*record.conversation_id, &*record.user_id)
                    );
                    assert_eq!((m.seq, m.at), (seq, record.reported_at));
                    assert_eq!(m.marked, record.action == ReadAction::MarkUnread);
                }
                Input::Event(_) => panic!("a read report validated into an event"),
            }
        }
        Err(rejection) => assert_eq!(
            Some(rejection.reason),
            expected,
            "{record:?}: {}",
            rejection.detail
        ),
    }
}
