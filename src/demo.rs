//! `readfold demo`: runs the processor in-process on the configured broker,
//! plays the seed articles' chats into the input topics, and prints cursors
//! and read counts as they come back on the changelog.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use crate::codec::{self, ConversationEventRecord, EventRecord, ReadReportRecord};
use crate::config::Config;
use crate::domain::{ConversationId, CursorKey, Seq, UserId};
use crate::error::{Error, Result};
use crate::fold::{CursorUpdate, PartitionState};
use crate::kafka::admin::ensure_topics;
use crate::kafka::base_client_config;
use crate::kafka::input::InputProducer;
use crate::partitioner::partition_for_key;
use crate::processor::Processor;

enum Step {
    Send {
        conv: usize,
        sender: &'static str,
        seq: i64,
        text: &'static str,
    },
    Read {
        conv: usize,
        user: &'static str,
        seq: i64,
    },
    Join {
        conv: usize,
        user: &'static str,
        at_seq: i64,
    },
    Garbage {
        conv: usize,
    },
}

/// The seed articles' scenarios: a 1:1 chat, then a group with a late joiner.
fn script() -> Vec<Step> {
    use Step::*;
    vec![
        Join {
            conv: 0,
            user: "alice",
            at_seq: 0,
        },
        Join {
            conv: 0,
            user: "bob",
            at_seq: 0,
        },
        Send {
            conv: 0,
            sender: "alice",
            seq: 1,
            text: "hello",
        },
        Read {
            conv: 0,
            user: "bob",
            seq: 1,
        },
        Send {
            conv: 0,
            sender: "bob",
            seq: 2,
            text: "meeting tonight",
        },
        Read {
            conv: 0,
            user: "alice",
            seq: 2,
        },
        Join {
            conv: 1,
            user: "A",
            at_seq: 0,
        },
        Join {
            conv: 1,
            user: "B",
            at_seq: 0,
        },
        Join {
            conv: 1,
            user: "C",
            at_seq: 0,
        },
        Send {
            conv: 1,
            sender: "A",
            seq: 1,
            text: "meeting",
        },
        Read {
            conv: 1,
            user: "B",
            seq: 1,
        },
        Send {
            conv: 1,
            sender: "A",
            seq: 2,
            text: "moved to 3pm",
        },
        Read {
            conv: 1,
            user: "C",
            seq: 2,
        },
        // A stale, duplicate report: nothing moves back.
        Read {
            conv: 1,
            user: "C",
            seq: 1,
        },
        Garbage { conv: 1 },
        Join {
            conv: 1,
            user: "D",
            at_seq: 2,
        },
        Send {
            conv: 1,
            sender: "A",
            seq: 3,
            text: "welcome D",
        },
        Read {
            conv: 1,
            user: "D",
            seq: 3,
        },
    ]
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub async fn demo(mut config: Config) -> Result<()> {
    config.flush.interval_ms = config.flush.interval_ms.min(200);
    config.snapshot.interval_ms = config.snapshot.interval_ms.min(1000);
    let layout = ensure_topics(&config).await?;
    let run = now_ms();
    let convs = [format!("demo-{run}-dm"), format!("demo-{run}-group")];
    let labels = ["1:1 chat", "group"];
    println!(
        "readfold demo on {} (topics {} + {} -> {})",
        config.kafka.bootstrap_servers,
        config.topics.read_reports,
        config.topics.conversation_events,
        config.topics.read_cursors
    );
    println!("conversations: {} and {}\n", convs[0], convs[1]);

    let (stop, stopped) = watch::channel(false);
    let processor = Processor::new(config.clone(), layout).await?;
    let handle = tokio::spawn(processor.run(stopped));

    let producer = InputProducer::new(&config, layout.partitions)?;
    let watcher = ChangelogWatcher::new(&config, &convs, layout.partitions)?;
    let mut expected = PartitionState::new();
    let mut texts: BTreeMap<(usize, i64), (&str, &str)> = BTreeMap::new();
    // Event times: one millisecond apart, after the run's start.
    for (base_at, step) in (run + 1..).zip(script()) {
        let conv = match &step {
            Step::Send { conv, .. }
            | Step::Read { conv, .. }
            | Step::Join { conv, .. }
            | Step::Garbage { conv } => *conv,
        };
        let cid = &convs[conv];
        let line = match step {
            Step::Send {
                sender, seq, text, ..
            } => {
                texts.insert((conv, seq), (sender, text));
                let e = ConversationEventRecord {
                    conversation_id: cid.clone(),
                    seq,
                    at: base_at,
                    event: EventRecord::MessageSent {
                        sender_id: sender.into(),
                    },
                };
                producer.event(&e).await?;
                expected.apply_event(
                    &crate::validate::conversation_event(e, &config.limits())
                        .map_err(|r| Error::Other(r.detail))?,
                );
                format!("{sender} sends #{seq} {text:?}")
            }
            Step::Read { user, seq, .. } => {
                let r = ReadReportRecord {
                    conversation_id: cid.clone(),
                    user_id: user.into(),
                    seq,
                    device_id: None,
                    reported_at: base_at,
                    private: false,
                };
                producer.report(&r).await?;
                expected.apply_report(
                    &crate::validate::read_report(r, &config.limits()).map_err(|r| Error::Other(r.detail))?,
                );
                format!("{user} reports having seen up to #{seq}")
            }
            Step::Join { user, at_seq, .. } => {
                let e = ConversationEventRecord {
                    conversation_id: cid.clone(),
                    seq: at_seq,
                    at: base_at,
                    event: EventRecord::MemberJoined { user_id: user.into() },
                };
                producer.event(&e).await?;
                expected.apply_event(
                    &crate::validate::conversation_event(e, &config.limits())
                        .map_err(|r| Error::Other(r.detail))?,
                );
                format!("{user} joins (latest seq {at_seq})")
            }
            Step::Garbage { .. } => {
                producer
                    .send(&config.topics.read_reports, cid, Some(b"\xde\xad\xbe\xef"), None)
                    .await?;
                format!("a client sends 4 garbage bytes -> {}", config.topics.dlq)
            }
        };
        println!("[{}] {line}", labels[conv]);
        let view = watcher.wait_for(&expected, Duration::from_secs(30))?;
        print_view(&view, &convs[conv], conv, &texts);
    }
    println!(
        "\nEvery number above was read back from {} (read_committed).",
        config.topics.read_cursors
    );
    if config.redis.enabled {
        print_redis(&config, &convs).await?;
    }
    if config.cql.enabled {
        print_cql(&config, &convs).await?;
    }
    println!(
        "Try: readfold tail {}   and   readfold tail {}",
        config.topics.read_cursors, config.topics.dlq
    );
    let _ = stop.send(true);
    handle.await.map_err(|e| Error::Other(e.to_string()))??;
    Ok(())
}

fn print_view(view: &PartitionState, cid: &str, conv: usize, texts: &BTreeMap<(usize, i64), (&str, &str)>) {
    let Some(c) = ConversationId::parse(cid, usize::MAX)
        .ok()
        .and_then(|id| view.conversation(&id))
    else {
        println!("    (no cursors yet)");
        return;
    };
    let members: BTreeMap<&UserId, _> = c.members.iter().filter(|(_, m)| !m.left).collect();
    let cursors: Vec<String> = members.iter().map(|(u, m)| format!("{u}={}", m.cursor)).collect();
    let unread: Vec<String> = members.keys().map(|u| format!("{u}={}", c.unread(u))).collect();
    println!(
        "    cursors: {}   unread: {}",
        cursors.join(" "),
        unread.join(" ")
    );
    for (&(_, seq), (sender, _)) in texts.range((conv, 1)..=(conv, i64::MAX)) {
        let Ok(sender_id) = sender.parse::<UserId>() else {
            continue;
        };
        let mut readers: Vec<String> = c
            .readers(Seq(seq as u64), &sender_id)
            .map(|u| u.to_string())
            .collect();
        readers.sort();
        let count = readers.len();
        let shown = if members.len() <= 2 {
            if count == 1 {
                "read".to_owned()
            } else {
                "unread".to_owned()
            }
        } else {
            format!("{count} read {readers:?}")
        };
        println!("    #{seq} from {sender}: {shown}");
    }
}

/// Follows the changelog partitions of the demo conversations.
struct ChangelogWatcher {
    consumer: BaseConsumer,
    convs: Vec<String>,
    max_id_bytes: usize,
    view: std::cell::RefCell<PartitionState>,
}

impl ChangelogWatcher {
    fn new(config: &Config, convs: &[String], partitions: i32) -> Result<Self> {
        let consumer: BaseConsumer = base_client_config(config)
            .set("group.id", format!("{}-demo-watch", config.kafka.group_id))
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        let mut seen = Vec::new();
        for c in convs {
            let p = partition_for_key(c.as_bytes(), partitions);
            if !seen.contains(&p) {
                seen.push(p);
                tpl.add_partition_offset(&config.topics.read_cursors, p, Offset::Beginning)?;
            }
        }
        consumer.assign(&tpl)?;
        Ok(ChangelogWatcher {
            consumer,
            convs: convs.to_vec(),
            max_id_bytes: config.input.max_id_bytes,
            view: Default::default(),
        })
    }

    /// Polls until every cursor the script expects is on the changelog.
    fn wait_for(&self, expected: &PartitionState, timeout: Duration) -> Result<PartitionState> {
        let started = Instant::now();
        loop {
            while let Some(message) = self.consumer.poll(Duration::from_millis(100)) {
                let message = message?;
                let Some(key) = message.key().and_then(|k| codec::decode_cursor_key(k).ok()) else {
                    continue;
                };
                if !self.convs.contains(&key.conversation_id) {
                    continue;
                }
                let (Ok(conversation_id), Ok(user_id)) = (
                    ConversationId::parse(&key.conversation_id, self.max_id_bytes),
                    UserId::parse(&key.user_id, self.max_id_bytes),
                ) else {
                    continue;
                };
                match message.payload().map(codec::decode_cursor_update) {
                    Some(Ok(u)) => self.view.borrow_mut().restore_update(&CursorUpdate {
                        conversation_id,
                        user_id,
                        cursor: Seq(u.cursor as u64),
                        join_seq: Seq(u.join_seq as u64),
                        latest_seq: Seq(u.latest_seq as u64),
                        updated_at: u.updated_at,
                    }),
                    None => self.view.borrow_mut().restore_tombstone(&CursorKey {
                        conversation_id,
                        user_id,
                    }),
                    Some(Err(_)) => {}
                }
            }
            let done = matches(expected, &self.view.borrow());
            if done {
                return Ok(self.view.borrow().clone());
            }
            if started.elapsed() > timeout {
                return Err(Error::Other(format!("the changelog did not show the expected cursors within {timeout:?}; is `readfold` able to reach the broker?")));
            }
        }
    }
}

fn matches(expected: &PartitionState, view: &PartitionState) -> bool {
    expected.conversations().all(|(id, conv)| {
        view.conversation(id).is_some_and(|v| {
            conv.members.iter().all(|(u, m)| {
                v.members
                    .get(u)
                    .is_some_and(|vm| vm.cursor == m.cursor && vm.left == m.left)
            })
        })
    })
}

/// Shows the hot cursors the processor max-merged into Redis.
async fn print_redis(config: &Config, convs: &[String]) -> Result<()> {
    let redis_error = |e: redis::RedisError| Error::Sink(format!("redis: {e}"));
    let client = redis::Client::open(config.redis.url.as_str()).map_err(redis_error)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(redis_error)?;
    for conv in convs {
        let [cursors, latest, _] = crate::sinks::redis::keys(&config.redis.key_prefix, conv);
        let hash: BTreeMap<String, i64> = redis::cmd("HGETALL")
            .arg(&cursors)
            .query_async(&mut conn)
            .await
            .map_err(redis_error)?;
        let latest: Option<i64> = redis::cmd("GET")
            .arg(&latest)
            .query_async(&mut conn)
            .await
            .map_err(redis_error)?;
        println!("Redis {cursors} = {hash:?}, latest = {}", latest.unwrap_or(0));
    }
    Ok(())
}

/// Shows the snapshot rows the processor wrote to CQL, after waiting for a
/// snapshot tick.
async fn print_cql(config: &Config, convs: &[String]) -> Result<()> {
    tokio::time::sleep(Duration::from_millis(
        config.snapshot.interval_ms + config.flush.interval_ms * 2,
    ))
    .await;
    let cql_error = |e: String| Error::Sink(format!("cql: {e}"));
    let session = scylla::client::session_builder::SessionBuilder::new()
        .known_nodes(config.cql.contact_points())
        .build()
        .await
        .map_err(|e| cql_error(e.to_string()))?;
    let ks = &config.cql.keyspace;
    for conv in convs {
        let rows = session
            .query_unpaged(
                format!("SELECT user_id, cursor, join_seq FROM {ks}.cursors WHERE conversation_id = ?"),
                (conv,),
            )
            .await
            .map_err(|e| cql_error(e.to_string()))?
            .into_rows_result()
            .map_err(|e| cql_error(e.to_string()))?;
        let mut cursors = Vec::new();
        for row in rows
            .rows::<(String, i64, i64)>()
            .map_err(|e| cql_error(e.to_string()))?
        {
            let (user, cursor, join_seq) = row.map_err(|e| cql_error(e.to_string()))?;
            cursors.push(format!("{user}={cursor} (join_seq {join_seq})"));
        }
        println!("CQL {ks}.cursors[{conv}] = {}", cursors.join(", "));
    }
    Ok(())
}
