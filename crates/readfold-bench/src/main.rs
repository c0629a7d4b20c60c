//! The `readfold-bench` command line: one subcommand per bench. The benches
//! that run `readfold` commands as child processes take the `readfold`
//! binary built next to this one.

mod badge_stage;
mod checkpoint;
mod child;
mod error;
mod fold;
mod fresh;
mod gateway;
mod held;
mod hot_group;
mod kstreams_peer;
mod latency;
mod memory;
mod pipeline;
mod raw_consumer;
mod rebalance;
mod replay;
mod restart;
mod restore;
mod run_queue;
mod seed_design;
mod serve;
mod server_cpu;
mod stats;
mod sustained;
mod throughput;
mod workload;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use readfold::cli::{init_logging, Globals};
use readfold::config::Config;

use crate::error::{Error, Result};

/// `readfold`'s allocator: the in-process benches and the raw consumer
/// process measure what readfold's own process would.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "readfold-bench",
    version,
    about = "Measures readfold: the pure fold, memory, and the processor, query API, gateway, replay and restarts on the configured services"
)]
struct Cli {
    #[command(flatten)]
    globals: Globals,
    #[command(subcommand)]
    bench: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// The pure fold on one core: reports/s, changelog encoding and
    /// decoding, and the writes per report after coalescing. No I/O.
    Fold(fold::Args),
    /// Resident memory per cursor of one partition's state, in four shapes,
    /// and the local checkpoint's encoding, opening and reading of such a
    /// state. No I/O.
    ///
    /// Each shape is built in a process of its own, so that memory freed by
    /// one does not hide the growth of the next.
    Memory(memory::Args),
    /// Restore rate: cursors/s restored from a changelog topic written on
    /// the configured broker.
    Restore(restore::Args),
    /// Reports/s and report-to-changelog latency through the whole pipeline
    /// in this process, on the configured Kafka, Redis and CQL.
    Pipeline(pipeline::Args),
    /// The query API (`readfold serve` as a child process): requests/s and
    /// latency per scenario, against the configured Redis.
    Serve(serve::Args),
    /// The push gateway with WebSocket clients held open: its memory per
    /// connection, receipt-to-push latency and frames delivered.
    ///
    /// `readfold run` and `readfold gateway` are child processes on fresh
    /// topics; receipts go out at a fixed rate on the clients' own
    /// connections.
    Gateway(gateway::Args),
    /// One big group with every member online on protocol v2, beside
    /// connections in small chats: receipt-to-ack, receipt-to-visible,
    /// receipt-to-push, frames and bytes per client, each process's cores
    /// and the gateway's memory per connection.
    ///
    /// `readfold run` and `readfold gateway` are child processes on fresh
    /// topics. With `--members 0` it only holds the small chats'
    /// connections.
    HotGroup(hot_group::Args),
    /// Whether the badge stage (`readfold badges`) keeps up with the first
    /// stage: each one's records, CPU per record and lag, at each offered
    /// rate of loadgen's workload.
    ///
    /// `readfold run` and `readfold badges` are child processes on fresh
    /// topics.
    BadgeStage(badge_stage::Args),
    /// `readfold replay` records/s of the cursors and latency tables, next
    /// to a raw read of the same records, produced onto fresh topics.
    Replay(replay::Args),
    /// How fast `readfold run` catches up on a backlog, sinks off and on,
    /// next to raw reads, the seed design's consumer and a Kafka Streams
    /// peer.
    ///
    /// Each is timed from its start until its group's committed offsets
    /// (the peer: its output) reach the end of the backlog, with its CPU
    /// time, peak memory and sink calls, and what Redis and a local broker
    /// spent meanwhile.
    Throughput(throughput::Args),
    /// `readfold run` from start to ready after a clean stop, restoring the
    /// whole changelog vs a local checkpoint plus the tail, at a quarter,
    /// half and all of the cursors.
    ///
    /// Each restart is also timed until a read sent while the process was
    /// down is committed, and with `--cql true` until CQL holds the
    /// restored state again.
    Restart(restart::Args),
    /// Report-to-changelog and report-to-Redis latency at 10% to 90% of a
    /// maximum rate, with `readfold run` as a child process on fresh
    /// topics, and the cores each process used and waited for.
    Latency(latency::Args),
    /// Scaling `readfold run` 1 -> 3 -> 1 instances under a steady load,
    /// under the classic and the consumer (KIP-848) group protocols side by
    /// side: how long each partition stops, and report-to-changelog latency
    /// during the moves.
    Rebalance(rebalance::Args),
    /// Internal (the throughput bench's child): read both inputs to their
    /// end as a plain group consumer, commit, and exit.
    #[command(hide = true)]
    RawConsume,
    /// Internal (the memory bench's child): build one shape and print its
    /// figure.
    #[command(hide = true)]
    MemoryShape(memory::ShapeArgs),
    /// Internal (the hot-group bench's child): hold idle connections in
    /// small chats until killed.
    #[command(hide = true)]
    HoldConnections(held::Args),
}

