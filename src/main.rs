//! The `readfold` command line.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use readfold::cli::{init_logging, Globals};
use readfold::config::{Config, LogFormat};
use readfold::error::{Error, Result};

/// Records cross threads (librdkafka's broker thread to the reader, reader
/// to fold, fold to flush) and are freed where they were not allocated,
/// which glibc's malloc serves slowly. With its `override` feature (see
/// Cargo.toml) mimalloc also serves librdkafka's and the other C
/// libraries' allocations.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "readfold",
    version,
    about = "Folds chat read reports into monotonic read cursors on Kafka"
)]
struct Cli {
    #[command(flatten)]
    globals: Globals,
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
    /// Run the badge stage until SIGTERM or SIGINT: one badge per user,
    /// from the by-user changelog, and mark-all-read.
    Badges,
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
    Replay(readfold::replay::ReplayArgs),
    /// Produce a realistic chat workload to the input topics at a constant
    /// rate, from a seed: Zipf group sizes (mostly 1:1, groups up to
    /// --max-group), sends and delayed reads, multi-device duplicates,
    /// stale reports, private receipts, joins and leaves.
    Loadgen(readfold::loadgen::LoadgenArgs),
    /// Print the effective configuration's topics and check it loads.
    CheckConfig,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let config = match cli.globals.load_config() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("readfold: {}", Error::from(e));
            return ExitCode::FAILURE;
        }
    };
    let demo = matches!(cli.command, Command::Demo);
    let level = if demo && cli.globals.log == tracing::Level::INFO {
        tracing::Level::WARN
    } else {
        cli.globals.log
    };
    let format = config.log.format;
    init_logging(level, format);
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
        Command::Badges => runtime.block_on(readfold::badges::badges(config)),
        Command::Openapi => {
            let doc = readfold_serve::openapi()
                .to_pretty_json()
                .map_err(Error::OpenApi)?;
            println!("{doc}");
            Ok(())
        }
        Command::Demo => runtime.block_on(readfold::demo::demo(config)),
        Command::Tail { topic, follow, limit } => {
            readfold::tail::tail(&config, &topic, follow, limit, |line| println!("{line}"))?;
            Ok(())
        }
        Command::Replay(args) => readfold::replay::replay(&config, args),
        Command::Loadgen(args) => runtime.block_on(readfold::loadgen::loadgen(&config, args)),
        Command::CheckConfig => {
            println!("{:#?}", config.topics);
            Ok(())
        }
    }
}
