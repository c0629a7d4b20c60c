//! Local state checkpoints (`state.dir`): a clean stop writes one per
//! partition; the next start loads it and reads only the changelog written
//! since. A corrupt, stale or foreign checkpoint is set aside for a full
//! restore, and never brings wrong cursors back.

use std::path::{Path, PathBuf};
use std::time::Duration;

use readfold_core::fold::{Input, PartitionState, ReadReport};
use readfold_core::Seq;
use readfold_wire::checkpoint::{self, CheckpointMeta};

use crate::kit::*;

/// The test's checkpoint folder, and the files a stopped processor left.
fn checkpoint_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn with_extension(files: &[PathBuf], extension: &str) -> Vec<PathBuf> {
    files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == extension))
        .cloned()
        .collect()
}

/// A checkpoint folder of the test's own, as the processor's setting.
fn state_dir() -> (PathBuf, String) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique("checkpoints"));
    let text = dir.display().to_string();
    (dir, text)
}

/// Seeds the two chats, folds them with checkpoints in `dir` (`vars`
/// sets that) and stops cleanly: the checkpoint that stop wrote.
async fn seeded_checkpoint(
    env: &TestEnv,
    reference: &mut Reference,
    vars: &[(&str, &str)],
    dir: &Path,
) -> PathBuf {
    let mut feed = env.feed(reference);
    feed.seed_chats("dm", "group").await;
    let mut processor = env.spawn_with("a", vars);
    env.wait_for_reference(reference, Duration::from_secs(60)).await;
    assert!(processor.terminate(Duration::from_secs(30)));
    with_extension(&checkpoint_files(dir), "checkpoint")
        .pop()
        .expect("a checkpoint")
}

/// After a stop: the one checkpoint refused was set aside, and the stop
/// wrote a new one.
fn assert_set_aside_and_written_anew(dir: &Path, what: &str) {
    let files = checkpoint_files(dir);
    assert_eq!(
        with_extension(&files, "rejected").len(),
        1,
        "{what}: set aside: {files:?}"
    );
    assert_eq!(
        with_extension(&files, "checkpoint").len(),
        1,
        "{what}: a new one at the stop: {files:?}"
    );
}

fn restored_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("restored partition state"))
        .collect()
}

