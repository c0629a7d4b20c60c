//! Bad input goes to the dead-letter topic with its reason; valid records
//! beside it still fold.

use std::collections::BTreeMap;
use std::time::Duration;

use readfold_core::partitioner::partition_for_key;
use readfold_wire::codec::{encode_read_report, frame_confluent, ReadReportRecord};

use crate::kit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_records_are_dead_lettered_and_processing_goes_on() {
    let env = TestEnv::new("dlq", 3).await;
    let reports = env.config.topics.read_reports.clone();
    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    let producer = env.producer();
    let raw = |r: &ReadReportRecord| encode_read_report(r);

    let mut expected_reasons: BTreeMap<&str, usize> = BTreeMap::new();
    let mut bad = |reason| *expected_reasons.entry(reason).or_default() += 1;
    let conv = "C";
    let mut seq = 0;
    let valid = |feed_seq: &mut i64| {
        *feed_seq += 1;
        report(conv, "u", *feed_seq)
    };

    feed.report(valid(&mut seq)).await;
    producer
        .send(&reports, conv, Some(b"garbage \xff\xfe bytes"), None)
        .await
        .unwrap();
    bad("decode_error");
    feed.report(valid(&mut seq)).await;
    let mut wrong_magic = frame_confluent(7, &raw(&report(conv, "u", 99)));
    wrong_magic[0] = 1;
    producer
        .send(&reports, conv, Some(&wrong_magic), None)
        .await
        .unwrap();
    bad("decode_error");
    feed.report(valid(&mut seq)).await;
    // A valid Confluent-framed record folds.
    let framed = report(conv, "framed", 5);
    producer
        .send(&reports, conv, Some(&frame_confluent(42, &raw(&framed))), None)
        .await
        .unwrap();
    feed.reference.report(&framed);
    producer
        .send(&reports, "", Some(&raw(&report("", "u", 1))), None)
        .await
        .unwrap();
    bad("empty_id");
    producer
        .send(&reports, conv, Some(&raw(&report(conv, "", 1))), None)
        .await
        .unwrap();
    bad("empty_id");
    feed.report(valid(&mut seq)).await;
    producer
        .send(&reports, conv, Some(&raw(&report(conv, "u", 0))), None)
        .await
        .unwrap();
    bad("seq_out_of_range");
    producer
        .send(&reports, conv, Some(&raw(&report(conv, "u", -1))), None)
        .await
        .unwrap();
    bad("seq_out_of_range");
    producer
        .send(&reports, conv, Some(&raw(&report(conv, "u", i64::MAX))), None)
        .await
        .unwrap();
    bad("seq_out_of_range");
    feed.report(valid(&mut seq)).await;
    let huge = "x".repeat(1_000_000);
    producer
        .send(&reports, conv, Some(&raw(&report(conv, &huge, 1))), None)
        .await
        .unwrap();
    bad("id_too_long");
    producer.send(&reports, conv, None, None).await.unwrap();
    bad("missing_value");
    let wrong = (partition_for_key(conv.as_bytes(), env.partitions) + 1) % env.partitions;
    producer
        .send(&reports, conv, Some(&raw(&report(conv, "u", 50))), Some(wrong))
        .await
        .unwrap();
    bad("wrong_partition");
    producer
        .send(
            &reports,
            "D",
            Some(&raw(&report(conv, "u", 50))),
            Some(partition_for_key(conv.as_bytes(), env.partitions)),
        )
        .await
        .unwrap();
    bad("key_mismatch");
    feed.report(valid(&mut seq)).await;

    let mut processor = env.spawn("a");
    let total_bad: usize = expected_reasons.values().sum();
    let log = env.wait_for_reference(&reference, Duration::from_secs(60)).await;
    assert_matches(&log, &reference);
    // The DLQ is written in the same transactions, so it is complete by now
    // if the processor got this far; poll briefly anyway.
    let mut letters = env.dead_letters();
    for _ in 0..50 {
        if letters.len() >= total_bad {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        letters = env.dead_letters();
    }
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for letter in &letters {
        let reason = letter["headers"]["readfold.reason"].as_str().unwrap();
        *reasons.entry(reason).or_default() += 1;
        assert_eq!(letter["headers"]["readfold.source.topic"], reports.as_str());
        assert!(letter["headers"]["readfold.source.offset"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .is_ok());
        assert!(!letter["headers"]["readfold.detail"].as_str().unwrap().is_empty());
    }
    let reasons: BTreeMap<String, usize> = reasons.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let expected: BTreeMap<String, usize> = expected_reasons
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    assert_eq!(reasons, expected, "dead-letter reasons");
    let huge_letter = letters
        .iter()
        .find(|l| l["headers"]["readfold.reason"] == "id_too_long")
        .unwrap();
    assert!(
        huge_letter["value"]["bytes"].as_u64().unwrap() > 1_000_000,
        "the original bytes are kept"
    );
    assert!(
        processor.terminate(Duration::from_secs(30)),
        "{}",
        processor.log_text()
    );
    assert!(!processor.log_text().contains("panicked"));
}
