//! Local state checkpoints on disk (`state.dir`): written for every owned
//! partition at a clean stop, once the last flush has committed; opened at
//! the next restore of that partition, which then reads only the
//! changelogs' tails. A checkpoint that cannot be trusted is set aside, with
//! a warning, for a full restore: never loaded into wrong cursors.
//!
//! Opening reads only the header and the pages' checksums: the state takes
//! each conversation in from the file when a record first touches it (see
//! `readfold_wire::checkpoint`), and a thread checks every page meanwhile.
//! A damaged page, found either way, gives the state a fault: the processor
//! then publishes nothing more of it, sets the file aside and starts over
//! from the committed offsets, restoring that partition from its changelog
//! (`Processor::drop_damaged_state`).
//!
//! Trusted means: its header and checksums hold; it was written by this
//! group for these changelog topics and partition count; it is younger than
//! `state.max_checkpoint_age_ms` (older ones may predate tombstones that
//! compaction has since deleted); and its offsets lie within the changelog
//! partitions' current [log start, end] (a changelog truncated, compacted
//! past them or recreated fails that).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use readfold_core::fold::PartitionState;
use readfold_kafka::changelog::{ChangelogEnds, LocalCheckpoint, Restorer};
use readfold_kafka::now_ms;
use readfold_store::cql::MarkList;
use readfold_wire::checkpoint::{self, CheckpointError, CheckpointMeta, ReadAt};

use crate::config::Settings;

/// Where and how this instance keeps its checkpoints.
pub struct Checkpoints {
    dir: PathBuf,
    max_age: Duration,
    /// When the check of every page starts, after a restore.
    check_after: Duration,
    group_id: String,
    public_topic: String,
    state_topic: String,
    partition_count: i32,
    max_id_bytes: usize,
    /// The CQL store written to, named (`None` with CQL off): a checkpoint
    /// that names it, with the partition's snapshot mark the store still
    /// holds, spares the restart a snapshot of the whole state.
    cql_store: Option<String>,
}