/// Whether every restore in `log` took its state from a checkpoint (none
/// read a changelog whole).
fn all_restored_from_checkpoints(log: &str) -> bool {
    restored_lines(log)
        .iter()
        .all(|l| !l.contains("from_checkpoint=0"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_loads_the_checkpoint_and_reads_only_the_tail() {
    let env = TestEnv::new("checkpoint", 2).await;
    let (dir, dir_text) = state_dir();
    let vars = [("READFOLD__STATE__DIR", dir_text.as_str())];
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    feed.seed_chats("dm", "group").await;
    for u in 0..30 {
        feed.report(report("big", &format!("u{u}"), 5)).await;
    }
    let mut processor = env.spawn_with("a", &vars);
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert!(processor.terminate(Duration::from_secs(30)));
    let files = with_extension(&checkpoint_files(&dir), "checkpoint");
    assert_eq!(
        files.len(),
        2,
        "one per partition: {files:?}\n{}",
        processor.log_text()
    );
    assert!(processor.log_text().contains("checkpoint written"));

    // While it is down: more reads, and a stale duplicate.
    let mut feed = env.feed(&mut reference);
    feed.report(report("big", "u1", 9)).await;
    feed.report(report("group", "B", 3)).await;
    feed.report(report("big", "u2", 1)).await;
    let mut processor = env.spawn_with("a", &vars);
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    assert!(log.regressions().is_empty(), "{:?}", log.regressions());
    let text = processor.log_text();
    let restored = restored_lines(&text);
    assert!(!restored.is_empty(), "{text}");
    // Every cursor came from the checkpoints; the changelog gave the tail.
    assert!(
        restored.iter().all(|l| !l.contains("from_checkpoint=0")),
        "{restored:?}"
    );
    assert!(!text.contains("checkpoint not used"), "{text}");
    // A stale report after the restart does not move anything back.
    let mut feed = env.feed(&mut reference);
    feed.report(report("big", "u1", 4)).await;
    feed.report(report("big", "u3", 6)).await;
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    assert!(processor.terminate(Duration::from_secs(30)));
}

/// With CQL on, a checkpoint names the CQL store that held its whole state,
/// and a restart writing to that store snapshots only what the changelogs'
/// tails changed since: not the whole state again. A checkpoint written
/// with CQL off names none, and its restart snapshots everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_snapshots_only_what_changed_since_the_checkpoint() {
    let env = TestEnv::new("checkpoint-cql", 2).await;
    let keyspace = env.config.cql.keyspace.clone();
    let (dir, dir_text) = state_dir();
    let (other_dir, other_dir_text) = state_dir();
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    feed.seed_chats("dm", "group").await;
    for u in 0..30 {
        feed.report(report("big", &format!("u{u}"), 5)).await;
    }
    let mut processor = env.spawn_with("a", &[("READFOLD__STATE__DIR", dir_text.as_str())]);
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    let cql = wait_for_cql(&keyspace, &reference.present(), Duration::from_secs(60)).await;
    assert_eq!(cql, reference.present(), "CQL before the stop");
    assert!(processor.terminate(Duration::from_secs(30)));
    for file in with_extension(&checkpoint_files(&dir), "checkpoint") {
        let meta = checkpoint::decode_meta(&std::fs::read(&file).unwrap()).unwrap();
        let named = meta.snapshotted_to.unwrap_or_default();
        assert!(
            named.starts_with(&format!("{}#", env.config.cql.store_name())) && named.contains("cursors="),
            "{}: {named}",
            file.display()
        );
    }

    // Meanwhile another instance, with CQL off, publishes a tail that CQL
    // never sees.
    let mut feed = env.feed(&mut reference);
    feed.report(report("big", "u1", 9)).await;
    feed.report(report("group", "B", 3)).await;
    feed.report(report("big", "u2", 7)).await;
    let mut other = env.spawn_with(
        "b",
        &[
            ("READFOLD__STATE__DIR", other_dir_text.as_str()),
            ("READFOLD__CQL__ENABLED", "false"),
        ],
    );
    env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert!(other.terminate(Duration::from_secs(30)));
    assert_ne!(
        cql_cursors(&keyspace).await,
        reference.present(),
        "CQL lacks the tail"
    );
    let all_keys = reference.present().len() as f64;

    // Back from its checkpoint: the tail's keys are snapshotted, the rest
    // is not written again.
    let addr = free_local_addr();
    let mut processor = env.spawn_with(
        "a",
        &[
            ("READFOLD__STATE__DIR", dir_text.as_str()),
            ("READFOLD__METRICS__LISTEN", addr.as_str()),
        ],
    );
    let cql = wait_for_cql(&keyspace, &reference.present(), Duration::from_secs(60)).await;
    assert_eq!(cql, reference.present(), "CQL after the restart");
    let text = processor.log_text();
    assert!(all_restored_from_checkpoints(&text), "{text}");
    let written = scraped_sample(&addr, "readfold_snapshot_keys_total");
    assert!(
        (3.0..all_keys).contains(&written),
        "the three keys of the tail, not all {all_keys}: {written}"
    );
    assert_eq!(scraped_sample(&addr, "readfold_snapshot_backlog_keys"), 0.0);
    assert!(processor.terminate(Duration::from_secs(30)));

    // The other instance's checkpoint names no CQL store: with CQL on,
    // its restart snapshots every key, here into an empty keyspace.
    for file in with_extension(&checkpoint_files(&other_dir), "checkpoint") {
        let meta = checkpoint::decode_meta(&std::fs::read(&file).unwrap()).unwrap();
        assert_eq!(meta.snapshotted_to, None, "{}", file.display());
    }
    let empty = keyspace_name(&unique("it_checkpoint_cql_empty"));
    let addr = free_local_addr();
    let mut other = env.spawn_with(
        "b",
        &[
            ("READFOLD__STATE__DIR", other_dir_text.as_str()),
            ("READFOLD__METRICS__LISTEN", addr.as_str()),
            ("READFOLD__CQL__KEYSPACE", empty.as_str()),
        ],
    );
    let started = std::time::Instant::now();
    while scraped_sample(&addr, "readfold_snapshot_keys_total") < all_keys
        && started.elapsed() < Duration::from_secs(60)
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        scraped_sample(&addr, "readfold_snapshot_keys_total") >= all_keys,
        "every key snapshotted again\n{}",
        other.log_text()
    );
    let cql = wait_for_cql(&empty, &reference.present(), Duration::from_secs(60)).await;
    assert_eq!(cql, reference.present(), "CQL filled from the restored state");
    assert!(
        all_restored_from_checkpoints(&other.log_text()),
        "{}",
        other.log_text()
    );
    assert!(other.terminate(Duration::from_secs(30)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_stale_and_foreign_checkpoints_fall_back_to_a_full_restore() {
    let env = TestEnv::new("checkpoint-bad", 1).await;
    let (dir, dir_text) = state_dir();
    let vars = [("READFOLD__STATE__DIR", dir_text.as_str())];
    let mut reference = Reference::default();
    let file = seeded_checkpoint(&env, &mut reference, &vars, &dir).await;
    let good = std::fs::read(&file).unwrap();
    let meta = checkpoint::decode_meta(&good).unwrap();

    // A state no restore would give: cursor 999 for a member of "group".
    let mut wrong = PartitionState::new();
    wrong.apply(&Input::Report(ReadReport {
        conversation_id: "group".parse().unwrap(),
        user_id: "B".parse().unwrap(),
        seq: Seq(999),
        reported_at: 1,
        private: false,
    }));
    let now = now_ms();
    let bad: [(&str, Vec<u8>, &str); 5] = [
        (
            "corrupt",
            {
                let mut b = good.clone();
                let middle = b.len() / 2;
                b[middle] ^= 0x5a;
                b
            },
            "corrupt",
        ),
        (
            "beyond the changelog's end",
            checkpoint::encode(
                &CheckpointMeta {
                    public_offset: meta.public_offset + 1000,
                    written_at_ms: now,
                    ..meta.clone()
                },
                &wrong,
            )
            .unwrap(),
            "outside the changelog",
        ),
        (
            "too old",
            checkpoint::encode(
                &CheckpointMeta {
                    written_at_ms: now - 13 * 3600 * 1000,
                    ..meta.clone()
                },
                &wrong,
            )
            .unwrap(),
            "max_checkpoint_age_ms",
        ),
        (
            "of another group",
            checkpoint::encode(
                &CheckpointMeta {
                    group_id: "someone-else".into(),
                    written_at_ms: now,
                    ..meta.clone()
                },
                &wrong,
            )
            .unwrap(),
            "written for",
        ),
        (
            // As an upgrade finds the file an older readfold wrote (its
            // version is read before its checksum).
            "of the format before",
            {
                let mut b = checkpoint::encode(
                    &CheckpointMeta {
                        written_at_ms: now,
                        ..meta.clone()
                    },
                    &wrong,
                )
                .unwrap();
                b[6..8].copy_from_slice(&1u16.to_le_bytes());
                b
            },
            "format version 1",
        ),
    ];
    for (round, (what, bytes, says)) in bad.into_iter().enumerate() {
        for f in checkpoint_files(&dir) {
            std::fs::remove_file(f).unwrap();
        }
        std::fs::write(&file, &bytes).unwrap();
        let mut feed = env.feed(&mut reference);
        // Something new, so that the reference waits for this run.
        feed.report(report("dm", "B", 3 + round as i64)).await;
        let mut processor = env.spawn_with("a", &vars);
        let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
        assert_matches(&log, &reference);
        let text = processor.log_text();
        assert!(
            text.contains("checkpoint not used") && text.contains(says),
            "{what}: the checkpoint must be refused, saying {says:?}:\n{text}"
        );
        let restored = restored_lines(&text);
        // A damaged page may be found while the state is in use (the
        // restart reads only the header and the pages' checksums): then
        // that state is dropped unpublished and a full restore follows.
        // Anything else is refused before the restore.
        let full = if what == "corrupt" {
            restored.last().is_some_and(|l| l.contains("from_checkpoint=0"))
        } else {
            !restored.is_empty() && restored.iter().all(|l| l.contains("from_checkpoint=0"))
        };
        assert!(full, "{what}: a full restore:\n{text}");
        let cursor = log
            .latest()
            .get(&("group".to_owned(), "B".to_owned()))
            .cloned()
            .flatten();
        assert_ne!(
            cursor.map(|(c, _)| c),
            Some(999),
            "{what}: a wrong cursor came back"
        );
        assert!(processor.terminate(Duration::from_secs(30)));
        assert_set_aside_and_written_anew(&dir, what);
    }
}

/// A restart reads only a checkpoint's header and its pages' checksums:
/// damage in its body is found when a page is read. Here the check of every
/// page waits (`state.check_pages_after_ms`), so the first record after the
/// restart finds it: the processor publishes nothing of that state, sets
/// the file aside, starts over and restores the partition from its
/// changelog, and every cursor ends right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_a_record_finds_after_the_restart_drops_the_state_unpublished() {
    let env = TestEnv::new("checkpoint-late", 1).await;
    let (dir, dir_text) = state_dir();
    let vars = [
        ("READFOLD__STATE__DIR", dir_text.as_str()),
        ("READFOLD__STATE__CHECK_PAGES_AFTER_MS", "600000"),
    ];
    let mut reference = Reference::default();
    let file = seeded_checkpoint(&env, &mut reference, &vars, &dir).await;
    let mut bytes = std::fs::read(&file).unwrap();
    let (header, body) = checkpoint::unseal(&bytes).unwrap();
    assert!(!body.is_empty());
    // A byte of the first conversation's record: the header and the table
    // of the pages' checksums still hold, so the restart trusts the file.
    let at = 12 + header.len() + 4 + 10;
    bytes[at] ^= 0x20;
    std::fs::write(&file, &bytes).unwrap();

    let mut processor = env.spawn_with("a", &vars);
    let started = std::time::Instant::now();
    while !processor.log_text().contains("restored partition state") {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no restore:\n{}",
            processor.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let text = processor.log_text();
    let restored = restored_lines(&text);
    assert!(
        restored.iter().all(|l| !l.contains("from_checkpoint=0")),
        "the damaged checkpoint was opened, its pages unread:\n{text}"
    );
    // The first record reads the damaged page.
    let mut feed = env.feed(&mut reference);
    feed.report(report("dm", "B", 9)).await;
    feed.report(report("group", "C", 2)).await;
    let log = env.wait_for_reference(&reference, Duration::from_secs(90)).await;
    assert_matches(&log, &reference);
    assert!(log.regressions().is_empty(), "{:?}", log.regressions());
    let text = processor.log_text();
    assert!(
        text.contains("dropping uncommitted state")
            && text.contains("checkpoint not used")
            && text.contains("corrupt"),
        "the damage must be found and the state dropped:\n{text}"
    );
    let restored = restored_lines(&text);
    assert!(
        restored.len() >= 2 && restored.last().is_some_and(|l| l.contains("from_checkpoint=0")),
        "a full restore after the damage:\n{text}"
    );
    assert!(processor.terminate(Duration::from_secs(30)));
    assert_set_aside_and_written_anew(&dir, "damaged");
}

/// Rows of readfold's CQL tables with their write timestamps, as a backup
/// (sstables) keeps them: `cursors`, `conversations` and `snapshot_marks`.
struct CqlBackup {
    cursors: Vec<(String, String, i64, i64, i64)>,
    conversations: Vec<(String, i64, i64)>,
    marks: Vec<(String, i32, String, i64)>,
}

async fn cql_session(keyspace: &str) -> readfold_store::cql::CqlStore {
    readfold_store::cql::CqlStore::connect(&cql_config(keyspace))
        .await
        .expect("connect to the CQL server")
}

async fn cql_backup(keyspace: &str) -> CqlBackup {
    let store = cql_session(keyspace).await;
    let session = store.session();
    let rows = |cql: String| async move {
        session
            .query_unpaged(cql, ())
            .await
            .unwrap()
            .into_rows_result()
            .unwrap()
    };
    let cursors = rows(format!(
        "SELECT conversation_id, user_id, cursor, join_seq, WRITETIME(cursor) FROM {keyspace}.cursors"
    ))
    .await;
    let conversations = rows(format!(
        "SELECT conversation_id, latest_seq, WRITETIME(latest_seq) FROM {keyspace}.conversations"
    ))
    .await;
    let marks = rows(format!(
        "SELECT group_id, input_partition, mark, WRITETIME(mark) FROM {keyspace}.snapshot_marks"
    ))
    .await;
    CqlBackup {
        cursors: cursors.rows().unwrap().map(Result::unwrap).collect(),
        conversations: conversations.rows().unwrap().map(Result::unwrap).collect(),
        marks: marks.rows().unwrap().map(Result::unwrap).collect(),
    }
}

const READFOLD_TABLES: [&str; 4] = ["cursors", "conversations", "user_cursors", "snapshot_marks"];

async fn cql_truncate(keyspace: &str) {
    let store = cql_session(keyspace).await;
    for table in READFOLD_TABLES {
        store
            .session()
            .query_unpaged(format!("TRUNCATE {keyspace}.{table}"), ())
            .await
            .unwrap();
    }
}

/// Truncates the tables and writes the backup's rows back, each with its
/// own write timestamp.
async fn cql_restore(keyspace: &str, backup: &CqlBackup) {
    cql_truncate(keyspace).await;
    let store = cql_session(keyspace).await;
    let session = store.session();
    for (c, u, cursor, join_seq, at) in &backup.cursors {
        session
            .query_unpaged(
                format!("INSERT INTO {keyspace}.cursors (conversation_id, user_id, cursor, join_seq) VALUES (?, ?, ?, ?) USING TIMESTAMP ?"),
                (c, u, cursor, join_seq, at),
            )
            .await
            .unwrap();
    }
    for (c, latest, at) in &backup.conversations {
        session
            .query_unpaged(
                format!("INSERT INTO {keyspace}.conversations (conversation_id, latest_seq) VALUES (?, ?) USING TIMESTAMP ?"),
                (c, latest, at),
            )
            .await
            .unwrap();
    }
    for (group, partition, mark, at) in &backup.marks {
        session
            .query_unpaged(
                format!("INSERT INTO {keyspace}.snapshot_marks (group_id, input_partition, mark) VALUES (?, ?, ?) USING TIMESTAMP ?"),
                (group, partition, mark, at),
            )
            .await
            .unwrap();
    }
}

/// Runs instance "a" with `vars` until the changelog and CQL hold the
/// reference, then stops it cleanly.
async fn run_until_cql_holds(env: &TestEnv, reference: &Reference, vars: &[(&str, &str)]) {
    let minute = Duration::from_secs(60);
    let mut processor = env.spawn_with("a", vars);
    env.wait_for_reference(reference, minute).await;
    assert_eq!(
        wait_for_cql(&env.config.cql.keyspace, &reference.present(), minute).await,
        reference.present()
    );
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
}

/// Restarts instance "a" from the checkpoints in `dir_text` over a CQL
/// store that lost what they name (`what`): the state still comes from the
/// checkpoints, every key is snapshotted again, and CQL ends whole.
async fn assert_restart_snapshots_every_key(
    env: &TestEnv,
    reference: &Reference,
    dir_text: &str,
    what: &str,
) {
    let all_keys = reference.present().len() as f64;
    let addr = free_local_addr();
    let mut processor = env.spawn_with(
        "a",
        &[
            ("READFOLD__STATE__DIR", dir_text),
            ("READFOLD__METRICS__LISTEN", addr.as_str()),
        ],
    );
    let cql = wait_for_cql(
        &env.config.cql.keyspace,
        &reference.present(),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(cql, reference.present(), "CQL after the restart over {what}");
    let text = processor.log_text();
    assert!(
        all_restored_from_checkpoints(&text),
        "the state still comes from the checkpoints: {text}"
    );
    assert!(
        scraped_sample(&addr, "readfold_snapshot_keys_total") >= all_keys,
        "every key snapshotted again, not only a tail\n{text}"
    );
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
}

/// A checkpoint that names the CQL store also names the partition's
/// snapshot mark there. CQL restored from a backup taken at an earlier
/// stop, or truncated, holds another mark or none: the restart snapshots
/// every key again instead of the tail alone, and CQL ends whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cql_restored_from_a_backup_or_truncated_is_snapshotted_whole_again() {
    let env = TestEnv::new("checkpoint-cql-marks", 2).await;
    let keyspace = env.config.cql.keyspace.clone();
    let (dir, dir_text) = state_dir();
    let with_dir = [("READFOLD__STATE__DIR", dir_text.as_str())];
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    feed.seed_chats("dm", "group").await;
    for u in 0..20 {
        feed.report(report("big", &format!("u{u}"), 5)).await;
    }
    run_until_cql_holds(&env, &reference, &with_dir).await;
    let backup = cql_backup(&keyspace).await;
    assert_eq!(backup.marks.len(), 2, "a list of marks per partition");
    let listed = |mark: &str| {
        backup
            .marks
            .iter()
            .any(|(_, _, list, _)| list.split(',').any(|m| m == mark))
    };
    let named_marks = || {
        with_extension(&checkpoint_files(&dir), "checkpoint")
            .into_iter()
            .map(|file| {
                let named = checkpoint::decode_meta(&std::fs::read(&file).unwrap())
                    .unwrap()
                    .snapshotted_to;
                named
                    .as_deref()
                    .and_then(|n| n.split(" mark=").nth(1))
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect::<Vec<_>>()
    };
    let first_marks = named_marks();
    assert_eq!(first_marks.len(), 2);
    assert!(
        first_marks.iter().all(|m| listed(m)),
        "{first_marks:?} not in {:?}",
        backup.marks
    );

    // A second run moves on from its checkpoint: the backup lacks its reads.
    let mut feed = env.feed(&mut reference);
    feed.report(report("big", "u1", 9)).await;
    feed.report(report("group", "B", 3)).await;
    run_until_cql_holds(&env, &reference, &with_dir).await;
    let second_marks = named_marks();
    assert!(
        second_marks.iter().all(|m| !m.is_empty() && !listed(m)),
        "the second stop's marks {second_marks:?} are new"
    );

    // CQL restored from the backup: its marks are the first stop's.
    cql_restore(&keyspace, &backup).await;
    assert_ne!(
        cql_cursors(&keyspace).await,
        reference.present(),
        "the backup lacks the second run's reads"
    );
    assert_restart_snapshots_every_key(&env, &reference, &dir_text, "the backup").await;

    // Truncated after a clean stop: no mark at all.
    cql_truncate(&keyspace).await;
    assert_restart_snapshots_every_key(&env, &reference, &dir_text, "truncated tables").await;
}
