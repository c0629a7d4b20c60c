//! `checkpoint::open`, a state over it, `checkpoint::decode_meta` and
//! `checkpoint::decode`: the local state checkpoint a restart reads from
//! disk, on arbitrary bytes.
//!
//! Input: `[selector][rest]`. With selector bit 0 clear the rest is a
//! header's length (u32), the header and the body, sealed as a checkpoint
//! file is (magic, format version, header, checksums of the header and of
//! each page of the body), so that the fuzzer reaches past the checksums;
//! with it set the rest is the whole file. `max_id_bytes` is
//! 1 + (selector >> 1).
//!
//! Checks: no panic, the guard's allocation bound (a count, a length or an
//! offset must not reserve more than the file holds); a state over the
//! file folds records and is taken in whole or finds a fault; `decode`
//! succeeds only where `decode_meta` does, with the same header; what
//! decodes encodes again into a checkpoint that decodes with the same
//! header.

use readfold_fuzz as fz;
use std::sync::Arc;

use readfold_core::fold::{Input, ReadReport};
use readfold_core::Seq;
use readfold_wire::checkpoint::{decode, decode_meta, encode, open};

#[global_allocator]
static ALLOC: fz::AllocGuard = fz::AllocGuard;

fn main() {
    fz::warm_up();
    afl::fuzz!(|data: &[u8]| fz::guarded(data, run));
}

fn run(data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let file = if selector & 1 == 0 {
        fz::checkpoint_file(body)
    } else {
        body.to_vec()
    };
    let max_id_bytes = 1 + usize::from(selector >> 1);
    if let Ok(opened) = open(file.clone(), max_id_bytes) {
        let opened = Arc::new(opened);
        let mut over = Arc::clone(&opened).state();
        for c in ["G", "H", "conversation"] {
            if let Ok(conversation_id) = c.parse() {
                over.apply(&Input::Report(ReadReport {
                    conversation_id,
                    user_id: "alice".parse().expect("an id"),
                    seq: Seq(5),
                    reported_at: 9,
                    private: false,
                }));
            }
        }
        // A stop writes a state still over its file, reading the rest.
        if let Ok(again) = encode(&opened.meta, &over) {
            assert_eq!(decode_meta(&again).as_ref(), Ok(&opened.meta));
        }
        let _ = opened.check_all();
        if over.take_all().is_ok() {
            let again = encode(&opened.meta, &over).expect("a state in memory");
            assert_eq!(decode_meta(&again).as_ref(), Ok(&opened.meta));
        }
    }
    let meta = decode_meta(&file);
    let Ok((whole_meta, state)) = decode(&file, max_id_bytes) else {
        return;
    };
    assert_eq!(meta.as_ref(), Ok(&whole_meta));
    let again = encode(&whole_meta, &state).expect("a state in memory");
    assert_eq!(decode_meta(&again), Ok(whole_meta));
}