impl Bench {
    /// Whether the bench runs `readfold` commands as child processes.
    fn runs_readfold(&self) -> bool {
        matches!(
            self,
            Bench::Serve(_)
                | Bench::Gateway(_)
                | Bench::HotGroup(_)
                | Bench::Throughput(_)
                | Bench::Restart(_)
                | Bench::Latency(_)
                | Bench::Rebalance(_)
                | Bench::BadgeStage(_)
        )
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match cli.globals.load_config() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("readfold-bench: {}", Error::from(e));
            return ExitCode::FAILURE;
        }
    };
    init_logging(cli.globals.log, config.log.format);
    match run(cli.bench, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("readfold-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(bench: Bench, config: Config) -> Result<()> {
    // Before any topic is made: a bench that cannot start its children
    // fails at once.
    if bench.runs_readfold() {
        child::readfold_exe()?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)?;
    match bench {
        Bench::Fold(args) => {
            let w = fold::Workload::new(&args, config.redis.conversations_per_call);
            fold::print(w, fold::run(w));
        }
        Bench::Memory(args) => {
            memory::print_memory(&memory::memory(args.cursors)?);
            checkpoint::print_checkpoint_codec(&checkpoint::checkpoint_codec(args.cursors));
        }
        Bench::Restore(args) => {
            restore::print_restore(runtime.block_on(restore::restore(
                &config,
                args.cursors,
                args.thread_cursors,
            ))?);
        }
        Bench::Pipeline(args) => {
            pipeline::print_pipeline(&runtime.block_on(pipeline::pipeline(&config, args.reports))?);
        }
        Bench::Serve(args) => {
            serve::print_serve(&runtime.block_on(serve::serve(&config, &args))?, &args);
        }
        Bench::Gateway(args) => {
            gateway::print_gateway(&runtime.block_on(gateway::gateway(&config, &args))?);
        }
        Bench::HotGroup(args) => {
            hot_group::print_hot_group(&runtime.block_on(hot_group::hot_group(&config, &args))?);
        }
        Bench::BadgeStage(args) => {
            badge_stage::print_badge_stage(&runtime.block_on(badge_stage::badge_stage(&config, &args))?);
        }
        Bench::Replay(args) => {
            replay::print_replay(&runtime.block_on(replay::replay(&config, &args))?);
        }
        Bench::Throughput(args) => {
            throughput::print_throughput(&runtime.block_on(throughput::throughput(&config, &args))?);
        }
        Bench::Restart(args) => {
            restart::print_restart(&runtime.block_on(restart::restart(&config, &args))?, &args);
        }
        Bench::Rebalance(args) => {
            let runs = runtime.block_on(rebalance::rebalance(&config, &args))?;
            rebalance::print_rebalance(&args, &runs);
        }
        Bench::Latency(args) => {
            latency::print_latency_runs(&runtime.block_on(latency::latency_runs(&config, &args))?);
        }
        Bench::RawConsume => {
            let read = raw_consumer::raw_consume(&config)?;
            tracing::info!(records = read, "raw consumer read to the end and committed");
            // For the bench, which cannot see a process that has exited.
            println!("{}", raw_consumer::own_usage());
        }
        Bench::HoldConnections(args) => runtime.block_on(held::hold(args))?,
        Bench::MemoryShape(args) => println!("{}", memory::memory_shape(args.cursors, args.shape)),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_bench_takes_its_own_flags_with_their_defaults() {
        let parse =
            |args: &[&str]| Cli::try_parse_from(["readfold-bench"].iter().chain(args)).map(|cli| cli.bench);
        let Ok(Bench::HotGroup(hot)) = parse(&["hot-group", "--seconds", "15"]) else {
            panic!("hot-group parses");
        };
        assert_eq!((hot.seconds, hot.members, hot.rates), (15, 3000, vec![300, 1000]));
        let Ok(Bench::Throughput(t)) = parse(&["throughput", "--records", "1000", "--peers", "false"]) else {
            panic!("throughput parses");
        };
        assert_eq!((t.records, t.runs, t.peers), (1000, 1, false));
        assert!(parse(&["restart"]).is_err(), "the size is required");
        assert!(parse(&["fold", "--hot-group-seconds", "15"]).is_err());
    }
}
