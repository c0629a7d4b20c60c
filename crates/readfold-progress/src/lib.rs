//! Progress of a long command (`replay`, `loadgen`): a bar on a terminal
//! (records, rate, ETA), plain log lines every few seconds elsewhere (files,
//! CI, log shippers).

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How progress is shown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    /// A bar when stderr is a terminal, log lines otherwise.
    Auto,
    Bar,
    Log,
    Off,
}

impl std::str::FromStr for ProgressMode {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        match raw {
            "auto" => Ok(ProgressMode::Auto),
            "bar" => Ok(ProgressMode::Bar),
            "log" => Ok(ProgressMode::Log),
            "off" => Ok(ProgressMode::Off),
            _ => Err(format!("{raw:?} is not a progress mode: auto, bar, log or off")),
        }
    }
}

/// Records between updates: the bar and the clock are not looked at for
/// every record.
const UPDATE_EVERY: u64 = 4_096;
const LOG_EVERY: Duration = Duration::from_secs(5);

pub struct Progress {
    /// The command, at the start of the bar and of each log line.
    what: &'static str,
    bar: Option<ProgressBar>,
    log: bool,
    total: u64,
    done: u64,
    started: Instant,
    last_log: Instant,
}

impl Progress {
    /// `what`'s progress over `total` records.
    pub fn new(what: &'static str, mode: ProgressMode, total: u64) -> Self {
        let terminal = std::io::stderr().is_terminal();
        let (bar, log) = match mode {
            ProgressMode::Auto if terminal => (true, false),
            ProgressMode::Auto => (false, true),
            ProgressMode::Bar => (true, false),
            ProgressMode::Log => (false, true),
            ProgressMode::Off => (false, false),
        };
        let bar = bar.then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(8));
            bar.set_style(
                ProgressStyle::with_template(&format!(
                    "{what} {{bar:30.cyan/blue}} {{human_pos}}/{{human_len}} records  {{rate}}  ETA {{eta}}  {{msg}}"
                ))
                .expect("a valid template")
                .with_key(
                    "rate",
                    |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                        let _ = write!(w, "{:.0} records/s", state.per_sec());
                    },
                )
                .progress_chars("=> "),
            );
            bar
        });
        let now = Instant::now();
        Progress {
            what,
            bar,
            log,
            total,
            done: 0,
            started: now,
            last_log: now,
        }
    }

    /// `n` more records read.
    pub fn add(&mut self, n: u64) {
        let before = self.done / UPDATE_EVERY;
        self.done += n;
        if self.done / UPDATE_EVERY != before {
            self.update();
        }
    }

    fn update(&mut self) {
        if let Some(bar) = &self.bar {
            bar.set_position(self.done);
        }
        if self.log && self.last_log.elapsed() >= LOG_EVERY {
            self.last_log = Instant::now();
            let secs = self.started.elapsed().as_secs_f64();
            let rate = self.done as f64 / secs.max(1e-9);
            let left = self.total.saturating_sub(self.done) as f64 / rate.max(1.0);
            tracing::info!(
                "{}: {} of {} records ({:.0}%), {:.0} records/s, about {:.0} s left",
                self.what,
                self.done,
                self.total,
                100.0 * self.done as f64 / self.total.max(1) as f64,
                rate,
                left
            );
        }
    }

    /// Shows a short status next to the bar (what the replay is doing now).
    pub fn status(&self, message: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(message.to_owned());
        } else if self.log {
            tracing::info!("{}: {message}", self.what);
        }
    }

    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.set_position(self.done);
            bar.finish_with_message("done");
        }
    }
}
