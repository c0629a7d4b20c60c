//! With a schema registry: readfold registers its output schemas under the
//! TopicNameStrategy subjects and writes the Confluent wire format, which
//! Confluent's own deserializer (confluent-kafka's AvroDeserializer, from
//! PyPI) decodes unchanged; framed input is checked against the registry.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use readfold_registry::{Registry, RegistryConfig};
use readfold_wire::codec::{encode_read_report, frame_confluent, CURSOR_KEY_AVSC, READ_REPORT_AVSC};
use readfold_wire::confluent::unframe;
use serde_json::Value;

use crate::kit::*;

fn registry(url: &str) -> Registry {
    Registry::new(&RegistryConfig {
        url: url.to_owned(),
        username: String::new(),
        password: String::new(),
        tls_ca_file: String::new(),
        timeout_ms: 10_000,
    })
    .unwrap()
}

/// Every record of `topics` as Confluent's deserializer reads it.
fn confluent_read(env: &TestEnv, url: &str, topics: &[&str]) -> Vec<Value> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/integration/registry_consumer.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .arg(&env.config.kafka.bootstrap_servers)
        .arg(url)
        .args(topics)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "Confluent's deserializer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_what_registry_aware_consumers_decode_and_checks_framed_input() {
    let url = schema_registry_url();
    let env = TestEnv::with_vars("registry", 2, &[("READFOLD__SCHEMA_REGISTRY__URL", url.as_str())]).await;
    let topics = env.config.topics.clone();
    let registry = registry(&url);
    // A producer that uses the registry registers its ReadReport schema.
    let report_id = registry
        .register(&format!("{}-value", topics.read_reports), READ_REPORT_AVSC)
        .await
        .unwrap();
    // Registered, but not a ReadReport schema.
    let foreign_id = registry
        .register(&unique("it.other-value"), CURSOR_KEY_AVSC)
        .await
        .unwrap();

    let mut reference = Reference::default();
    let mut feed = env.feed(&mut reference);
    feed.seed_chats("dm", "group").await;
    let producer = env.producer();
    let framed = report("group", "C", 3);
    let bytes = frame_confluent(report_id, &encode_read_report(&framed));
    producer
        .send(&topics.read_reports, "group", Some(&bytes), None)
        .await
        .unwrap();
    reference.report(&framed);
    for bogus in [foreign_id, 999_999] {
        let bytes = frame_confluent(bogus, &encode_read_report(&report("group", "B", 3)));
        producer
            .send(&topics.read_reports, "group", Some(&bytes), None)
            .await
            .unwrap();
    }
    producer
        .send(&topics.read_reports, "group", Some(b"junk"), None)
        .await
        .unwrap();

    let mut processor = env.spawn("a");
    let log = env.wait_for_reference(&reference, Duration::from_secs(90)).await;
    assert_matches(&log, &reference);
    let letters = env.dead_letters();
    let reasons: Vec<&str> = letters
        .iter()
        .map(|l| l["headers"]["readfold.reason"].as_str().unwrap())
        .collect();
    assert_eq!(
        reasons,
        ["unknown_schema", "unknown_schema", "decode_error"],
        "{letters:?}"
    );
    assert!(processor.terminate(Duration::from_secs(30)));

    // Every key and value carries the id registered under its subject.
    for topic in [&topics.read_cursors, &topics.user_read_cursors, &topics.dlq] {
        let key_ids = registry.subject_ids(&format!("{topic}-key")).await.unwrap();
        let value_ids = registry.subject_ids(&format!("{topic}-value")).await.unwrap();
        assert_eq!((key_ids.len(), value_ids.len()), (1, 1), "{topic}");
        let records = env.raw_records(topic);
        assert!(!records.is_empty(), "{topic}");
        for (key, value) in records {
            assert_eq!(
                unframe(&key.unwrap()).map(|(id, _)| id),
                Some(key_ids[0]),
                "{topic}"
            );
            if let Some(value) = value {
                assert_eq!(unframe(&value).map(|(id, _)| id), Some(value_ids[0]), "{topic}");
            }
        }
    }

    // Confluent's own deserializer reads the changelog and the dead letters.
    let decoded = confluent_read(&env, &url, &[&topics.read_cursors, &topics.dlq]);
    let mut latest = BTreeMap::new();
    let mut dead = Vec::new();
    for record in &decoded {
        if record["topic"] == topics.read_cursors.as_str() {
            let key = (
                record["key"]["conversation_id"].as_str().unwrap().to_owned(),
                record["key"]["user_id"].as_str().unwrap().to_owned(),
            );
            let value = &record["value"];
            latest.insert(
                key,
                (!value.is_null()).then(|| {
                    (
                        value["cursor"].as_i64().unwrap(),
                        value["join_seq"].as_i64().unwrap(),
                    )
                }),
            );
        } else {
            dead.push(record);
        }
    }
    assert_eq!(
        latest,
        reference.expected(),
        "as Confluent's deserializer reads it"
    );
    assert_eq!(dead.len(), 3, "{dead:?}");
    for (letter, reason) in dead
        .iter()
        .zip(["unknown_schema", "unknown_schema", "decode_error"])
    {
        assert_eq!(letter["value"]["reason"], reason, "{letter}");
        assert_eq!(letter["key"]["bytes"], "group", "{letter}");
        assert_eq!(
            letter["value"]["source_topic"],
            topics.read_reports.as_str(),
            "{letter}"
        );
    }
    assert_eq!(dead[2]["value"]["value"]["bytes"], "junk");

    // readfold's own readers take either framing: `tail` prints it all.
    let tailed = env.read_topic(&topics.read_cursors);
    assert!(!tailed.is_empty());
    assert!(
        !tailed.iter().any(|l| l.to_string().contains("undecodable")),
        "{tailed:?}"
    );
    let tailed = env.dead_letters();
    assert_eq!(tailed[2]["value"]["value_text"], "junk", "{tailed:?}");
}