impl Checkpoints {
    /// `None` when `state.dir` is empty (no checkpoints). `cql_store`: the
    /// CQL store written to, named (`CqlStore::store_name`), if any.
    pub fn new(settings: &Settings, partition_count: i32, cql_store: Option<String>) -> Option<Checkpoints> {
        if settings.state.dir.is_empty() {
            return None;
        }
        // One folder per instance: two instances on one machine never
        // share a file.
        let dir = Path::new(&settings.state.dir)
            .join(path_segment(&settings.kafka.group_id))
            .join(path_segment(&settings.kafka.instance_id()));
        Some(Checkpoints {
            dir,
            max_age: Duration::from_millis(settings.state.max_checkpoint_age_ms),
            check_after: Duration::from_millis(settings.state.check_pages_after_ms),
            group_id: settings.kafka.group_id.clone(),
            public_topic: settings.topics.read_cursors.clone(),
            state_topic: settings.topics.member_state.clone(),
            partition_count,
            max_id_bytes: settings.input.max_id_bytes,
            cql_store,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, partition: i32) -> PathBuf {
        self.dir.join(format!("partition-{partition}.checkpoint"))
    }

    /// The checkpoints of `partitions` that can be trusted, opened, with
    /// one look at the changelogs' ends for all of them; a thread then
    /// checks every page of them. `cql_marks`: the CQL store's list of
    /// snapshot marks of each partition (`CqlStore::snapshot_marks`).
    /// Blocking (file and broker I/O).
    pub fn load(
        &self,
        partitions: &[i32],
        restorer: &Restorer,
        cql_marks: &BTreeMap<i32, String>,
    ) -> Vec<(i32, LocalCheckpoint)> {
        let found: Vec<(i32, PathBuf)> = partitions
            .iter()
            .map(|&partition| (partition, self.path(partition)))
            .filter(|(_, path)| match std::fs::metadata(path) {
                Ok(_) => true,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot read the checkpoint; restoring from the changelog");
                    false
                }
            })
            .collect();
        if found.is_empty() {
            return Vec::new();
        }
        let with_files: Vec<i32> = found.iter().map(|(p, _)| *p).collect();
        let ends = ends_of(restorer, &with_files);
        let mut opened = Vec::new();
        let loaded = found
            .iter()
            .filter_map(|(partition, path)| {
                let file = match CheckpointFile::open(path) {
                    Ok(file) => file,
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "cannot read the checkpoint; restoring from the changelog");
                        return None;
                    }
                };
                match self.check(*partition, file, &ends, cql_marks.get(partition)) {
                    Ok((checkpoint, file)) => {
                        opened.push((*partition, file));
                        Some((*partition, checkpoint))
                    }
                    Err(why) => {
                        self.set_aside(*partition, &why);
                        None
                    }
                }
            })
            .collect();
        check_every_page(opened, self.check_after);
        loaded
    }

    /// Opens the checkpoint in `file` if it can be trusted: the state over
    /// it, and the checkpoint itself, to check every page of.
    fn check(
        &self,
        partition: i32,
        file: CheckpointFile,
        ends: &BTreeMap<i32, Result<ChangelogEnds, String>>,
        cql_marks: Option<&String>,
    ) -> Result<(LocalCheckpoint, Arc<checkpoint::Checkpoint<CheckpointFile>>), String> {
        let opened = checkpoint::open(file, self.max_id_bytes).map_err(|e| match e {
            // An upgrade's first start: not damage.
            CheckpointError::Version(_) => format!("{e}"),
            _ => format!("corrupt: {e}"),
        })?;
        let meta = &opened.meta;
        let expected = (
            self.group_id.as_str(),
            self.public_topic.as_str(),
            self.state_topic.as_str(),
            partition,
            self.partition_count,
        );
        let found = (
            meta.group_id.as_str(),
            meta.public_topic.as_str(),
            meta.state_topic.as_str(),
            meta.partition,
            meta.partition_count,
        );
        if found != expected {
            return Err(format!("written for {found:?}, not {expected:?}"));
        }
        let age_ms = now_ms().saturating_sub(meta.written_at_ms);
        if age_ms < 0 || age_ms as u128 > self.max_age.as_millis() {
            return Err(format!(
                "stale: written {age_ms} ms ago, beyond state.max_checkpoint_age_ms ({} ms)",
                self.max_age.as_millis()
            ));
        }
        let ((public_start, public_end), (state_start, state_end)) = ends
            .get(&partition)
            .cloned()
            .unwrap_or_else(|| Err("no answer for its partition".into()))
            .map_err(|e| format!("cannot check its offsets: {e}"))?;
        for (topic, offset, start, end) in [
            (&self.public_topic, meta.public_offset, public_start, public_end),
            (&self.state_topic, meta.state_offset, state_start, state_end),
        ] {
            if offset < start || offset > end {
                return Err(format!(
                    "stale: it covers {topic}[{partition}] up to offset {offset}, outside the changelog's [{start}, {end}] \
                     (truncated, compacted past it, or recreated)"
                ));
            }
        }
        let (public_offset, state_offset) = (meta.public_offset, meta.state_offset);
        // The store it names, and the mark of the stop that wrote it, which
        // CQL still lists if it held the partition whole ever since.
        let named_mark = self.cql_store.as_ref().and_then(|store| {
            meta.snapshotted_to
                .as_deref()?
                .strip_prefix(store.as_str())?
                .strip_prefix(" mark=")
        });
        let in_cql = match (named_mark, cql_marks) {
            (Some(mark), Some(marks)) => MarkList::parse(marks).contains(mark),
            _ => false,
        };
        let opened = Arc::new(opened);
        let checkpoint = LocalCheckpoint {
            state: Arc::clone(&opened).state(),
            public_offset,
            state_offset,
            in_cql,
            member_states: Vec::new(),
        };
        Ok((checkpoint, opened))
    }

    /// The CQL store written to, named with a partition's snapshot mark: what
    /// a checkpoint names when the store held all of that partition.
    fn cql_store_marked(&self, mark: Option<&String>) -> Option<String> {
        Some(format!("{} mark={}", self.cql_store.as_ref()?, mark?))
    }

    /// [`Checkpoints::set_aside`] for a checkpoint found damaged.
    pub fn set_aside_corrupt(&self, partition: i32, damage: &dyn std::fmt::Display) {
        self.set_aside(partition, &format!("corrupt: {damage}"));
    }

    /// Moves the checkpoint of `partition`, which cannot be trusted, out of
    /// the way (kept for a look, not loaded again), saying why.
    fn set_aside(&self, partition: i32, why: &str) {
        let path = self.path(partition);
        tracing::warn!(path = %path.display(), partition, reason = %why, "checkpoint not used; restoring the whole changelog");
        let aside = path.with_extension("rejected");
        if let Err(e) = std::fs::rename(&path, &aside) {
            tracing::warn!(path = %path.display(), error = %e, "cannot set the checkpoint aside");
        }
    }

    /// Writes a checkpoint of each partition's state, which must be wholly
    /// flushed, up to the changelogs' current ends (one look for all of
    /// them). A failure is logged: it only costs the next start a full
    /// restore of that partition. Blocking.
    pub fn save<'a>(&self, states: impl IntoIterator<Item = Saved<'a>>, restorer: &Restorer) {
        let states: Vec<Saved<'_>> = states.into_iter().collect();
        let partitions: Vec<i32> = states.iter().map(|s| s.partition).collect();
        if states.is_empty() {
            return;
        }
        let ends = ends_of(restorer, &partitions);
        // A stop waits for this: the partitions are encoded and written
        // (each synced) as they are loaded.
        side_by_side(&states, |chunk| {
            for saved in chunk {
                if let Err(e) = self.save_at_ends(saved, &ends) {
                    tracing::warn!(partition = saved.partition, error = %e, "cannot write the checkpoint");
                }
            }
            Vec::<()>::new()
        });
    }

    fn save_at_ends(
        &self,
        saved: &Saved<'_>,
        ends: &BTreeMap<i32, Result<ChangelogEnds, String>>,
    ) -> Result<(), String> {
        match ends.get(&saved.partition) {
            Some(Ok(((_, public_end), (_, state_end)))) => self.save_one(saved, *public_end, *state_end),
            Some(Err(e)) => Err(format!("cannot read the changelogs' ends: {e}")),
            None => Err("cannot read the changelogs' ends: no answer for its partition".into()),
        }
    }

    fn save_one(&self, saved: &Saved<'_>, public_end: i64, state_end: i64) -> Result<(), String> {
        let Saved {
            partition,
            state,
            cql_mark,
        } = *saved;
        let started = Instant::now();
        let meta = CheckpointMeta {
            group_id: self.group_id.clone(),
            public_topic: self.public_topic.clone(),
            state_topic: self.state_topic.clone(),
            partition,
            partition_count: self.partition_count,
            public_offset: public_end,
            state_offset: state_end,
            written_at_ms: now_ms(),
            snapshotted_to: self.cql_store_marked(cql_mark),
        };
        let bytes = match checkpoint::encode(&meta, state) {
            Ok(bytes) => bytes,
            Err(e) => {
                // The checkpoint it was restored from is damaged where no
                // record had touched it.
                self.set_aside_corrupt(partition, &e);
                return Err(format!("not written: {e}"));
            }
        };
        let path = self.path(partition);
        write_atomically(&path, &bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        tracing::info!(
            partition,
            cursors = state.cursor_count(),
            bytes = bytes.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            path = %path.display(),
            "checkpoint written"
        );
        Ok(())
    }
}

