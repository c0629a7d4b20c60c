//! The processor's transactions against the broker: a flush commits whole
//! or not at all. The transaction reads a flush's records from a channel as
//! they are encoded; one that closes before the last chunk (an encoding cut
//! short) must abort, not commit what arrived.

use std::sync::Arc;

use rdkafka::TopicPartitionList;
use readfold_core::fold::{PartitionState, ReadReport};
use readfold_core::Seq;
use readfold_processor::error::Error;
use readfold_processor::transaction::{RecordChunk, Transactions};
use readfold_wire::changelog::{ChangelogFrames, EncodedRecords};
use readfold_wire::OutputTopics;

use crate::kit::*;

/// One read of `conversation`'s changelog records, encoded as a flush
/// encodes them.
fn changelog_chunk(conversation: &str, out: &Arc<OutputTopics>) -> RecordChunk {
    let mut state = PartitionState::new();
    state.apply_report(&ReadReport {
        conversation_id: conversation.parse().expect("id"),
        user_id: "reader".parse().expect("id"),
        seq: Seq(3),
        reported_at: 1,
        private: false,
    });
    let mut records = EncodedRecords::with_capacity(4);
    for change in state.drain() {
        records.push_change(&change, 0, &out.layout, &ChangelogFrames::default());
    }
    assert!(!records.is_empty(), "a read makes a changelog record");
    RecordChunk::Changelog(records, Arc::clone(out))
}

/// Commits `chunks` as one flush whose stores took it.
async fn flush(transactions: &Transactions, chunks: Vec<RecordChunk>) -> Result<(), Error> {
    let (sender, records) = tokio::sync::mpsc::channel(chunks.len().max(1));
    for chunk in chunks {
        sender.send(chunk).await.expect("room for every chunk");
    }
    drop(sender);
    let (written, gate) = std::sync::mpsc::sync_channel(1);
    written.send(true).expect("gate");
    transactions
        .commit(records, TopicPartitionList::new(), None, gate)
        .await
}

#[tokio::test]
async fn a_flush_whose_records_stop_before_their_last_chunk_commits_nothing() {
    let env = TestEnv::new("txn-cut-short", 1).await;
    let layout = readfold_kafka::admin::ensure_topics(&env.config.kafka, &env.config.topics)
        .await
        .expect("topics");
    let out = Arc::new(layout.output_topics(&env.config.topics));
    let kafka = env.config.kafka.clone();
    let transactions = tokio::task::spawn_blocking(move || Transactions::init(&kafka))
        .await
        .expect("join")
        .expect("transactional producers");

    let cut = flush(&transactions, vec![changelog_chunk("cut", &out)]).await;
    assert!(matches!(cut, Err(Error::RecordsCutShort)), "{cut:?}");
    assert!(cut.as_ref().is_err_and(Error::is_retriable));
    // The next flush, whole, on the other producer and then on the same one.
    for conversation in ["whole", "whole-again"] {
        let chunks = vec![changelog_chunk(conversation, &out), RecordChunk::Last(Vec::new())];
        flush(&transactions, chunks).await.expect("a whole flush commits");
    }

    let conversations: Vec<String> = env
        .changelog()
        .latest()
        .into_keys()
        .map(|(conversation, _)| conversation)
        .collect();
    assert_eq!(
        conversations,
        ["whole", "whole-again"],
        "nothing of the flush cut short"
    );
}
