//! `readfold loadgen`: the workload of `readfold-loadgen` produced to the
//! configured input topics.

use std::time::Duration;

use clap::Args;
use readfold_kafka::admin::ensure_topics;
use readfold_kafka::producer::InputProducer;
use readfold_loadgen::{LoadgenOptions, WorkloadSpec};

use crate::config::Config;
use crate::error::Result;

/// The workload's knobs; their defaults are `WorkloadSpec::default()`'s, so
/// the command and the library cannot differ.
#[derive(Args, Debug)]
pub struct LoadgenArgs {
    /// Records per second offered (reports and conversation events).
    #[arg(long, default_value_t = 10_000.0)]
    pub rate: f64,
    /// Stop after this many records.
    #[arg(long)]
    pub records: Option<u64>,
    /// Stop after this many seconds (with neither: 10 s).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// The same seed gives the same workload.
    #[arg(long, default_value_t = WorkloadSpec::default().seed)]
    pub seed: u64,
    #[arg(long, default_value_t = WorkloadSpec::default().conversations)]
    pub conversations: u32,
    /// Users the members are drawn from.
    #[arg(long, default_value_t = WorkloadSpec::default().users)]
    pub users: u32,
    /// Share of conversations that are 1:1; the others are groups.
    #[arg(long, default_value_t = WorkloadSpec::default().direct_share)]
    pub direct_share: f64,
    /// Largest group; group sizes follow a Zipf law over 3..=max.
    #[arg(long, default_value_t = WorkloadSpec::default().max_group)]
    pub max_group: u32,
    #[arg(long, default_value_t = WorkloadSpec::default().zipf_exponent)]
    pub zipf_exponent: f64,
    /// Share of records that are sends (MessageSent).
    #[arg(long, default_value_t = WorkloadSpec::default().send_share)]
    pub send_share: f64,
    /// Chance that a member reads a conversation after a send.
    #[arg(long, default_value_t = WorkloadSpec::default().online_share)]
    pub online_share: f64,
    /// Mean delay of a read after a send, in 1:1 chats and in groups (ms).
    #[arg(long, default_value_t = WorkloadSpec::default().direct_read_delay_ms)]
    pub direct_read_delay_ms: f64,
    #[arg(long, default_value_t = WorkloadSpec::default().group_read_delay_ms)]
    pub group_read_delay_ms: f64,
    /// Share of reads repeated from another device of the same user.
    #[arg(long, default_value_t = WorkloadSpec::default().duplicate_share)]
    pub duplicate_share: f64,
    /// Share of reads that report a seq below what the user reported before.
    #[arg(long, default_value_t = WorkloadSpec::default().stale_share)]
    pub stale_share: f64,
    /// Share of reads that are private receipts.
    #[arg(long, default_value_t = WorkloadSpec::default().private_share)]
    pub private_share: f64,
    /// Chance that each other member's device reports a message delivered
    /// right after it is sent (the grey ticks).
    #[arg(long, default_value_t = WorkloadSpec::default().delivered_share)]
    pub delivered_share: f64,
    /// Share of sends in groups that come with a join or a departure.
    #[arg(long, default_value_t = WorkloadSpec::default().membership_share)]
    pub membership_share: f64,
    /// Share of sends in groups that are replies in a thread of a recent
    /// message (thread-heavy workloads).
    #[arg(long, default_value_t = WorkloadSpec::default().reply_share)]
    pub reply_share: f64,
    /// Put before every conversation and user id (runs that must not meet).
    #[arg(long, default_value_t = WorkloadSpec::default().prefix)]
    pub prefix: String,
    /// auto (a bar on a terminal, log lines otherwise), bar, log or off.
    #[arg(long, default_value = "auto")]
    pub progress: readfold_progress::ProgressMode,
}

impl LoadgenArgs {
    pub fn options(&self) -> LoadgenOptions {
        let duration = match (self.records, self.seconds) {
            (None, None) => Some(Duration::from_secs(10)),
            (_, seconds) => seconds.map(Duration::from_secs_f64),
        };
        LoadgenOptions {
            spec: WorkloadSpec {
                seed: self.seed,
                conversations: self.conversations,
                users: self.users,
                direct_share: self.direct_share,
                max_group: self.max_group,
                zipf_exponent: self.zipf_exponent,
                send_share: self.send_share,
                online_share: self.online_share,
                direct_read_delay_ms: self.direct_read_delay_ms,
                group_read_delay_ms: self.group_read_delay_ms,
                duplicate_share: self.duplicate_share,
                stale_share: self.stale_share,
                private_share: self.private_share,
                delivered_share: self.delivered_share,
                membership_share: self.membership_share,
                reply_share: self.reply_share,
                prefix: self.prefix.clone(),
            },
            rate: self.rate,
            records: self.records,
            duration,
            progress: self.progress,
        }
    }
}

pub async fn loadgen(config: &Config, args: LoadgenArgs) -> Result<()> {
    let options = args.options();
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    let producer = InputProducer::new(&config.kafka, &config.topics, layout.partitions)?;
    let summary = readfold_loadgen::run(&options, &producer).await?;
    let c = summary.counts;
    eprintln!(
        "loadgen: {} records in {:.1} s ({:.0}/s offered {:.0}/s, at most {} behind) to {} and {}: {} sends ({} replies in threads), {} reads ({} private, {} in threads), {} duplicates from a second device, {} stale, {} deliveries, {} joins, {} leaves",
        summary.records,
        summary.elapsed.as_secs_f64(),
        summary.achieved_rate(),
        options.rate,
        summary.max_behind,
        config.topics.read_reports,
        config.topics.conversation_events,
        c.sends,
        c.replies,
        c.reads,
        c.private,
        c.thread_reads,
        c.duplicates,
        c.stale,
        c.deliveries,
        c.joins,
        c.leaves
    );
    Ok(())
}
