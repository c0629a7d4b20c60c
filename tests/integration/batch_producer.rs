//! `BatchProducer` against the broker: records a topic's batch at a time,
//! in a transaction, onto a topic created just before, through a producer
//! queue far smaller than the batch (so that it waits for room).

use std::sync::Arc;
use std::time::Duration;

use rdkafka::producer::{Producer, ThreadedProducer};
use readfold_kafka::batch_producer::{BatchProducer, BatchRecord};
use readfold_kafka::context::LogContext;

use crate::kit::*;

#[tokio::test]
async fn a_transaction_of_batches_arrives_whole_and_in_order() {
    let env = TestEnv::new("batch-producer", 3).await;
    let topic = env.extra_topic("batch");
    readfold_kafka::admin::create_topic(&env.config.kafka, &topic, 3, 1, false)
        .await
        .expect("create the topic");
    let producer: ThreadedProducer<LogContext> = env
        .config
        .kafka
        .client_config()
        .set("transactional.id", unique("it.batch-txn"))
        .set("enable.idempotence", "true")
        .set("queue.buffering.max.messages", "50")
        .set("delivery.report.only.error", "true")
        .create_with_context(LogContext)
        .expect("producer");
    producer
        .init_transactions(Duration::from_secs(30))
        .expect("init transactions");
    let batches = BatchProducer::new(Arc::new(producer));

    let records: Vec<(i32, String, Option<String>)> = (0..2000)
        .map(|i| {
            let value = (i % 7 != 0).then(|| format!("v{i}"));
            (i % 3, format!("k{i}"), value)
        })
        .collect();
    batches.producer().begin_transaction().expect("begin");
    for part in records.chunks(700) {
        let batch: Vec<BatchRecord<'_>> = part
            .iter()
            .map(|(partition, key, value)| BatchRecord {
                partition: *partition,
                key: Some(key.as_bytes()),
                value: value.as_deref().map(str::as_bytes),
            })
            .collect();
        batches.send_batch(&topic, &batch).expect("send a batch");
    }
    batches
        .producer()
        .commit_transaction(Duration::from_secs(30))
        .expect("commit");

    // Each partition holds its records in the order sent, tombstones too.
    let read = env.raw_records(&topic);
    assert_eq!(read.len(), records.len(), "every record arrives once");
    let index = |key: &[u8]| -> i32 { std::str::from_utf8(&key[1..]).unwrap().parse().unwrap() };
    for partition in 0..3 {
        let got: Vec<(i32, Option<String>)> = read
            .iter()
            .map(|(k, v)| (index(k.as_deref().unwrap()), v.clone()))
            .filter(|(i, _)| i % 3 == partition)
            .map(|(i, v)| (i, v.map(|v| String::from_utf8(v).unwrap())))
            .collect();
        let want: Vec<(i32, Option<String>)> = records
            .iter()
            .filter(|(p, _, _)| *p == partition)
            .map(|(_, k, v)| (index(k.as_bytes()), v.clone()))
            .collect();
        assert_eq!(got, want, "partition {partition}");
    }
}
