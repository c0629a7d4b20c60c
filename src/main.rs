//! The `readfold` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use readfold::config::{Config, LogFormat};
use readfold::error::{Error, Result};

/// Records cross threads (librdkafka's broker thread to the reader, reader
/// to fold, fold to flush) and are freed where they were not allocated,
/// which glibc's malloc serves slowly. With its `override` feature (see
/// Cargo.toml) mimalloc also serves librdkafka's and the other C
/// libraries' allocations. Together: a 1M-record catch-up 4.3 -> 3.4 s,
/// a replay 470k -> 0.74-1.1M records/s.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "readfold",
    version,
    about = "Folds chat read reports into monotonic read cursors on Kafka"
)]
struct Cli {
    /// Configuration file (TOML); defaults to the built-in config/default.toml.
    #[arg(long, global = true, env = "READFOLD_CONFIG")]
    config: Option<PathBuf>,
    /// Log level: error, warn, info, debug or trace.
    #[arg(long, global = true, default_value = "info", env = "READFOLD_LOG")]
    log: tracing::Level,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the processor until SIGTERM or SIGINT.
    Run,
    /// Serve the query API (unread, read counts, who-read) until SIGTERM or SIGINT.
    Serve,
    /// Run the push gateway (WebSocket) until SIGTERM or SIGINT.
    Gateway,
    /// Print the query API's OpenAPI document.
    Openapi,
    /// Play a small chat scenario through a live processor and print the cursors.
    Demo,
    /// Print a topic's records (changelog, DLQ or input) as JSON lines.
    Tail {
        topic: String,
        /// Keep following new records instead of stopping at the end.
        #[arg(long, short)]
        follow: bool,
        /// Stop after this many records.
        #[arg(long, short = 'n')]
        limit: Option<u64>,
    },
    /// Rebuild read state from the input topics as of a point in time and
    /// write one table (cursors, read counts or read latency) for analysts.
    /// Reads with a consumer of its own: no group, no commits, no sinks.
    Replay {
        /// cursors, read-counts (needs --conversation) or latency.
        #[arg(long, default_value = "cursors")]
        table: readfold_replay::TableKind,
        /// jsonl, csv or parquet.
        #[arg(long, default_value = "jsonl")]
        format: readfold_replay::Format,
        /// File to write (replaced only once complete); stdout when omitted or "-".
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// Fold only records whose Kafka record timestamp is before this
        /// time: RFC 3339 (2026-11-30T18:00:00Z) or epoch milliseconds.
        #[arg(long, value_parser = readfold_replay::parse_time)]
        until: Option<i64>,
        /// Stop a partition before an offset: TOPIC:PARTITION=OFFSET, repeatable.
        #[arg(long = "until-offset", value_name = "TOPIC:PARTITION=OFFSET")]
        until_offsets: Vec<readfold_replay::OffsetBound>,
        /// Rebuild from the changelog topics (public cursors and member
        /// state) instead of the inputs, as a restore does: the cursors table
        /// only. Compaction keeps only each member's latest records, so with
        /// --until this is the state at that time only where compaction has
        /// not run past it.
        #[arg(long)]
        from_changelog: bool,
        /// Only this conversation; repeatable (all when none is given).
        #[arg(long = "conversation", value_name = "ID")]
        conversations: Vec<String>,
        /// Add each member's private cursor, unread mark and own unread count
        /// to the cursors table (and list members seen only privately).
        #[arg(long)]
        include_private: bool,
        /// The latency table's memory bound: messages not yet read by every
        /// possible reader; past it the oldest is written as it stands.
        #[arg(long, default_value_t = 1_000_000)]
        latency_max_open: usize,
        /// auto (a bar on a terminal, log lines otherwise), bar, log or off.
        #[arg(long, default_value = "auto")]
        progress: readfold_replay::ProgressMode,
    },
    /// Produce a realistic chat workload to the input topics at a constant
    /// rate, from a seed: Zipf group sizes (mostly 1:1, groups up to
    /// --max-group), sends and delayed reads, multi-device duplicates,
    /// stale reports, private receipts, joins and leaves.
    Loadgen(readfold::loadgen::LoadgenArgs),
    /// Print the effective configuration's topics and check it loads.
    CheckConfig,
    /// Internal (the throughput bench's child): read both inputs to their
    /// end as a plain group consumer, commit, and exit.
    #[command(hide = true)]
    RawConsume,
    /// Measure the pure fold: reports/s and writes per report after coalescing.
    Bench {
        /// Reports through the pure fold (0: skip, to run only the benches asked for).
        #[arg(long, default_value_t = 1_000_000)]
        reports: u64,
        #[arg(long, default_value_t = 500)]
        group_members: u64,
        #[arg(long, default_value_t = 10_000)]
        direct_chats: u64,
        /// Reports between flushes (input rate x flush interval).
        #[arg(long, default_value_t = 5_000)]
        flush_every: u64,
        /// Resident memory per cursor of one partition's state holding this
        /// many cursors, in several shapes, and the local checkpoint's
        /// encoding and decoding of such a state (0: skip).
        #[arg(long, default_value_t = 1_000_000)]
        memory_cursors: u64,
        /// Internal: measure only this shape and print its figure (the
        /// memory bench runs each shape in a process of its own).
        #[arg(long, hide = true)]
        memory_shape: Option<usize>,
        /// Also time a restore of this many cursors from a changelog topic
        /// on the configured broker (0: skip).
        #[arg(long, default_value_t = 0)]
        restore_cursors: u64,
        /// Also run this many reports through the whole pipeline on the
        /// configured services, on fresh topics (0: skip).
        #[arg(long, default_value_t = 0)]
        pipeline_reports: u64,
        /// Also measure the query API for this many seconds per scenario
        /// against the configured Redis (0: skip).
        #[arg(long, default_value_t = 0)]
        serve_seconds: u64,
        /// Keep-alive connections the query API bench uses.
        #[arg(long, default_value_t = 8)]
        serve_connections: usize,
        /// Also measure the push gateway with this many WebSocket clients,
        /// with `readfold run` and `readfold gateway` as child processes on
        /// fresh topics (0: skip).
        #[arg(long, default_value_t = 0)]
        gateway_connections: usize,
        /// Read receipts per second during the gateway bench.
        #[arg(long, default_value_t = 200)]
        gateway_rate: u64,
        /// Seconds of receipts during the gateway bench.
        #[arg(long, default_value_t = 10)]
        gateway_seconds: u64,
        /// Members per conversation in the gateway bench (5000: one
        /// 5,000-member group, to see what each client receives).
        #[arg(long, default_value_t = 10)]
        gateway_group: usize,
        #[command(flatten)]
        hot_group: readfold::bench::HotGroupArgs,
        /// Also time `readfold replay` of this many records produced onto
        /// fresh topics on the configured broker, next to a raw read (0: skip).
        #[arg(long, default_value_t = 0)]
        replay_records: u64,
        /// Times each way of reading the replay bench's records, taking
        /// turns; the median run is shown, with the slowest and fastest.
        #[arg(long, default_value_t = 3)]
        replay_runs: usize,
        /// Also time how fast `readfold run` catches up on a backlog of
        /// this many records on fresh topics, with its sinks off and on,
        /// next to a raw read (0: skip).
        #[arg(long, default_value_t = 0)]
        throughput_records: u64,
        /// Times the throughput bench's raw consumer process and readfold
        /// rows run, taking turns, each on its own group, output topics and
        /// Redis keys; each row shows its median run, and the lines below
        /// every run's rate and share of the raw consumer process.
        #[arg(long, default_value_t = 1)]
        throughput_runs: usize,
        /// Whether the throughput bench also runs the peers: the seed
        /// design's consumer (per report, and pipelined) and the Kafka
        /// Streams peer. Without them it shows the raw reads and readfold.
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        throughput_peers: bool,
        /// Also time `readfold run` from start to ready after a clean stop,
        /// restoring the whole changelog vs a local checkpoint plus the
        /// tail, at a quarter, half and all of this many cursors (0: skip).
        #[arg(long, default_value_t = 0)]
        restart_cursors: u64,
        /// Members per conversation of the restart bench's state (2: 1:1
        /// chats); each user is in about ten conversations.
        #[arg(long, default_value_t = 100)]
        restart_members: u64,
        /// Whether the restart bench runs `readfold run` with CQL on, and
        /// also times each restart until CQL holds the restored state again
        /// (its snapshot backlog back to 0), with the keys that took.
        #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
        restart_cql: bool,
        /// Also measure report-to-changelog and report-to-Redis latency at
        /// 10% to 90% of the maximum rate, this many seconds per rate
        /// after an unrecorded warm-up at 50%, with `readfold run` as a
        /// child process on fresh topics (0: skip).
        #[arg(long, default_value_t = 0)]
        latency_seconds: u64,
        /// The maximum rate (records/s) the latency bench takes fractions
        /// of; 0: measure it first, as --latency-max-from says.
        #[arg(long, default_value_t = 0.0)]
        latency_max_rate: f64,
        /// Where the latency bench's maximum comes from when
        /// --latency-max-rate is 0: sustained, the highest live rate the
        /// pipeline keeps up with here, found by offering rates to the same
        /// processor before the rows; catch-up, the rate at which it
        /// catches up on a backlog of 500,000 records (no live rate).
        #[arg(long, value_enum, default_value_t = readfold::bench::MaxRateFrom::Sustained)]
        latency_max_from: readfold::bench::MaxRateFrom,
        /// Times the latency bench runs, each with a processor and topics
        /// of its own, at the same rates; each row shows its median run by
        /// the report-to-changelog p99, and the lines below every run's p99
        #[arg(long, default_value_t = 1)]
        latency_runs: usize,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match Config::load(cli.config.as_deref()) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("readfold: {}", Error::from(e));
            return ExitCode::FAILURE;
        }
    };
    let demo = matches!(cli.command, Command::Demo);
    let level = if demo && cli.log == tracing::Level::INFO {
        tracing::Level::WARN
    } else {
        cli.log
    };
    let logs = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr);
    let format = config.log.format;
    match format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
    match real_main(cli, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Shippers of JSON logs get the reason as one more JSON line.
            match format {
                LogFormat::Json => tracing::error!(error = %e, "exiting"),
                LogFormat::Text => eprintln!("readfold: {e}"),
            }
            ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli, config: Config) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    match cli.command {
        Command::Run => runtime.block_on(readfold::run::run(config)),
        Command::Serve => runtime.block_on(readfold::serve::serve(config)),
        Command::Gateway => runtime.block_on(readfold::gateway::gateway(config)),
        Command::Openapi => {
            let doc = readfold_serve::openapi()
                .to_pretty_json()
                .map_err(|e| Error::Run(format!("cannot print the OpenAPI document: {e}")))?;
            println!("{doc}");
            Ok(())
        }
        Command::Demo => runtime.block_on(readfold::demo::demo(config)),
        Command::Tail { topic, follow, limit } => {
            readfold::tail::tail(&config, &topic, follow, limit, |line| println!("{line}"))?;
            Ok(())
        }
        Command::Bench {
            reports,
            group_members,
            direct_chats,
            flush_every,
            memory_cursors,
            memory_shape,
            restore_cursors,
            pipeline_reports,
            serve_seconds,
            serve_connections,
            gateway_connections,
            gateway_rate,
            gateway_seconds,
            gateway_group,
            hot_group,
            replay_records,
            replay_runs,
            throughput_records,
            throughput_runs,
            throughput_peers,
            latency_seconds,
            latency_max_rate,
            latency_max_from,
            latency_runs,
            restart_cursors,
            restart_members,
            restart_cql,
        } => {
            let w = readfold::bench::Workload {
                reports,
                group_members: group_members.max(1),
                direct_chats: direct_chats.max(1),
                flush_every: flush_every.max(1),
                conversations_per_call: config.redis.conversations_per_call,
            };
            if let Some(shape) = memory_shape {
                println!("{}", readfold::bench::memory_shape(memory_cursors, shape));
                return Ok(());
            }
            // `--reports 0` skips the pure fold, to run only the others.
            if reports > 0 {
                readfold::bench::print(w, readfold::bench::run(w));
            }
            if memory_cursors > 0 {
                readfold::bench::print_memory(&readfold::bench::memory(memory_cursors)?);
                readfold::bench::print_checkpoint_codec(&readfold::bench::checkpoint_codec(memory_cursors));
            }
            if restore_cursors > 0 {
                let figures = runtime.block_on(readfold::bench::restore(&config, restore_cursors))?;
                readfold::bench::print_restore(figures);
            }
            if pipeline_reports > 0 {
                let figures = runtime.block_on(readfold::bench::pipeline(&config, pipeline_reports))?;
                readfold::bench::print_pipeline(&figures);
            }
            if serve_seconds > 0 {
                let connections = serve_connections.max(1);
                let rows = runtime.block_on(readfold::bench::serve(&config, serve_seconds, connections))?;
                readfold::bench::print_serve(&rows, connections);
            }
            if gateway_connections > 0 {
                let figures = runtime.block_on(readfold::bench::gateway(
                    &config,
                    gateway_connections,
                    gateway_group,
                    gateway_rate,
                    gateway_seconds,
                ))?;
                readfold::bench::print_gateway(&figures);
            }
            if hot_group.hot_group_seconds > 0 {
                let figures = runtime.block_on(readfold::bench::hot_group(&config, &hot_group))?;
                readfold::bench::print_hot_group(&figures);
            }
            if replay_records > 0 {
                let rows = runtime.block_on(readfold::bench::replay(&config, replay_records, replay_runs))?;
                readfold::bench::print_replay(&rows);
            }
            if throughput_records > 0 {
                let figures = runtime.block_on(readfold::bench::throughput(
                    &config,
                    throughput_records,
                    throughput_runs,
                    throughput_peers,
                ))?;
                readfold::bench::print_throughput(&figures);
            }
            if restart_cursors > 0 {
                let rows = runtime.block_on(readfold::bench::restart(
                    &config,
                    restart_cursors,
                    restart_members.max(1),
                    restart_cql,
                ))?;
                readfold::bench::print_restart(&rows, restart_members.max(1), restart_cql);
            }
            if latency_seconds > 0 {
                let runs = runtime.block_on(readfold::bench::latency_runs(
                    &config,
                    latency_seconds,
                    latency_max_rate,
                    latency_max_from,
                    latency_runs,
                ))?;
                readfold::bench::print_latency_runs(&runs);
            }
            Ok(())
        }
        Command::Replay {
            table,
            format,
            output,
            until,
            until_offsets,
            from_changelog,
            conversations,
            include_private,
            latency_max_open,
            progress,
        } => {
            let options = readfold_replay::ReplayOptions {
                table,
                format,
                output,
                until,
                until_offsets,
                from_changelog,
                conversations,
                include_private,
                latency_max_open,
                progress,
            };
            let summary = readfold_replay::replay(&config.kafka, &config.topics, &config.input, &options)
                .map_err(|e| Error::Run(format!("replay: {e}")))?;
            eprintln!("{summary}");
            Ok(())
        }
        Command::Loadgen(args) => runtime.block_on(readfold::loadgen::loadgen(&config, args)),
        Command::RawConsume => {
            let read = readfold::bench::raw_consume(&config)?;
            tracing::info!(records = read, "raw consumer read to the end and committed");
            // For the bench, which cannot see a process that has exited.
            println!("{}", readfold::bench::own_usage());
            Ok(())
        }
        Command::CheckConfig => {
            println!("{:#?}", config.topics);
            Ok(())
        }
    }
}
