//! `readfold demo`: runs the processor in-process on the configured broker,
//! plays the seed articles' chats into the input topics, and prints cursors
//! and read counts as they come back on the changelog.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use readfold_core::fold::PartitionState;
use readfold_core::partitioner::partition_for_key;
use readfold_core::{ConversationId, ConversationView, Seq, UserId};
use readfold_kafka::admin::ensure_topics;
use readfold_kafka::changelog::ChangelogReader;
use readfold_kafka::producer::InputProducer;
use readfold_processor::Processor;
use readfold_store::cql::CqlStore;
use readfold_store::redis::{keys, RedisStore};
use readfold_wire::changelog::{ChangelogEntry, ChangelogKind};
use readfold_wire::codec::{ConversationEventRecord, EventRecord, ReadReportRecord};
use readfold_wire::validate;
use tokio::sync::watch;

use crate::config::Config;
use crate::error::{Error, Result};

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
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
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
    let processor = Processor::new(config.processor_settings(), layout).await?;
    let handle = tokio::spawn(processor.run(stopped));

    let producer = InputProducer::new(&config.kafka, &config.topics, layout.partitions)?;
    let mut watcher = ChangelogWatcher::new(&config, &convs, layout.partitions)?;
    let mut expected = PartitionState::new();
    let mut texts: BTreeMap<(usize, i64), (&str, &str)> = BTreeMap::new();
    let invalid = |r: validate::Rejection| Error::Run(format!("the demo script is invalid: {}", r.detail));
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
                expected.apply_event(&validate::conversation_event(e, &config.input).map_err(invalid)?);
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
                expected.apply_report(&validate::read_report(r, &config.input).map_err(invalid)?);
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
                expected.apply_event(&validate::conversation_event(e, &config.input).map_err(invalid)?);
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
        let view;
        (watcher, view) = watcher
            .wait_for(expected.clone(), Duration::from_secs(30))
            .await?;
        print_view(view.get(&convs[conv]), conv, &texts);
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
    handle.await??;
    Ok(())
}

/// Prints a conversation's cursors, unread counts and read counts, all
/// answered by the read model.
fn print_view(view: Option<&ConversationView>, conv: usize, texts: &BTreeMap<(usize, i64), (&str, &str)>) {
    let Some(c) = view else {
        println!("    (no cursors yet)");
        return;
    };
    let cursors: Vec<String> = c
        .members
        .iter()
        .map(|(u, m)| format!("{u}={}", m.cursor))
        .collect();
    let unread: Vec<String> = c.members.keys().map(|u| format!("{u}={}", c.unread(u))).collect();
    println!(
        "    cursors: {}   unread: {}",
        cursors.join(" "),
        unread.join(" ")
    );
    for (&(_, seq), (sender, _)) in texts.range((conv, 1)..=(conv, i64::MAX)) {
        let Ok(sender_id) = sender.parse::<UserId>() else {
            continue;
        };
        let readers: Vec<String> = c
            .readers(Seq(seq as u64), &sender_id)
            .map(|u| u.to_string())
            .collect();
        let count = readers.len();
        let shown = if c.members.len() <= 2 {
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
    reader: ChangelogReader,
    convs: Vec<String>,
    /// What the changelog said so far, folded as a restore would.
    seen: PartitionState,
}

impl ChangelogWatcher {
    fn new(config: &Config, convs: &[String], partitions: i32) -> Result<Self> {
        let reader = ChangelogReader::new(
            &config.kafka,
            &format!("{}-demo-watch", config.kafka.group_id),
            &config.topics.read_cursors,
            ChangelogKind::ByConversation,
            config.input.max_id_bytes,
        )?;
        let mut watched: Vec<i32> = convs
            .iter()
            .map(|c| partition_for_key(c.as_bytes(), partitions))
            .collect();
        watched.dedup();
        reader.follow(Some(&watched))?;
        Ok(ChangelogWatcher {
            reader,
            convs: convs.to_vec(),
            seen: PartitionState::new(),
        })
    }

    /// Waits, on a blocking thread, until every member the script expects
    /// shows on the changelog with the expected cursor; returns the watcher
    /// and the demo conversations as readers see them.
    async fn wait_for(
        self,
        expected: PartitionState,
        timeout: Duration,
    ) -> Result<(Self, BTreeMap<String, ConversationView>)> {
        tokio::task::spawn_blocking(move || self.wait_blocking(&expected, timeout)).await?
    }

    fn wait_blocking(
        mut self,
        expected: &PartitionState,
        timeout: Duration,
    ) -> Result<(Self, BTreeMap<String, ConversationView>)> {
        let started = Instant::now();
        loop {
            for entry in self.reader.poll_entries(Duration::from_millis(100))? {
                if !self
                    .convs
                    .iter()
                    .any(|c| c == entry.key().conversation_id.as_str())
                {
                    continue;
                }
                match entry {
                    ChangelogEntry::Upsert(u) => self.seen.restore_update(&u),
                    ChangelogEntry::Left(k) => self.seen.restore_tombstone(&k),
                }
            }
            let views = self.views(&self.seen);
            if views.iter().all(|(c, v)| {
                self.views(expected)
                    .get(c)
                    .is_none_or(|want| want.members == v.members)
            }) && self.views(expected).keys().all(|c| views.contains_key(c))
            {
                return Ok((self, views));
            }
            if started.elapsed() > timeout {
                return Err(Error::Run(format!("the changelog did not show the expected cursors within {timeout:?}; is `readfold` able to reach the broker?")));
            }
        }
    }

    fn views(&self, state: &PartitionState) -> BTreeMap<String, ConversationView> {
        self.convs
            .iter()
            .filter_map(|c| {
                let id = ConversationId::parse(c, usize::MAX).ok()?;
                Some((c.clone(), state.conversation(&id)?.view()))
            })
            .collect()
    }
}

/// Shows the hot cursors the processor max-merged into Redis, read back
/// through the store's read half.
async fn print_redis(config: &Config, convs: &[String]) -> Result<()> {
    let redis = RedisStore::connect(&config.redis).await?;
    for conv in convs {
        let [cursors, _, _] = keys(redis.prefix(), conv);
        let view = redis.conversation(conv).await?.unwrap_or_default();
        let hash: BTreeMap<&str, u64> = view
            .members
            .iter()
            .map(|(u, m)| (u.as_str(), m.cursor.get()))
            .collect();
        println!("Redis {cursors} = {hash:?}, latest = {}", view.latest_seq);
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
    let cql = CqlStore::connect(&config.cql).await?;
    let ks = cql.keyspace();
    for conv in convs {
        let view = cql.conversation(conv).await?.unwrap_or_default();
        let cursors: Vec<String> = view
            .members
            .iter()
            .map(|(u, m)| format!("{u}={} (join_seq {})", m.cursor, m.join_seq))
            .collect();
        println!("CQL {ks}.cursors[{conv}] = {}", cursors.join(", "));
    }
    Ok(())
}