/// One partition's state to checkpoint.
#[derive(Clone, Copy)]
pub struct Saved<'a> {
    pub partition: i32,
    pub state: &'a PartitionState,
    /// When CQL holds every key of it (no snapshot owes any), the snapshot
    /// mark just written for it there.
    pub cql_mark: Option<&'a String>,
}

/// A checkpoint file, read at offsets as the state takes conversations in.
pub struct CheckpointFile {
    file: File,
    size: u64,
}

impl CheckpointFile {
    pub fn open(path: &Path) -> std::io::Result<CheckpointFile> {
        let file = File::open(path)?;
        let size = file.metadata()?.len();
        Ok(CheckpointFile { file, size })
    }
}

impl ReadAt for CheckpointFile {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
}

/// Checks every page of the checkpoints `opened`, one after another, on a
/// thread of its own: damage where no record touches is found too, within
/// moments of the start rather than at the stop. A fault goes to the state
/// over the checkpoint ([`PartitionState::stored_fault`]); the processor
/// acts on it.
fn check_every_page(opened: Vec<(i32, Arc<checkpoint::Checkpoint<CheckpointFile>>)>, after: Duration) {
    if opened.is_empty() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("checkpoint-check".into())
        .spawn(move || {
            std::thread::sleep(after);
            let started = Instant::now();
            let (mut pages, mut damaged) = (0, 0);
            for (partition, checkpoint) in opened {
                pages += checkpoint.page_count();
                if let Err(e) = checkpoint.check_all() {
                    damaged += 1;
                    tracing::warn!(partition, error = %e, "the checkpoint restored from is damaged");
                }
            }
            tracing::info!(
                pages,
                damaged,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "checked every page of the checkpoints restored from"
            );
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the checkpoints' check; damage is found as pages are read");
    }
}

/// `work` on `items` side by side, a share per core, the results in the
/// items' order: saving checkpoints is CPU (encoding, and reading what a
/// state never took in from its old file) and I/O per partition, and a
/// stop waits for all of it.
fn side_by_side<T: Sync, R: Send>(items: &[T], work: impl Fn(&[T]) -> Vec<R> + Sync) -> Vec<R> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let share = items.len().div_ceil(workers).max(1);
    let work = &work;
    std::thread::scope(|scope| {
        let shares: Vec<_> = items
            .chunks(share)
            .map(|chunk| scope.spawn(move || work(chunk)))
            .collect();
        shares
            .into_iter()
            .flat_map(|share| {
                share
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect()
    })
}

/// The changelogs' ends of `partitions`, all asked at once; if that fails,
/// each partition is asked alone, so that one partition without an answer
/// costs only its own checkpoint.
fn ends_of(restorer: &Restorer, partitions: &[i32]) -> BTreeMap<i32, Result<ChangelogEnds, String>> {
    match restorer.watermarks(partitions) {
        Ok(ends) => ends.into_iter().map(|(p, e)| (p, Ok(e))).collect(),
        Err(_) => partitions
            .iter()
            .map(|&p| {
                let ends = restorer
                    .watermarks(&[p])
                    .map_err(|e| e.to_string())
                    .and_then(|mut found| found.remove(&p).ok_or_else(|| "no answer".to_owned()));
                (p, ends)
            })
            .collect(),
    }
}

/// Write to a temporary file, sync, rename: a crash leaves the old file or
/// the new one, never half of one.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// A group or instance name as a file name: anything but letters, digits,
/// `.`, `_` and `-` becomes `_`.
fn path_segment(name: &str) -> String {
    let segment: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    match segment.as_str() {
        "" | "." | ".." => format!("_{segment}"),
        _ => segment,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_safe_file_names() {
        assert_eq!(path_segment("readfold"), "readfold");
        assert_eq!(path_segment("a/b c"), "a_b_c");
        assert_eq!(path_segment(".."), "_..");
        assert_eq!(path_segment(""), "_");
    }
}
