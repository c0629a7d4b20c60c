//! What every readfold command line (`readfold`, `readfold-bench`) shares:
//! the configuration file, the log level and how logs are written.

use std::path::PathBuf;

use crate::config::{Config, ConfigError, LogFormat};

/// The options every subcommand takes.
#[derive(clap::Args)]
pub struct Globals {
    /// Configuration file (TOML); defaults to the built-in config/default.toml.
    #[arg(long, global = true, env = "READFOLD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log level: error, warn, info, debug or trace.
    #[arg(long, global = true, default_value = "info", env = "READFOLD_LOG")]
    pub log: tracing::Level,
}

impl Globals {
    pub fn load_config(&self) -> Result<Config, ConfigError> {
        Config::load(self.config.as_deref())
    }
}

/// Logs to stderr at `level` in `format`: text (coloured on a terminal) or
/// JSON lines for log shippers.
pub fn init_logging(level: tracing::Level, format: LogFormat) {
    let logs = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs.json().with_ansi(false).init(),
    }
}
