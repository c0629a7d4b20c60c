//! `readfold loadgen` against the real broker and processor: everything it
//! says it produced is on the topics and valid (nothing is dead-lettered),
//! the processor folds it to the reference, and a person at a terminal sees
//! a progress bar. (That a seed gives the same records is a unit test of
//! the pure generator, with a virtual clock.)

use std::time::Duration;

use readfold_wire::codec::{self, EventRecord, WireFormat};

use crate::kit::*;

const ARGS: [&str; 12] = [
    "--seed",
    "7",
    "--conversations",
    "300",
    "--users",
    "2000",
    "--max-group",
    "300",
    "--direct-read-delay-ms",
    "200",
    "--group-read-delay-ms",
    "500",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_workload_is_produced_whole_and_folds_to_the_reference() {
    let env = TestEnv::new("loadgen", 3).await;
    let mut processor = env.spawn("a");
    let mut args = vec![
        "loadgen",
        "--records",
        "20000",
        "--rate",
        "10000",
        "--progress",
        "log",
    ];
    args.extend(ARGS);
    let (_, log) = env.run_command(&args).await;
    assert!(log.contains("loadgen: 20000 records"), "{log}");

    // All of it is on the topics, and decodes.
    let reports = env.raw_records(&env.config.topics.read_reports);
    let events = env.raw_records(&env.config.topics.conversation_events);
    assert_eq!(reports.len() + events.len(), 20_000);
    let decoded_reports: Vec<_> = reports
        .iter()
        .map(|(_, v)| codec::decode_read_report(v.as_deref().unwrap(), WireFormat::Plain).unwrap())
        .collect();
    let decoded_events: Vec<_> = events
        .iter()
        .map(|(_, v)| codec::decode_conversation_event(v.as_deref().unwrap(), WireFormat::Plain).unwrap())
        .collect();
    let joins = decoded_events
        .iter()
        .filter(|e| matches!(e.event, EventRecord::MemberJoined { .. }))
        .count();
    let sends = decoded_events
        .iter()
        .filter(|e| matches!(e.event, EventRecord::MessageSent { .. }))
        .count();
    assert!(joins > 0 && sends > 1000, "{joins} joins, {sends} sends");
    assert!(decoded_reports.iter().any(|r| r.private), "private receipts");

    // Every record is valid, and the processor's changelog ends where the
    // reference fold of the same records does.
    let mut reference = Reference::default();
    for e in &decoded_events {
        reference.event(e);
    }
    for r in &decoded_reports {
        reference.report(r);
    }
    let log = env.wait_for_reference(&reference, Duration::from_secs(90)).await;
    assert_matches(&log, &reference);
    assert!(env.dead_letters().is_empty(), "{:?}", env.dead_letters());
    assert!(processor.terminate(Duration::from_secs(30)));
    a_terminal_shows_a_progress_bar(&env).await;
}

/// Runs loadgen in a tmux pane, as a person would, and reads the screen: a
/// bar with records, rate and ETA, then the summary.
async fn a_terminal_shows_a_progress_bar(env: &TestEnv) {
    let vars: String = env.vars().iter().map(|(k, v)| format!("{k}='{v}' ")).collect();
    let command = format!(
        "env {vars} {} loadgen --records 30000 --rate 5000 {}",
        env!("CARGO_BIN_EXE_readfold"),
        ARGS.join(" ")
    );
    let screens = tmux_screens("loadgen", &command, "loadgen: 30000 records").await;
    let bar = screens
        .iter()
        .flat_map(|s| s.lines())
        .find(|l| l.starts_with("loadgen ") && l.contains("ETA") && l.contains("records"))
        .unwrap_or_else(|| panic!("no progress bar on the screen:\n{}", screens.join("\n")));
    assert!(bar.contains("records/s"), "{bar}");
    let last = screens.last().unwrap();
    assert!(
        last.contains("loadgen: 30000 records"),
        "the summary follows the bar:\n{last}"
    );
}
