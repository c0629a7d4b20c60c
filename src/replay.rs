//! `readfold replay`: `readfold-replay` on the configured brokers and
//! topics, its table written where the command line says.

use std::path::PathBuf;

use clap::Args;
use readfold_replay::{Format, OffsetBound, ProgressMode, ReplayOptions, TableKind};

use crate::config::Config;
use crate::error::Result;

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// cursors, read-counts (needs --conversation), latency or
    /// thread-cursors.
    #[arg(long, default_value = "cursors")]
    pub table: TableKind,
    /// jsonl, csv or parquet.
    #[arg(long, default_value = "jsonl")]
    pub format: Format,
    /// File to write (replaced only once complete); stdout when omitted or "-".
    #[arg(long, short)]
    pub output: Option<PathBuf>,
    /// Fold only records whose Kafka record timestamp is before this
    /// time: RFC 3339 (2026-11-30T18:00:00Z) or epoch milliseconds.
    #[arg(long, value_parser = readfold_replay::parse_time)]
    pub until: Option<i64>,
    /// Stop a partition before an offset: TOPIC:PARTITION=OFFSET, repeatable.
    #[arg(long = "until-offset", value_name = "TOPIC:PARTITION=OFFSET")]
    pub until_offsets: Vec<OffsetBound>,
    /// Rebuild from the changelog topics (public cursors and member
    /// state) instead of the inputs, as a restore does: the cursors table
    /// only. Compaction keeps only each member's latest records, so with
    /// --until this is the state at that time only where compaction has
    /// not run past it.
    #[arg(long)]
    pub from_changelog: bool,
    /// Only this conversation; repeatable (all when none is given).
    #[arg(long = "conversation", value_name = "ID")]
    pub conversations: Vec<String>,
    /// Add each member's private cursor, unread mark and own unread count
    /// to the cursors table (and list members seen only privately); each
    /// follower's private cursor and own unread to the thread-cursors table.
    #[arg(long)]
    pub include_private: bool,
    /// The latency table's memory bound: messages not yet read by every
    /// possible reader; past it the oldest is written as it stands.
    #[arg(long, default_value_t = 1_000_000)]
    pub latency_max_open: usize,
    /// auto (a bar on a terminal, log lines otherwise), bar, log or off.
    #[arg(long, default_value = "auto")]
    pub progress: ProgressMode,
}

impl From<ReplayArgs> for ReplayOptions {
    fn from(args: ReplayArgs) -> Self {
        ReplayOptions {
            table: args.table,
            format: args.format,
            output: args.output,
            until: args.until,
            until_offsets: args.until_offsets,
            from_changelog: args.from_changelog,
            conversations: args.conversations,
            include_private: args.include_private,
            latency_max_open: args.latency_max_open,
            progress: args.progress,
        }
    }
}

/// Replays as `args` say; the summary goes to stderr, as the table may be
/// on stdout.
pub fn replay(config: &Config, args: ReplayArgs) -> Result<()> {
    let options = ReplayOptions::from(args);
    let summary = readfold_replay::replay(&config.kafka, &config.topics, &config.input, &options)?;
    eprintln!("{summary}");
    Ok(())
}
