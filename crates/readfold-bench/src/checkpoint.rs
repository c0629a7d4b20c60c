//! The local checkpoint's codec on one core: what a restart from a
//! checkpoint spends opening it (the header and the pages' checksums), what
//! reading it whole costs per cursor (a snapshot of every key takes the
//! whole state in), what taking every conversation in one at a time costs
//! (as records touch them after a restart; from a file in the temporary
//! folder, in the page cache as just written), and what a clean stop
//! spends writing it. The memory bench's shapes, restored.

use std::sync::Arc;
use std::time::Instant;

use readfold_core::fold::ReadReport;
use readfold_core::Seq;
use readfold_processor::checkpoint::CheckpointFile;
use readfold_wire::checkpoint::{self, CheckpointMeta};

use crate::memory::{build_state, Build};

/// One shape's figures.
pub struct CheckpointRow {
    pub shape: &'static str,
    pub cursors: usize,
    pub bytes: usize,
    pub encode_secs: f64,
    pub open_secs: f64,
    pub decode_secs: f64,
    /// Every conversation taken in by a record, in a scattered order.
    pub touch_secs: f64,
}

const SHAPES: [(&str, u64); 2] = [("100 members per conversation", 100), ("1:1 chats", 2)];

/// Encodes and decodes a restored state of `cursors` cursors in each shape.
pub fn checkpoint_codec(cursors: u64) -> Vec<CheckpointRow> {
    let meta = CheckpointMeta {
        group_id: "bench".into(),
        public_topic: "bench.read-cursors".into(),
        state_topic: "bench.member-state".into(),
        partition: 0,
        partition_count: 1,
        public_offset: 0,
        state_offset: 0,
        written_at_ms: 0,
        snapshotted_to: None,
    };
    SHAPES
        .iter()
        .map(|&(shape, members)| {
            let state = build_state(cursors, members, Build::Restored);
            let started = Instant::now();
            let bytes = checkpoint::encode(&meta, &state).expect("a state in memory");
            let encode_secs = started.elapsed().as_secs_f64();
            let cursors = state.cursor_count();
            drop(state);
            let started = Instant::now();
            let opened = checkpoint::open(bytes.as_slice(), 256).expect("the bench's own checkpoint opens");
            let open_secs = started.elapsed().as_secs_f64();
            drop(opened);
            let started = Instant::now();
            let (_, decoded) = checkpoint::decode(&bytes, 256).expect("the bench's own checkpoint decodes");
            let decode_secs = started.elapsed().as_secs_f64();
            assert_eq!(
                decoded.cursor_count(),
                cursors,
                "the checkpoint holds every cursor"
            );
            drop(decoded);
            let touch_secs = touch_each(&meta, &bytes, cursors, members);
            CheckpointRow {
                shape,
                cursors,
                bytes: bytes.len(),
                encode_secs,
                open_secs,
                decode_secs,
                touch_secs,
            }
        })
        .collect()
}

/// Writes `bytes` to a file, puts a state over it and folds one stale read
/// into each of its conversations, in a scattered order: each takes its
/// conversation in from the file. Returns the seconds the reads took.
fn touch_each(meta: &CheckpointMeta, bytes: &[u8], cursors: usize, members: u64) -> f64 {
    let path = std::env::temp_dir().join(format!(
        "readfold-bench-{}-{}.checkpoint",
        std::process::id(),
        members
    ));
    std::fs::write(&path, bytes).expect("the temporary folder takes the checkpoint");
    let file = CheckpointFile::open(&path).expect("the checkpoint just written");
    let opened = Arc::new(checkpoint::open(file, 256).expect("the bench's own checkpoint opens"));
    assert_eq!(opened.meta, *meta);
    let mut state = opened.state();
    let conversations = (cursors as u64 / members).max(1);
    // A step coprime with the count visits each conversation once.
    let step = (1..)
        .map(|k| conversations / 2 + k)
        .find(|s| gcd(*s, conversations) == 1)
        .expect("a step");
    let started = Instant::now();
    for i in 0..conversations {
        let c = i * step % conversations;
        state.apply_report(&ReadReport {
            conversation_id: format!("conv-{c}").parse().expect("id"),
            user_id: "bench-reader".parse().expect("id"),
            seq: Seq(1),
            reported_at: 0,
            private: false,
        });
    }
    let secs = started.elapsed().as_secs_f64();
    assert!(state.stored_fault().is_none(), "{:?}", state.stored_fault());
    assert_eq!(
        state.cursor_count(),
        cursors + conversations as usize,
        "every conversation taken in"
    );
    let _ = std::fs::remove_file(&path);
    secs
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

pub fn print_checkpoint_codec(rows: &[CheckpointRow]) {
    println!("checkpoint codec (one core; a restored state, users each in ~10 conversations):");
    for r in rows {
        let per = |secs: f64| secs * 1e9 / r.cursors.max(1) as f64;
        println!(
            "  {:<30} {:>9} cursors {:>6.1} bytes each   encode {:>6.1} ns/cursor   open {:>7.3} ms   read whole {:>6.1} ns/cursor ({:.2}M cursors/s)   taken in by records {:>6.1} ns/cursor",
            r.shape,
            r.cursors,
            r.bytes as f64 / r.cursors.max(1) as f64,
            per(r.encode_secs),
            r.open_secs * 1e3,
            per(r.decode_secs),
            r.cursors as f64 / r.decode_secs.max(1e-9) / 1e6,
            per(r.touch_secs),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_round_trips_with_its_cursors() {
        let rows = checkpoint_codec(1_000);
        assert_eq!(rows.len(), SHAPES.len());
        for row in rows {
            assert!(row.cursors >= 900, "{}: {} cursors", row.shape, row.cursors);
            assert!(row.bytes > 0);
        }
    }
}
