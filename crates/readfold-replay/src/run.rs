//! A whole replay: inputs, merge, fold, table, output.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use readfold_core::ConversationId;
use readfold_kafka::{KafkaConfig, TopicsConfig};
use readfold_wire::Limits;

use crate::error::{Error, Result};
use crate::order::Merge;
use crate::output::{self, Format};
use crate::prefetch::{self, Arrival};
use crate::range::OffsetBound;
use crate::replayer::{Record, Replayer, Stats};
use crate::source::{sources, KafkaInputs};
use crate::table::{columns, TableKind, Value};
use readfold_progress::{Progress, ProgressMode};

#[derive(Clone, Debug)]
pub struct ReplayOptions {
    pub table: TableKind,
    pub format: Format,
    /// A file, or stdout when `None` or `-`.
    pub output: Option<PathBuf>,
    /// Only records with a record timestamp before this (epoch ms).
    pub until: Option<i64>,
    pub until_offsets: Vec<OffsetBound>,
    /// Rebuild from the changelog topics (public cursors and member state)
    /// instead of the inputs: the cursors table only.
    pub from_changelog: bool,
    /// Only these conversations (all when empty); read-counts needs some.
    pub conversations: Vec<String>,
    /// Private cursors and unread marks in the cursors table.
    pub include_private: bool,
    /// The latency table's memory bound, in open messages.
    pub latency_max_open: usize,
    pub progress: ProgressMode,
}

/// What a replay did.
#[derive(Clone, Debug)]
pub struct Summary {
    pub partitions: usize,
    /// Records read from the brokers, in range or not.
    pub records: u64,
    /// Records at or after `--until`, left out.
    pub after_until: u64,
    pub stats: Stats,
    pub rows: u64,
    pub elapsed: Duration,
}

impl Summary {
    pub fn records_per_sec(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rejected: u64 = self.stats.rejected.values().sum();
        write!(
            f,
            "replay: {} records from {} partitions in {:.2} s ({:.0} records/s); folded {}, rejected {}",
            self.records,
            self.partitions,
            self.elapsed.as_secs_f64(),
            self.records_per_sec(),
            self.stats.folded,
            rejected
        )?;
        if rejected > 0 {
            let reasons: Vec<String> = self
                .stats
                .rejected
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            write!(f, " ({})", reasons.join(", "))?;
        }
        if self.after_until > 0 {
            write!(f, ", {} at or after --until", self.after_until)?;
        }
        if self.stats.other_conversations > 0 {
            write!(f, ", {} of other conversations", self.stats.other_conversations)?;
        }
        write!(f, "; wrote {} rows", self.rows)
    }
}

