//! `readfold replay` against the real broker: to the end it agrees with the
//! live changelog, to a time it agrees with the reference fold of the
//! records before that time, its output is byte-identical run after run,
//! and its Parquet and CSV read back in DuckDB as its JSON lines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::kit::changelog::{Cursor, Key};
use crate::kit::env::TestEnv;
use crate::kit::load::{produce_mixed_load, random_records};
use crate::kit::reference::Reference;
use crate::kit::services::now_ms;
use crate::kit::terminal::tmux_screens;

fn out_dir(test: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("replay")
        .join(test);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn json_lines(bytes: &[u8]) -> Vec<Value> {
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

/// The cursors table as the changelog compares: present members as
/// (cursor, join_seq), departed ones as `None`.
fn as_changelog(rows: &[Value]) -> BTreeMap<Key, Cursor> {
    rows.iter()
        .map(|r| {
            let key = (
                r["conversation"].as_str().unwrap().to_owned(),
                r["user"].as_str().unwrap().to_owned(),
            );
            let value = r["present"]
                .as_bool()
                .unwrap()
                .then(|| (r["cursor"].as_i64().unwrap(), r["join_seq"].as_i64().unwrap()));
            (key, value)
        })
        .collect()
}

/// The private cursor and unread mark of every member but the `departed`,
/// from the cursors table with `--include-private`. (A departed member's
/// last cursor is in no changelog, a tombstone carries none, so whether
/// their old mark still holds is only known from the inputs.)
fn private_state(rows: &[Value], departed: &[Key]) -> BTreeMap<Key, (i64, bool)> {
    rows.iter()
        .map(|r| {
            let key = (
                r["conversation"].as_str().unwrap().to_owned(),
                r["user"].as_str().unwrap().to_owned(),
            );
            (key, r)
        })
        .filter(|(key, _)| !departed.contains(key))
        .map(|(key, r)| {
            (
                key,
                (
                    r["private_cursor"].as_i64().unwrap(),
                    r["marked_unread"].as_bool().unwrap(),
                ),
            )
        })
        .collect()
}

/// A file read by DuckDB (an independent reader, from PyPI), as JSON rows.
fn duckdb_rows(sql_source: &str) -> Vec<Value> {
    let script = format!(
        "import duckdb, json\n\
         rel = duckdb.sql(\"select * from {sql_source}\")\n\
         for row in rel.fetchall():\n    print(json.dumps(dict(zip(rel.columns, row))))\n"
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "DuckDB could not read {sql_source} (scripts/dev test installs duckdb from PyPI): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_lines(&out.stdout)
}

fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_to_the_end_equals_the_live_changelog_every_time_and_in_every_format() {
    let env = TestEnv::new("replay-end", 3).await;
    let load = produce_mixed_load(&env, Duration::from_secs(3), 0x5e1a).await;
    let mut processor = env.spawn("a");
    let log = env
        .wait_for_reference(&load.reference, Duration::from_secs(60))
        .await;
    assert_eq!(
        log.latest(),
        load.reference.expected(),
        "the live processor is behind"
    );
    processor.terminate(Duration::from_secs(20));

    let dir = out_dir("end");
    let jsonl = dir.join("cursors.jsonl");
    let (_, stderr) = env
        .run_command(&["replay", "--progress", "log", "--output", path_str(&jsonl)])
        .await;
    assert!(
        stderr.contains(&format!("rejected {}", load.bad)),
        "every garbage record is counted as the processor dead-lettered it:\n{stderr}"
    );
    let first = std::fs::read(&jsonl).unwrap();
    let rows = json_lines(&first);
    assert_eq!(
        as_changelog(&rows),
        log.latest(),
        "replay to the end = live changelog"
    );

    // The changelogs, replayed as a restore reads them, give the same
    // cursors, and the same private state as the inputs.
    let (stdout, _) = env
        .run_command(&["replay", "--from-changelog", "--progress", "off"])
        .await;
    assert_eq!(
        as_changelog(&json_lines(&stdout)),
        log.latest(),
        "replay of the changelogs = live changelog"
    );
    let (restored, _) = env
        .run_command(&[
            "replay",
            "--from-changelog",
            "--include-private",
            "--progress",
            "off",
        ])
        .await;
    let (folded, _) = env
        .run_command(&["replay", "--include-private", "--progress", "off"])
        .await;
    let departed: Vec<Key> = log
        .latest()
        .into_iter()
        .filter_map(|(k, v)| v.is_none().then_some(k))
        .collect();
    let (restored, folded) = (
        private_state(&json_lines(&restored), &departed),
        private_state(&json_lines(&folded), &departed),
    );
    let differ: Vec<_> = restored
        .keys()
        .chain(folded.keys())
        .filter(|k| restored.get(*k) != folded.get(*k))
        .map(|k| (k, restored.get(k), folded.get(k)))
        .collect();
    assert!(
        differ.is_empty(),
        "private state, from the changelogs vs the inputs: {differ:?}"
    );

    // Byte-identical on a second run, and the same to stdout.
    let (stdout, _) = env.run_command(&["replay", "--progress", "off"]).await;
    assert_eq!(stdout, first, "the same range gives the same bytes");

    // Parquet and CSV read back by DuckDB equal the JSON lines.
    let parquet = dir.join("cursors.parquet");
    let (_, stderr) = env
        .run_command(&["replay", "--format", "parquet", "--output", path_str(&parquet)])
        .await;
    assert!(stderr.contains(&format!("wrote {} rows", rows.len())), "{stderr}");
    let again = dir.join("again.parquet");
    env.run_command(&["replay", "--format", "parquet", "--output", path_str(&again)])
        .await;
    assert_eq!(std::fs::read(&parquet).unwrap(), std::fs::read(&again).unwrap());
    assert!(!dir.join("cursors.parquet.partial").exists());
    assert_eq!(
        duckdb_rows(&format!("read_parquet('{}')", path_str(&parquet))),
        rows
    );
    let csv = dir.join("cursors.csv");
    env.run_command(&["replay", "--format", "csv", "--output", path_str(&csv)])
        .await;
    assert_eq!(duckdb_rows(&format!("read_csv('{}')", path_str(&csv))), rows);

    run_the_documented_recipes(&env, &dir).await;
    a_terminal_shows_a_progress_bar(&env, &dir, rows.len()).await;
}

/// Runs replay in a tmux pane, as a person at a terminal would, and reads
/// the screen: a bar with records, rate and ETA, then the summary.
async fn a_terminal_shows_a_progress_bar(env: &TestEnv, dir: &Path, rows: usize) {
    let vars: String = env.vars().iter().map(|(k, v)| format!("{k}='{v}' ")).collect();
    let command = format!(
        "env {vars} {} replay --output {}",
        env!("CARGO_BIN_EXE_readfold"),
        path_str(&dir.join("tmux.jsonl"))
    );
    let screens = tmux_screens("replay", &command, "wrote").await;
    let screen = screens.last().unwrap();
    let bar = screen
        .lines()
        .find(|l| l.starts_with("replay ") && l.contains("ETA"))
        .unwrap_or_else(|| panic!("no progress bar on the screen:\n{screen}"));
    assert!(bar.contains("records") && bar.contains('='), "{bar}");
    assert!(
        screen.contains(&format!("wrote {rows} rows")),
        "the summary follows the bar:\n{screen}"
    );
}

/// Runs the analyst recipes of docs/replay.md as written: each `readfold
/// replay` line, then each DuckDB query on the files they wrote.
async fn run_the_documented_recipes(env: &TestEnv, dir: &Path) {
    let doc = include_str!("../../docs/replay.md");
    let section = doc
        .split("\n## Recipes\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("the recipes section of docs/replay.md");
    let (mut replays, mut queries) = (0, 0);
    for line in section.lines() {
        if line.contains('[') {
            continue; // the synopsis
        }
        if let Some(args) = line.strip_prefix("readfold replay ") {
            let mut args: Vec<String> = args.split_whitespace().map(str::to_owned).collect();
            // Write where the queries will look.
            if let Some(i) = args.iter().position(|a| a == "--output") {
                args[i + 1] = path_str(&dir.join(&args[i + 1])).to_owned();
            }
            let mut all = vec!["replay"];
            all.extend(args.iter().map(String::as_str));
            env.run_command(&all).await;
            replays += 1;
        } else if let Some(query) = line.strip_prefix("duckdb -c \"") {
            let query = query.strip_suffix('"').expect("a quoted query");
            let script = format!("import duckdb\nduckdb.sql({query:?}).fetchall()\n");
            let out = std::process::Command::new("python3")
                .args(["-c", &script])
                .current_dir(dir)
                .output()
                .expect("python3");
            assert!(
                out.status.success(),
                "docs/replay.md query failed: {query}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            queries += 1;
        }
    }
    assert_eq!((replays, queries), (3, 3), "docs/replay.md has three recipes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_until_a_time_equals_the_reference_fold_of_the_records_before_it() {
    let env = TestEnv::new("replay-until", 3).await;
    let producer = env.producer();
    let mut before = Reference::default();
    let (reports, events) = random_records(&mut before, 0xbef0, 4_000, 12, 8);
    producer.send_many(&reports, &events).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let until = now_ms();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut after = Reference::default();
    let (reports, events) = random_records(&mut after, 0xaf7e, 4_000, 12, 8);
    producer.send_many(&reports, &events).await.unwrap();

    let until = until.to_string();
    let (stdout, stderr) = env
        .run_command(&["replay", "--until", &until, "--progress", "off"])
        .await;
    let rows = json_lines(&stdout);
    assert_eq!(
        as_changelog(&rows),
        before.expected(),
        "replay to T = reference fold before T"
    );
    assert!(stderr.contains("8000 records"), "{stderr}");
    assert!(stderr.contains("4000 at or after --until"), "{stderr}");

    // Read counts of one conversation by the read model over the reference.
    let (stdout, stderr) = env
        .run_command(&[
            "replay",
            "--until",
            &until,
            "--table",
            "read-counts",
            "--conversation",
            "conv-3",
            "--progress",
            "off",
        ])
        .await;
    let counts = json_lines(&stdout);
    assert!(!counts.is_empty(), "{stderr}");
    for row in &counts {
        assert_eq!(row["conversation"], "conv-3");
        let (seq, sender) = (row["seq"].as_u64().unwrap(), row["sender"].as_str().unwrap());
        assert_eq!(
            row["read_count"].as_u64().unwrap() as usize,
            before.read_count("conv-3", seq, sender),
            "{row}"
        );
        assert!(row["read_count"].as_u64() <= row["possible_readers"].as_u64());
    }

    // The latency table: consistent rows, and Parquet = JSON with nulls.
    let dir = out_dir("until");
    let parquet = dir.join("latency.parquet");
    let (stdout, _) = env
        .run_command(&[
            "replay",
            "--until",
            &until,
            "--table",
            "latency",
            "--progress",
            "off",
        ])
        .await;
    let latency = json_lines(&stdout);
    assert_eq!(
        latency.len(),
        count_messages(&before),
        "one row per message sent before T"
    );
    for row in &latency {
        let readers = row["readers"].as_u64().unwrap();
        assert!(readers <= row["possible_readers"].as_u64().unwrap(), "{row}");
        let times: Vec<Option<i64>> = ["first_read_ms", "median_read_ms", "last_read_ms"]
            .iter()
            .map(|k| row[*k].as_i64())
            .collect();
        assert_eq!(times[0].is_some(), readers > 0, "{row}");
        let known: Vec<i64> = times.iter().flatten().copied().collect();
        assert!(
            known.windows(2).all(|w| w[0] <= w[1]),
            "first <= median <= last: {row}"
        );
    }
    env.run_command(&[
        "replay",
        "--until",
        &until,
        "--table",
        "latency",
        "--format",
        "parquet",
        "--output",
        path_str(&parquet),
    ])
    .await;
    assert_eq!(
        duckdb_rows(&format!("read_parquet('{}')", path_str(&parquet))),
        latency
    );
}

/// Messages the reference saw sent (distinct (conversation, seq)).
fn count_messages(reference: &Reference) -> usize {
    reference
        .state
        .conversations()
        .map(|(_, c)| c.latest_seq().get() as usize)
        .sum()
}
