//! The local checkpoint's codec on one core: what a restart from a
//! checkpoint spends opening it (the header and the pages' checksums), what
//! reading it whole costs per cursor (a snapshot of every key takes the
//! whole state in), and what a clean stop spends writing it. No I/O: the
//! shapes of `--memory-cursors`, restored.

use std::time::Instant;

use readfold_wire::checkpoint::{self, CheckpointMeta};

use super::memory::{build_state, Build};

/// One shape's figures.
pub struct CheckpointRow {
    pub shape: &'static str,
    pub cursors: usize,
    pub bytes: usize,
    pub encode_secs: f64,
    pub open_secs: f64,
    pub decode_secs: f64,
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
            CheckpointRow {
                shape,
                cursors,
                bytes: bytes.len(),
                encode_secs,
                open_secs,
                decode_secs,
            }
        })
        .collect()
}

pub fn print_checkpoint_codec(rows: &[CheckpointRow]) {
    println!("checkpoint codec (one core; a restored state, users each in ~10 conversations):");
    for r in rows {
        let per = |secs: f64| secs * 1e9 / r.cursors.max(1) as f64;
        println!(
            "  {:<30} {:>9} cursors {:>6.1} bytes each   encode {:>6.1} ns/cursor   open {:>7.3} ms   read whole {:>6.1} ns/cursor ({:.2}M cursors/s)",
            r.shape,
            r.cursors,
            r.bytes as f64 / r.cursors.max(1) as f64,
            per(r.encode_secs),
            r.open_secs * 1e3,
            per(r.decode_secs),
            r.cursors as f64 / r.decode_secs.max(1e-9) / 1e6,
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