/// Replays the input topics as `options` say and writes the table.
pub fn replay(
    kafka: &KafkaConfig,
    topics: &TopicsConfig,
    limits: &Limits,
    options: &ReplayOptions,
) -> Result<Summary> {
    let started = Instant::now();
    let conversations = options
        .conversations
        .iter()
        .map(|raw| {
            ConversationId::parse(raw, limits.max_id_bytes)
                .map_err(|e| Error::Usage(format!("--conversation {raw:?}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    if options.table == TableKind::ReadCounts && conversations.is_empty() {
        return Err(Error::Usage(
            "the read-counts table keeps every message's sender: name the conversations with --conversation"
                .into(),
        ));
    }
    if options.from_changelog && options.table != TableKind::Cursors {
        return Err(Error::Usage(
            "--from-changelog gives the cursors table only: read counts and latency need the messages, and thread cursors the replies, which only the input topics carry".into(),
        ));
    }
    let (out, partial) = open_output(options.output.as_deref(), options.format)?;
    let table_name = match options.table {
        TableKind::Cursors => "cursors",
        TableKind::ReadCounts => "read_counts",
        TableKind::Latency => "read_latency",
        TableKind::ThreadCursors => "thread_cursors",
    };
    let mut sink = output::sink(
        options.format,
        table_name,
        columns(options.table, options.include_private),
        out,
    )?;

    let inputs = KafkaInputs::open(
        kafka,
        &sources(topics, options.from_changelog),
        &options.until_offsets,
    )?;
    let partitions = inputs.partitions().len();
    let mut progress = Progress::new("replay", options.progress, inputs.total());
    let mut replayer = Replayer::new(options.table, &conversations, options.latency_max_open);
    let mut merge: Merge<Record> = Merge::new(partitions);
    let mut records = 0u64;
    let mut after_until = 0u64;
    let mut rows = 0u64;
    // The cursors do not depend on the order across partitions (every rule
    // is a max or a versioned last-writer-wins), so they are folded as
    // fetched; the latency and read-count tables, and a restore from the
    // changelogs (public records before member state), need the one order.
    let as_fetched = matches!(options.table, TableKind::Cursors | TableKind::ThreadCursors);
    let arrival = if as_fetched && !options.from_changelog {
        Arrival::AsFetched
    } else {
        Arrival::PerPartition
    };
    let (reader, mut decoded) = prefetch::split(inputs, arrival);
    std::thread::scope(|scope| -> Result<()> {
        let reading = std::thread::Builder::new()
            .name("replay-reader".into())
            .spawn_scoped(scope, || reader.run(options.until, limits))?;
        let folded = (|| -> Result<()> {
            let mut pull = |i: usize| {
                decoded.next(i, |batch| {
                    records += batch.read;
                    after_until += batch.after_until;
                    progress.add(batch.read);
                })
            };
            let mut next = || match arrival {
                Arrival::PerPartition => merge.next(&mut pull),
                Arrival::AsFetched => pull(0),
            };
            while let Some((_, record)) = next()? {
                replayer.fold(record);
                for row in replayer.take_latency_rows() {
                    sink.write(&row.values())?;
                    rows += 1;
                }
            }
            Ok(())
        })();
        // Hang up first, so that a reader blocked on us stops too.
        drop(decoded);
        let read = reading
            .join()
            .map_err(|_| Error::Consumer("the reader thread panicked".into()))?;
        // The reader's error is the cause when both failed.
        read.and(folded)
    })?;
    progress.status("writing");
    let mut write_all = |table: &mut dyn Iterator<Item = Vec<Value>>| -> Result<()> {
        for row in table {
            sink.write(&row)?;
            rows += 1;
        }
        Ok(())
    };
    match options.table {
        TableKind::Cursors => write_all(&mut replayer.cursor_rows(options.include_private))?,
        TableKind::ReadCounts => write_all(&mut replayer.read_count_rows().into_iter())?,
        TableKind::Latency => write_all(&mut replayer.finish_latency().iter().map(|r| r.values()))?,
        TableKind::ThreadCursors => write_all(&mut replayer.thread_rows(options.include_private))?,
    }
    sink.finish()?;
    if let Some((partial, path)) = partial {
        std::fs::rename(&partial, &path)?;
    }
    progress.finish();
    Ok(Summary {
        partitions,
        records,
        after_until,
        stats: replayer.stats().clone(),
        rows,
        elapsed: started.elapsed(),
    })
}

/// Where the table goes: stdout, or `<file>.partial` renamed to `<file>`
/// once complete, so a failed replay never leaves a file that looks whole.
/// Anything but a plain file (a device or a pipe such as `/dev/null`, or a
/// link such as `/dev/stdout`) is written as it is: renaming a file over it
/// would replace it (as root, `/dev/null` itself).
#[allow(clippy::type_complexity)]
fn open_output(
    path: Option<&Path>,
    format: Format,
) -> Result<(Box<dyn Write + Send>, Option<(PathBuf, PathBuf)>)> {
    match path {
        None => {}
        Some(p) if p == Path::new("-") => {}
        Some(path)
            if std::fs::symlink_metadata(path)
                .is_ok_and(|m| m.file_type().is_symlink() || (!m.is_file() && !m.is_dir())) =>
        {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| Error::Usage(format!("cannot open {}: {e}", path.display())))?;
            return Ok((Box::new(file), None));
        }
        Some(path) => {
            let mut partial = path.as_os_str().to_owned();
            partial.push(".partial");
            let partial = PathBuf::from(partial);
            let file = std::fs::File::create(&partial)
                .map_err(|e| Error::Usage(format!("cannot create {}: {e}", partial.display())))?;
            return Ok((Box::new(file), Some((partial, path.to_owned()))));
        }
    }
    if format == Format::Parquet && std::io::stdout().is_terminal() {
        return Err(Error::Usage(
            "Parquet is binary: give --output FILE, or redirect stdout".into(),
        ));
    }
    Ok((Box::new(std::io::stdout()), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_written_in_place_and_a_file_through_a_partial_one() {
        let (_, partial) = open_output(Some(Path::new("/dev/null")), Format::Jsonl).unwrap();
        assert!(partial.is_none(), "a rename would replace /dev/null");
        let dir = std::env::temp_dir().join(format!("readfold-open-output-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("cursors.jsonl");
        let (_, partial) = open_output(Some(&file), Format::Jsonl).unwrap();
        let (written, renamed) = partial.expect("a regular file goes through a partial one");
        assert_eq!(renamed, file);
        assert!(written.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
