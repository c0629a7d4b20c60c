//! `readfold-bench memory --cursors N`: resident memory per cursor of one
//! partition's state holding N cursors, in the shapes a partition takes,
//! and per thread and per thread follower over such a state. No I/O. Each
//! shape is built in a process of its own (this binary again, with the
//! hidden `memory-shape`), so that memory freed by one shape does not hide
//! the growth of the next; each figure is the growth of resident memory the
//! state (or its threads) causes, divided by its cursors (or threads, or
//! followers).

use readfold_core::fold::{
    ConversationEvent, CursorUpdate, EventKind, PartitionState, ReadReport, ThreadReadReport,
};
use readfold_core::{ConversationId, Seq, UserId};

use crate::child::resident_bytes;
use crate::error::{Error, Result};

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Cursors of the partition's state, in each shape (and in the
    /// checkpoint's).
    #[arg(long, default_value_t = 1_000_000)]
    pub cursors: u64,
}

/// One shape, for the memory bench's child.
#[derive(Clone, Debug, clap::Args)]
pub struct ShapeArgs {
    #[arg(long)]
    pub cursors: u64,
    /// The shape's index in the bench's list.
    #[arg(long)]
    pub shape: usize,
}

/// One shape's figure.
pub struct MemoryRow {
    pub shape: &'static str,
    /// Cursors, threads or followers held.
    pub units: usize,
    pub unit: &'static str,
    pub bytes_per_unit: f64,
}

/// How the state is built.
#[derive(Clone, Copy)]
pub enum Build {
    /// From changelog records, then shrunk, as a restore leaves it.
    Restored,
    /// Joins then reads through the fold, as a live partition grows.
    Folded,
}

/// Members per conversation, and how a state is built.
const SHAPES: [(&str, u64, Build); 4] = [
    ("restored, 100 members per conversation", 100, Build::Restored),
    (
        "folded live (joins, reads), 100 members per conversation",
        100,
        Build::Folded,
    ),
    ("restored, 1:1 chats", 2, Build::Restored),
    ("folded live (joins, reads), 1:1 chats", 2, Build::Folded),
];

/// Thread shapes, over a restored state of 100-member conversations: the
/// unit they count, threads per conversation and followers per thread (the
/// sender of its one reply, and members who read it).
const THREAD_SHAPES: [(&str, &str, u64, u64); 2] = [
    (
        "threads of one reply (its sender follows), 10 per group",
        "threads",
        10,
        1,
    ),
    (
        "followers of threads read by 50 members, 1 per group",
        "followers",
        1,
        50,
    ),
];

/// Every user is in about this many of the state's conversations.
const CONVERSATIONS_PER_USER: u64 = 10;

pub fn memory(cursors: u64) -> Result<Vec<MemoryRow>> {
    let exe = std::env::current_exe().map_err(Error::io("cannot find this executable"))?;
    let mut rows = Vec::new();
    let shapes = SHAPES
        .iter()
        .map(|s| (s.0, "cursors"))
        .chain(THREAD_SHAPES.iter().map(|s| (s.0, s.1)));
    for (i, (shape, unit)) in shapes.enumerate() {
        let output = std::process::Command::new(&exe)
            .args(["memory-shape", "--cursors", &cursors.to_string()])
            .args(["--shape", &i.to_string()])
            .output()
            .map_err(|source| Error::Spawn {
                command: "readfold-bench memory-shape".into(),
                source,
            })?;
        let text = String::from_utf8_lossy(&output.stdout);
        let mut figures = text.split_whitespace().map(str::parse::<f64>);
        let (Some(Ok(held)), Some(Ok(bytes))) = (figures.next(), figures.next()) else {
            return Err(Error::MemoryChild {
                shape,
                status: output.status,
                output: format!("{text}{}", String::from_utf8_lossy(&output.stderr)),
            });
        };
        rows.push(MemoryRow {
            shape,
            units: held as usize,
            unit,
            bytes_per_unit: bytes,
        });
    }
    Ok(rows)
}

/// Builds shape `index` of [`SHAPES`] in this process; returns "cursors
/// bytes-per-cursor" for [`memory`] to read.
pub fn memory_shape(cursors: u64, index: usize) -> String {
    if let Some(&(_, _, threads, followers)) =
        index.checked_sub(SHAPES.len()).and_then(|i| THREAD_SHAPES.get(i))
    {
        return thread_shape(cursors, threads, followers);
    }
    let Some(&(_, members, build)) = SHAPES.get(index) else {
        return format!("no shape {index}");
    };
    let before = resident_bytes();
    let state = build_state(cursors, members, build);
    let grown = resident_bytes().saturating_sub(before);
    let held = state.cursor_count();
    format!("{held} {}", grown as f64 / held.max(1) as f64)
}

