//! `checkpoint::decode_meta` and `checkpoint::decode`, the local state
//! checkpoint a restart loads from disk, on arbitrary bytes.
//!
//! Input: `[selector][body]`. With selector bit 0 clear the body is framed
//! as a checkpoint file is (magic, format version 3, body, CRC-32C of all
//! that), so that the fuzzer reaches past the checksum; with it set the
//! body is the whole file. `max_id_bytes` is 1 + (selector >> 1).
//!
//! Checks: no panic, the guard's allocation bound (a count or a length
//! field must not reserve more than the file holds); `decode` succeeds
//! only where `decode_meta` does, with the same header; what decodes
//! gives its member-state records and encodes again into a checkpoint
//! that decodes with the same header.

use readfold_fuzz as fz;
use readfold_wire::checkpoint::{decode, decode_meta, encode, member_states};

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
    let meta = decode_meta(&file);
    let Ok((whole_meta, state)) = decode(&file, max_id_bytes) else {
        return;
    };
    assert_eq!(meta.as_ref(), Ok(&whole_meta));
    member_states(&state);
    let again = encode(&whole_meta, &state);
    assert_eq!(decode_meta(&again), Ok(whole_meta));
}