/// A state of `cursors` cursors, `members` per conversation; members are
/// drawn so that each user is in about [`CONVERSATIONS_PER_USER`] of them.
pub fn build_state(cursors: u64, members: u64, build: Build) -> PartitionState {
    let conversations = (cursors / members).max(1);
    let users = (cursors / CONVERSATIONS_PER_USER).max(members);
    let stride = users / members;
    let id = |c: u64| ConversationId::parse(&format!("conv-{c}"), 64).expect("id");
    let user = |c: u64, j: u64| UserId::parse(&format!("user-{}", (c + j * stride) % users), 64).expect("id");
    let mut state = PartitionState::new();
    for c in 0..conversations {
        let conversation_id = id(c);
        for j in 0..members {
            let user_id = user(c, j);
            let seq = Seq((c * 31 + j * 17) % 1000 + 1);
            match build {
                Build::Restored => state.restore_update(&CursorUpdate {
                    conversation_id: conversation_id.clone(),
                    user_id,
                    cursor: seq,
                    delivered: Seq::ZERO,
                    join_seq: Seq(1),
                    latest_seq: Seq(1000),
                    updated_at: 1_700_000_000_000,
                }),
                Build::Folded => {
                    state.apply_event(&ConversationEvent {
                        conversation_id: conversation_id.clone(),
                        seq: Seq::ZERO,
                        at: 1_700_000_000_000,
                        kind: EventKind::MemberJoined {
                            user_id: user_id.clone(),
                        },
                    });
                    state.apply_report(&ReadReport {
                        conversation_id: conversation_id.clone(),
                        user_id,
                        seq,
                        reported_at: 1_700_000_000_001,
                        private: false,
                    });
                }
            }
        }
        if (c + 1) % (5_000 / members).max(1) == 0 {
            // A flush about every 5,000 changes, as under load: the dirty
            // set stays small.
            state.mark_flushed();
        }
    }
    state.mark_flushed();
    if let Build::Restored = build {
        state.shrink_to_fit();
    }
    state
}

/// Over a restored state of `cursors` cursors in 100-member groups:
/// `threads` threads per group, each with one reply and `followers`
/// members reading it. Returns "units bytes-per-unit": per thread when
/// each has one follower, per follower otherwise.
fn thread_shape(cursors: u64, threads: u64, followers: u64) -> String {
    let members = 100;
    let mut state = build_state(cursors, members, Build::Restored);
    let before = resident_bytes();
    let conversations: Vec<_> = state.conversations().map(|(id, _)| id.clone()).collect();
    let mut made = 0u64;
    for (c, conversation_id) in conversations.iter().enumerate() {
        let members: Vec<UserId> = state
            .conversation(conversation_id)
            .expect("held")
            .members()
            .map(|(u, _)| u.clone())
            .collect();
        for t in 0..threads {
            let root = Seq(t + 1);
            state.apply_event(&ConversationEvent {
                conversation_id: conversation_id.clone(),
                seq: Seq(1000),
                at: 1_700_000_000_000,
                kind: EventKind::ReplySent {
                    thread: root,
                    thread_seq: Seq(1),
                    sender_id: members[(c + t as usize) % members.len()].clone(),
                    mentions: Vec::new(),
                    starter_id: None,
                },
            });
            for user_id in members.iter().skip(1).take(followers.saturating_sub(1) as usize) {
                state.apply_thread_read(&ThreadReadReport {
                    conversation_id: conversation_id.clone(),
                    thread: root,
                    user_id: user_id.clone(),
                    seq: Seq(1),
                    reported_at: 1_700_000_000_001,
                    private: false,
                });
            }
            made += 1;
        }
        if (c + 1) % 50 == 0 {
            state.mark_flushed();
        }
    }
    state.mark_flushed();
    let grown = resident_bytes().saturating_sub(before) as f64;
    let (_, follows) = state.thread_counts();
    match followers {
        1 => format!("{made} {}", grown / made.max(1) as f64),
        _ => format!("{follows} {}", grown / follows.max(1) as f64),
    }
}

pub fn print_memory(rows: &[MemoryRow]) {
    println!("memory per cursor (resident growth; users each in ~{CONVERSATIONS_PER_USER} conversations):");
    for r in rows {
        println!(
            "  {:<58} {:>10} {:<9} {:>8.1} bytes",
            r.shape, r.units, r.unit, r.bytes_per_unit
        );
    }
}
