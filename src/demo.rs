//! `readfold demo`: runs the processor in-process on the configured broker,
//! plays the seed articles' chats into the input topics, and prints cursors
//! and read counts as they come back on the changelog.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use readfold_badge::BadgeStage;
use readfold_core::badge::{recount, Badge};
use readfold_core::Mute;
use readfold_kafka::admin::create_topic;
use readfold_kafka::reader::TopicReader;
use readfold_wire::badge::{decode_user_badge, encode_user_action, UserActionKind, UserActionRecord};

use readfold_core::fold::PartitionState;
use readfold_core::partitioner::partition_for_key;
use readfold_core::{ConversationId, ConversationView, OwnCursor, Seq, UserId};
use readfold_kafka::admin::ensure_topics;
use readfold_kafka::changelog::ChangelogReader;
use readfold_kafka::now_ms;
use readfold_kafka::producer::InputProducer;
use readfold_processor::Processor;
use readfold_serve::client::HttpClient;
use readfold_store::cql::CqlStore;
use readfold_store::redis::{keys, RedisStore};
use readfold_wire::changelog::{ChangelogEntry, ChangelogKind, ThreadEntry};
use readfold_wire::codec::{ConversationEventRecord, EventRecord, ReadAction, ReadReportRecord};
use readfold_wire::validate;
use tokio::sync::watch;

use crate::config::{Config, ConfigError};
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
    /// A message reached one of the user's devices: the sender's grey ticks.
    Deliver {
        conv: usize,
        user: &'static str,
        seq: i64,
    },
    /// A private receipt: the user's own unread drops, "N read" does not.
    ReadPrivately {
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
    /// A message that mentions users by name, or @all.
    Mention {
        conv: usize,
        sender: &'static str,
        seq: i64,
        text: &'static str,
        users: &'static [&'static str],
        all: bool,
    },
    /// The user mutes the conversation until they unmute it.
    Mute {
        conv: usize,
        user: &'static str,
    },
    /// The user marks everything read (a user action the badge stage
    /// turns into read reports).
    MarkAllRead {
        conv: usize,
        user: &'static str,
    },
    /// A reply in the thread of message `thread` (started by `starter`),
    /// sent when the conversation's latest seq was `at_seq`.
    Reply {
        conv: usize,
        sender: &'static str,
        thread: i64,
        thread_seq: i64,
        starter: &'static str,
        at_seq: i64,
        text: &'static str,
    },
    /// A read in a thread, on one of the user's devices.
    ReadThread {
        conv: usize,
        user: &'static str,
        thread: i64,
        seq: i64,
        private: bool,
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
        Deliver {
            conv: 0,
            user: "bob",
            seq: 1,
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
        Deliver {
            conv: 1,
            user: "B",
            seq: 1,
        },
        Deliver {
            conv: 1,
            user: "C",
            seq: 1,
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
        ReadPrivately {
            conv: 1,
            user: "B",
            seq: 3,
        },
        Mention {
            conv: 1,
            sender: "A",
            seq: 4,
            text: "@B can you bring the slides?",
            users: &["B"],
            all: false,
        },
        Reply {
            conv: 1,
            sender: "B",
            thread: 1,
            thread_seq: 1,
            starter: "A",
            at_seq: 4,
            text: "I'll take notes",
        },
        Reply {
            conv: 1,
            sender: "C",
            thread: 1,
            thread_seq: 2,
            starter: "A",
            at_seq: 4,
            text: "me too",
        },
        ReadThread {
            conv: 1,
            user: "A",
            thread: 1,
            seq: 2,
            private: true,
        },
        Mute { conv: 1, user: "C" },
        Mention {
            conv: 1,
            sender: "A",
            seq: 5,
            text: "@all the room moved to 4F",
            users: &[],
            all: true,
        },
        MarkAllRead { conv: 1, user: "C" },
    ]
}

/// The demo's users, named per run (`B-<tag>`): a badge counts every
/// conversation of a user, so another run's conversations must not count
/// in this one's. Printed by their short names.
struct Names {
    tag: String,
}

impl Names {
    fn id(&self, name: &str) -> String {
        format!("{name}-{}", self.tag)
    }

    fn short<'a>(&self, id: &'a str) -> &'a str {
        id.strip_suffix(&format!("-{}", self.tag)).unwrap_or(id)
    }
}

/// Produces one scripted event of `conversation` and applies it to the
/// state the demo expects.
async fn play_event(
    producer: &InputProducer,
    expected: &mut PartitionState,
    config: &Config,
    conversation: &str,
    seq: i64,
    at: i64,
    event: EventRecord,
) -> Result<()> {
    let e = ConversationEventRecord {
        conversation_id: conversation.to_owned(),
        seq,
        at,
        event,
    };
    producer.event(&e).await?;
    expected.apply_event(&validate::conversation_event(e, &config.input).map_err(Error::DemoScript)?);
    Ok(())
}

pub async fn demo(mut config: Config) -> Result<()> {
    config.flush.interval_ms = config.flush.interval_ms.min(200);
    config.snapshot.interval_ms = config.snapshot.interval_ms.min(1000);
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    let run = now_ms();
    let names = Names {
        tag: (run % 100_000).to_string(),
    };
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

    // The badge stage, beside the processor, and a reader of what it
    // publishes, from now on.
    let badge_watcher = BadgeWatcher::new(&config, layout.output.user_read_cursors_partitions).await?;
    let badge_stop = Arc::new(AtomicBool::new(false));
    let badge_stage = start_badge_stage(&config, badge_stop.clone()).await?;
    // Whatever ends the demo stops the stage: the runtime waits for its thread.
    let _stop_badges = StopOnDrop(badge_stop.clone());
    let mut badge_watcher = Some(badge_watcher);
    let rules = config
        .badge
        .rules()
        .map_err(|e| Error::Config(ConfigError::Invalid(e)))?;

    let producer = InputProducer::new(&config.kafka, &config.topics, layout.partitions)?;
    let mut watcher = ChangelogWatcher::new(&config, &convs, layout.partitions)?;
    let mut expected = PartitionState::new();
    let mut texts: BTreeMap<(usize, i64), (&str, &str)> = BTreeMap::new();
    // Event times: one millisecond apart, after the run's start.
    for (base_at, step) in (run + 1..).zip(script()) {
        let conv = match &step {
            Step::Send { conv, .. }
            | Step::Read { conv, .. }
            | Step::ReadPrivately { conv, .. }
            | Step::Deliver { conv, .. }
            | Step::Join { conv, .. }
            | Step::Mention { conv, .. }
            | Step::Mute { conv, .. }
            | Step::MarkAllRead { conv, .. }
            | Step::Reply { conv, .. }
            | Step::ReadThread { conv, .. }
            | Step::Garbage { conv } => *conv,
        };
        let cid = &convs[conv];
        let thread_step = matches!(step, Step::Reply { .. } | Step::ReadThread { .. });
        let line = match step {
            Step::Send {
                sender, seq, text, ..
            } => {
                texts.insert((conv, seq), (sender, text));
                let sent = EventRecord::MessageSent {
                    starter_id: None,
                    thread: 0,
                    thread_seq: 0,
                    mention_all: false,
                    mentions: Vec::new(),
                    sender_id: names.id(sender),
                };
                play_event(&producer, &mut expected, &config, cid, seq, base_at, sent).await?;
                format!("{sender} sends #{seq} {text:?}")
            }
            Step::Mention {
                sender,
                seq,
                text,
                users,
                all,
                ..
            } => {
                texts.insert((conv, seq), (sender, text));
                let sent = EventRecord::MessageSent {
                    starter_id: None,
                    thread: 0,
                    thread_seq: 0,
                    mention_all: all,
                    mentions: users.iter().map(|u| names.id(u)).collect(),
                    sender_id: names.id(sender),
                };
                play_event(&producer, &mut expected, &config, cid, seq, base_at, sent).await?;
                format!("{sender} sends #{seq} {text:?} (a mention)")
            }
            Step::Reply {
                sender,
                thread,
                thread_seq,
                starter,
                at_seq,
                text,
                ..
            } => {
                let reply = EventRecord::MessageSent {
                    starter_id: Some(names.id(starter)),
                    thread,
                    thread_seq,
                    mention_all: false,
                    mentions: Vec::new(),
                    sender_id: names.id(sender),
                };
                play_event(&producer, &mut expected, &config, cid, at_seq, base_at, reply).await?;
                format!(
                    "{sender} replies in the thread of #{thread} (reply {thread_seq}) {text:?}: \
                     {starter} started it, so {starter} follows it"
                )
            }
            Step::ReadThread {
                user,
                thread,
                seq,
                private,
                ..
            } => {
                let r = ReadReportRecord {
                    thread,
                    muted_until: None,
                    conversation_id: cid.clone(),
                    user_id: names.id(user),
                    seq,
                    device_id: None,
                    reported_at: base_at,
                    private,
                    action: ReadAction::Read,
                };
                producer.report(&r).await?;
                expected.apply(&validate::read_report(r, &config.input).map_err(Error::DemoScript)?);
                format!(
                    "{user} reads the thread of #{thread} up to reply {seq} on her phone{}: \
                     every device of {user}'s learns it from {}",
                    if private { " (privately)" } else { "" },
                    config.topics.user_thread_cursors
                )
            }
            Step::Mute { user, .. } => {
                let r = ReadReportRecord {
                    thread: 0,
                    muted_until: None,
                    conversation_id: cid.clone(),
                    user_id: names.id(user),
                    seq: 0,
                    device_id: None,
                    reported_at: base_at,
                    private: false,
                    action: ReadAction::Mute,
                };
                producer.report(&r).await?;
                expected.apply(&validate::read_report(r, &config.input).map_err(Error::DemoScript)?);
                format!("{user} mutes the group: it counts in {user}'s badge only through mentions")
            }
            Step::MarkAllRead { user, .. } => {
                let action = UserActionRecord {
                    user_id: names.id(user),
                    action: UserActionKind::MarkAllRead,
                    at: base_at,
                };
                let partition = partition_for_key(
                    names.id(user).as_bytes(),
                    layout.output.user_read_cursors_partitions,
                );
                producer
                    .send(
                        &config.badge.user_actions,
                        &names.id(user),
                        Some(&encode_user_action(&action)),
                        Some(partition),
                    )
                    .await?;
                // What the badge stage sends back to the processor.
                let user_id = validate::id("user_id", &names.id(user), &config.input, UserId::parse)
                    .map_err(Error::DemoScript)?;
                for (c, conv) in expected.clone().conversations() {
                    let Some(m) = conv.member(&user_id).filter(|m| !m.left) else {
                        continue;
                    };
                    let r = ReadReportRecord {
                        thread: 0,
                        muted_until: None,
                        conversation_id: c.to_string(),
                        user_id: user_id.to_string(),
                        seq: conv.latest_seq().get() as i64,
                        device_id: None,
                        reported_at: base_at,
                        private: false,
                        action: ReadAction::Read,
                    };
                    if m.own().read_up_to() < conv.latest_seq() {
                        expected.apply(&validate::read_report(r, &config.input).map_err(Error::DemoScript)?);
                    }
                }
                format!("{user} marks everything read (the badge stage sends read reports to the processor)")
            }
            Step::Read { user, seq, .. }
            | Step::ReadPrivately { user, seq, .. }
            | Step::Deliver { user, seq, .. } => {
                let private = matches!(step, Step::ReadPrivately { .. });
                let delivered = matches!(step, Step::Deliver { .. });
                let r = ReadReportRecord {
                    thread: 0,
                    muted_until: None,
                    conversation_id: cid.clone(),
                    user_id: names.id(user),
                    seq,
                    device_id: None,
                    reported_at: base_at,
                    private,
                    action: if delivered {
                        ReadAction::Delivered
                    } else {
                        ReadAction::Read
                    },
                };
                producer.report(&r).await?;
                expected.apply(&validate::read_report(r, &config.input).map_err(Error::DemoScript)?);
                if private {
                    format!("{user} reads up to #{seq} privately (a private receipt: only {user}'s own devices learn it)")
                } else if delivered {
                    format!("{user}'s phone receives up to #{seq} (a delivery report)")
                } else {
                    format!("{user} reports having seen up to #{seq}")
                }
            }
            Step::Join { user, at_seq, .. } => {
                let joined = EventRecord::MemberJoined {
                    user_id: names.id(user),
                };
                play_event(&producer, &mut expected, &config, cid, at_seq, base_at, joined).await?;
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
        print_view(view.get(&convs[conv]), conv, &texts, &names);
        if thread_step {
            watcher.print_threads(&convs[conv], &names);
        }
        let want = recount(&expected, rules, now_ms());
        let shown;
        (shown, badge_watcher) = wait_for_badges(badge_watcher.take(), want, Duration::from_secs(30)).await?;
        print_badges(&shown, view.get(&convs[conv]), &names);
    }
    badge_stop.store(true, Ordering::Release);
    badge_stage.await?.map_err(Error::Badge)?;
    println!(
        "\nEvery number above was read back from {} (cursors, read counts), {} \
         (each member's own unread, with private receipts) and {} (badges), read_committed.",
        config.topics.read_cursors, config.topics.user_read_cursors, config.badge.user_badges
    );
    if config.redis.enabled {
        print_redis(&config, &convs).await?;
    }
    if config.cql.enabled {
        print_cql(&config, &convs).await?;
    }
    if config.redis.enabled || config.cql.enabled {
        print_api(&config, &convs, &names).await?;
    }
    println!(
        "Try: readfold tail {}   and   readfold tail {}",
        config.topics.read_cursors, config.topics.dlq
    );
    if config.redis.enabled {
        serve_page(&config, &convs[1]).await?;
    }
    let _ = stop.send(true);
    handle.await??;
    Ok(())
}

/// Starts the push gateway with its demo page next to the processor and
/// prints its URL. On a terminal it stays up until Ctrl-C, so that the page
/// can be played with; otherwise the demo ends here.
async fn serve_page(config: &Config, group: &str) -> Result<()> {
    use std::io::IsTerminal;
    let mut config = config.clone();
    config.auth.mode = readfold_serve::AuthMode::None;
    config.gateway.demo = true;
    let listen = config.gateway.listen.clone();
    let (gateway, addr) = match crate::gateway::spawn(&config, &listen).await {
        Ok(started) => started,
        // Taken (a gateway already runs there): any free port will do.
        Err(_) => crate::gateway::spawn(&config, "127.0.0.1:0").await?,
    };
    println!(
        "\nThe push gateway's demo page: http://{addr}/demo/?conversation={group}-live&members=alice,bob,carol\n  \
         (a group chat whose members each hold a WebSocket: send, read, read privately, and watch \"N read\" and the \
         unread badges move)\n\
         Threads, with alice on two devices (reply in a thread, read it on one device, watch the other's \
         threads badge clear): http://{addr}/demo/?conversation={group}-threads&members=alice,bob&as=alice,alice,bob\n\
         A big group of 302 whose \"N read\" the gateway pushes as read counts: \
         http://{addr}/demo/?conversation={group}-big&members=alice,bob&crowd=300"
    );
    if std::io::stdin().is_terminal() && std::io::stdout().is_terminal() {
        println!("The processor and the gateway keep running; press Ctrl-C to stop.");
        crate::run::wait_for_signal().await;
    }
    gateway.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// A conversation as the demo shows it: the public view (what other members
/// see) and each member's own view (what their own devices see).
struct Shown {
    view: ConversationView,
    own: BTreeMap<UserId, OwnCursor>,
}

/// Prints a conversation's cursors, each member's own unread count and the
/// read counts, all answered by the read model.
fn print_view(
    shown: Option<&Shown>,
    conv: usize,
    texts: &BTreeMap<(usize, i64), (&str, &str)>,
    names: &Names,
) {
    let Some(Shown { view: c, own }) = shown else {
        println!("    (no cursors yet)");
        return;
    };
    let cursors: Vec<String> = c
        .members
        .iter()
        .map(|(u, m)| format!("{}={}", names.short(u.as_str()), m.cursor))
        .collect();
    let unread: Vec<String> = c
        .members
        .keys()
        .map(|u| {
            let n = own.get(u).map_or_else(|| c.unread(u), |o| o.unread(c.latest_seq));
            format!("{}={n}", names.short(u.as_str()))
        })
        .collect();
    // Members whose `ahead` cursor passed their public one, as "   label: U=N ...".
    let ahead = |label: &str, cursors: Vec<(&UserId, Seq, Seq)>| {
        let listed: Vec<String> = cursors
            .into_iter()
            .filter(|(_, cursor, ahead)| ahead > cursor)
            .map(|(u, _, ahead)| format!("{}={ahead}", names.short(u.as_str())))
            .collect();
        if listed.is_empty() {
            String::new()
        } else {
            format!("   {label}: {}", listed.join(" "))
        }
    };
    let private = ahead(
        "private (own devices only)",
        own.iter().map(|(u, o)| (u, o.cursor, o.private_cursor)).collect(),
    );
    let delivered = ahead(
        "delivered ahead",
        c.members
            .iter()
            .map(|(u, m)| (u, m.cursor, m.delivered))
            .collect(),
    );
    println!(
        "    cursors: {}   unread: {}{delivered}{private}",
        cursors.join(" "),
        unread.join(" ")
    );
    for (&(_, seq), (sender, _)) in texts.range((conv, 1)..=(conv, i64::MAX)) {
        let Ok(sender_id) = names.id(sender).parse::<UserId>() else {
            continue;
        };
        let readers: Vec<String> = c
            .readers(Seq(seq as u64), &sender_id)
            .map(|u| names.short(u.as_str()).to_owned())
            .collect();
        let ticks = c.ticks(Seq(seq as u64), &sender_id);
        // One grey tick: sent; two grey: delivered to all; two blue: read by all.
        let mark = if ticks.read_by_all() {
            "✓✓ blue"
        } else if ticks.delivered_to_all() {
            "✓✓ grey"
        } else {
            "✓ grey"
        };
        let shown = if c.members.len() <= 2 {
            let state = if ticks.read_count == 1 {
                "read"
            } else if ticks.delivered_count == 1 {
                "delivered"
            } else {
                "sent"
            };
            format!("{state} {mark}")
        } else {
            format!(
                "{} read {readers:?}, {} of {} delivered {mark}",
                ticks.read_count, ticks.delivered_count, ticks.possible_readers
            )
        };
        println!("    #{seq} from {sender}: {shown}");
    }
}

/// Follows both changelogs for the demo conversations.
struct ChangelogWatcher {
    public: ChangelogReader,
    own: ChangelogReader,
    convs: Vec<String>,
    /// What the by-conversation changelog said so far, folded as a restore
    /// would.
    seen: PartitionState,
    /// What the by-user changelog said so far: each member's own view.
    seen_own: BTreeMap<(String, UserId), OwnCursor>,
    /// The by-user thread changelog: each follower's own view of a thread.
    threads: ChangelogReader,
    /// (conversation, thread, follower) -> their own view of the thread.
    seen_threads: BTreeMap<(String, u64, UserId), SeenThread>,
}

/// (latest reply, cursor, private cursor) as a follower's devices see them.
type SeenThread = (u64, u64, u64);

impl ChangelogWatcher {
    fn new(config: &Config, convs: &[String], partitions: i32) -> Result<Self> {
        let reader = |topic: &str, kind| {
            ChangelogReader::new(
                &config.kafka,
                &format!("{}-demo-watch", config.kafka.group_id),
                topic,
                kind,
                config.input.max_id_bytes,
            )
        };
        let public = reader(&config.topics.read_cursors, ChangelogKind::ByConversation)?;
        let own = reader(&config.topics.user_read_cursors, ChangelogKind::ByUser)?;
        let threads = reader(&config.topics.user_thread_cursors, ChangelogKind::ThreadByUser)?;
        threads.follow(None)?;
        let mut watched: Vec<i32> = convs
            .iter()
            .map(|c| partition_for_key(c.as_bytes(), partitions))
            .collect();
        watched.dedup();
        public.follow(Some(&watched))?;
        own.follow(None)?;
        Ok(ChangelogWatcher {
            public,
            own,
            convs: convs.to_vec(),
            seen: PartitionState::new(),
            seen_own: BTreeMap::new(),
            threads,
            seen_threads: BTreeMap::new(),
        })
    }

    /// Waits, on a blocking thread, until both changelogs show what the
    /// script expects; returns the watcher and the demo conversations.
    async fn wait_for(
        self,
        expected: PartitionState,
        timeout: Duration,
    ) -> Result<(Self, BTreeMap<String, Shown>)> {
        tokio::task::spawn_blocking(move || self.wait_blocking(&expected, timeout)).await?
    }

    fn wait_blocking(
        mut self,
        expected: &PartitionState,
        timeout: Duration,
    ) -> Result<(Self, BTreeMap<String, Shown>)> {
        let started = Instant::now();
        loop {
            for entry in self.public.poll_entries(Duration::from_millis(50))? {
                if self.watches(&entry) {
                    entry.restore_into(&mut self.seen);
                }
            }
            for entry in self.own.poll_entries(Duration::from_millis(50))? {
                if let (true, ChangelogEntry::Own(own)) = (self.watches(&entry), &entry) {
                    let u = &own.update;
                    let read_up_to = u.cursor.max(own.private_cursor);
                    self.seen_own.insert(
                        (u.conversation_id.to_string(), u.user_id.clone()),
                        OwnCursor {
                            mute: own.muted_until.map(|until| Mute { at: 0, until }),
                            unread_mentions: own.unread_mentions,
                            cursor: u.cursor,
                            private_cursor: own.private_cursor,
                            mark_seq: own.unread_mark.then_some(read_up_to),
                        },
                    );
                }
            }
            for entry in self.threads.poll_entries(Duration::from_millis(50))? {
                if !self.watches(&entry) {
                    continue;
                }
                match entry {
                    ChangelogEntry::Thread(ThreadEntry::Cursor(c)) => {
                        let key = (
                            c.key.conversation_id.to_string(),
                            c.key.thread.get(),
                            c.key.user_id,
                        );
                        let private = c.private_cursor.unwrap_or_default().get();
                        self.seen_threads
                            .insert(key, (c.latest_seq.get(), c.cursor.get(), private));
                    }
                    ChangelogEntry::Thread(ThreadEntry::Left(key)) => {
                        self.seen_threads.remove(&(
                            key.conversation_id.to_string(),
                            key.thread.get(),
                            key.user_id,
                        ));
                    }
                    _ => {}
                }
            }
            let shown = self.shown(&self.seen, |c| {
                self.seen_own
                    .iter()
                    .filter(|((cc, _), _)| cc == c)
                    .map(|((_, u), o)| (u.clone(), *o))
                    .collect()
            });
            let want = self.shown(expected, |c| {
                let id = ConversationId::parse(c, usize::MAX).ok();
                id.and_then(|id| expected.conversation(&id))
                    .map(|conv| {
                        conv.members()
                            .filter(|(_, m)| !m.left)
                            .map(|(u, m)| (u.clone(), m.own()))
                            .collect()
                    })
                    .unwrap_or_default()
            });
            let done = want.iter().all(|(c, w)| {
                shown.get(c).is_some_and(|s| {
                    s.view.members == w.view.members
                        && w.own
                            .iter()
                            .all(|(u, o)| s.own.get(u).map(|x| x.read_up_to()) == Some(o.read_up_to()))
                })
            });
            if done && self.threads_as(expected) {
                return Ok((self, shown));
            }
            if started.elapsed() > timeout {
                return Err(Error::DemoTimeout(timeout));
            }
        }
    }

    /// Whether every present follower's own view of each thread of the
    /// demo conversations is as the script expects (how far they read).
    fn threads_as(&self, expected: &PartitionState) -> bool {
        self.convs.iter().all(|c| {
            let Some(conv) = ConversationId::parse(c, usize::MAX)
                .ok()
                .and_then(|id| expected.conversation(&id))
            else {
                return true;
            };
            let threads = conv.threads();
            threads.roots().into_iter().all(|root| {
                let view = threads.thread(root).expect("a root's thread");
                view.followers.iter().filter(|(_, f)| f.present).all(|(user, f)| {
                    let key = (c.clone(), root.get(), user.clone());
                    self.seen_threads.get(&key).is_some_and(|&(_, cursor, private)| {
                        cursor.max(private) == f.cursor.max(f.private_cursor).get()
                    })
                })
            })
        })
    }

    /// Prints the threads of `conversation` as each follower's devices see
    /// them: their unread replies, from the by-user thread changelog.
    fn print_threads(&self, conversation: &str, names: &Names) {
        let mut by_thread: BTreeMap<u64, Vec<(&UserId, SeenThread)>> = BTreeMap::new();
        for ((c, thread, user), seen) in &self.seen_threads {
            if c == conversation {
                by_thread.entry(*thread).or_default().push((user, *seen));
            }
        }
        for (thread, followers) in by_thread {
            // A reply's record carries the thread's latest; the other
            // followers' records may predate it.
            let latest = followers.iter().map(|(_, (l, _, _))| *l).max().unwrap_or(0);
            let unread: Vec<String> = followers
                .iter()
                .map(|(u, (_, cursor, private))| {
                    format!(
                        "{} {}",
                        names.short(u.as_str()),
                        latest.saturating_sub(*cursor.max(private))
                    )
                })
                .collect();
            println!(
                "  thread of #{thread}: {latest} {}; unread replies per follower, on all their devices: {}",
                if latest == 1 { "reply" } else { "replies" },
                unread.join(", ")
            );
        }
    }

    fn watches(&self, entry: &ChangelogEntry) -> bool {
        let conversation = entry.conversation_id();
        self.convs.iter().any(|c| c == conversation.as_str())
    }

    /// The demo conversations of `state`, with the own views `own` gives.
    fn shown(
        &self,
        state: &PartitionState,
        own: impl Fn(&str) -> BTreeMap<UserId, OwnCursor>,
    ) -> BTreeMap<String, Shown> {
        self.convs
            .iter()
            .filter_map(|c| {
                let id = ConversationId::parse(c, usize::MAX).ok()?;
                let conv = state.conversation(&id)?;
                Some((
                    c.clone(),
                    Shown {
                        view: conv.view(),
                        own: own(c),
                    },
                ))
            })
            .collect()
    }
}

/// Asks the query API (`readfold serve`, started in-process on a free port)
/// what a chat screen would: "N read" under the group's messages, who read
/// the first one, and B's unread badges.
async fn print_api(config: &Config, convs: &[String], names: &Names) -> Result<()> {
    let mut config = config.clone();
    // In-process and on loopback: the demo is the trusted backend.
    config.auth.mode = readfold_serve::AuthMode::None;
    let addr = crate::serve::spawn(&config, "127.0.0.1:0").await?;
    let mut client = HttpClient::new(addr.to_string());
    let group = &convs[1];
    println!("\nThe query API (readfold serve) on http://{addr}:");
    let (a, b) = (names.id("A"), names.id("B"));
    let calls: [(&str, String, Option<serde_json::Value>); 4] = [
        (
            "POST",
            format!("/v1/conversations/{group}/read-counts"),
            Some(serde_json::json!({ "messages": [
                { "seq": 1, "sender": a }, { "seq": 2, "sender": a }, { "seq": 3, "sender": a }
            ] })),
        ),
        (
            "GET",
            format!("/v1/conversations/{group}/messages/1/readers?sender={a}"),
            None,
        ),
        (
            "POST",
            format!("/v1/users/{b}/unread"),
            Some(serde_json::json!({ "conversations": [group] })),
        ),
        ("GET", format!("/v1/users/{}/badge", names.id("D")), None),
    ];
    for (method, path, body) in calls {
        let response = match &body {
            Some(b) => client.post_json(&path, b).await,
            None => client.get(&path).await,
        }
        .map_err(Error::QueryApi)?;
        let data = body
            .map(|b| format!(" -H 'Content-Type: application/json' -d '{b}'"))
            .unwrap_or_default();
        println!("  curl -X {method} 'http://{addr}{path}'{data}");
        println!(
            "    -> {} {}",
            response.status,
            String::from_utf8_lossy(&response.body)
        );
    }
    Ok(())
}

/// Shows the hot cursors the processor max-merged into Redis, read back
/// through the store's read half.
async fn print_redis(config: &Config, convs: &[String]) -> Result<()> {
    let redis = RedisStore::connect(&config.redis).await?;
    for conv in convs {
        let [cursors, ..] = keys(redis.prefix(), conv);
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

/// Sets its flag when dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// The badge stage on a blocking thread of its own, until `stop`.
async fn start_badge_stage(
    config: &Config,
    stop: Arc<AtomicBool>,
) -> Result<tokio::task::JoinHandle<std::result::Result<(), readfold_badge::Error>>> {
    let redis = if config.redis.enabled {
        Some(RedisStore::connect(&config.redis).await?)
    } else {
        None
    };
    let settings = crate::badges::settings(config, redis);
    Ok(tokio::task::spawn_blocking(move || {
        BadgeStage::new(settings)?.run(stop)
    }))
}

/// Follows the badges topic from its end: what the badge stage publishes.
struct BadgeWatcher {
    reader: TopicReader,
    badges: BTreeMap<String, Badge>,
}

impl BadgeWatcher {
    /// Creates the stage's topics first if missing (as the stage would), so
    /// that the reader starts at their end.
    async fn new(config: &Config, partitions: i32) -> Result<Self> {
        for (topic, compacted) in [
            (&config.badge.user_badges, true),
            (&config.badge.user_actions, false),
        ] {
            create_topic(
                &config.kafka,
                topic,
                partitions,
                config.topics.replication_factor,
                compacted,
            )
            .await?;
        }
        let reader = TopicReader::new(
            &config.kafka,
            &format!("{}-demo-badges", config.kafka.group_id),
            false,
        )?;
        reader.assign_from_end(&config.badge.user_badges, None)?;
        Ok(BadgeWatcher {
            reader,
            badges: BTreeMap::new(),
        })
    }

    fn poll(&mut self) -> Result<()> {
        let badges = &mut self.badges;
        self.reader.poll_available(Duration::from_millis(50), |m| {
            use rdkafka::Message;
            if let Some(record) = m.payload().and_then(|v| decode_user_badge(v).ok()) {
                badges.insert(record.user_id, record.badge);
            }
        })?;
        Ok(())
    }
}

/// Waits until the badge stage published `want` for every user in it
/// (a user it never published for has an empty badge).
async fn wait_for_badges(
    watcher: Option<BadgeWatcher>,
    want: BTreeMap<UserId, Badge>,
    timeout: Duration,
) -> Result<(BTreeMap<String, Badge>, Option<BadgeWatcher>)> {
    let Some(mut watcher) = watcher else {
        return Ok((BTreeMap::new(), None));
    };
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        loop {
            watcher.poll()?;
            let done = want
                .iter()
                .all(|(u, b)| watcher.badges.get(u.as_str()).copied().unwrap_or_default() == *b);
            if done {
                return Ok((watcher.badges.clone(), Some(watcher)));
            }
            if started.elapsed() > timeout {
                return Err(Error::DemoTimeout(timeout));
            }
        }
    })
    .await?
}

/// The badges of a conversation's members, as the badge stage published
/// them.
fn print_badges(badges: &BTreeMap<String, Badge>, shown: Option<&Shown>, names: &Names) {
    let Some(shown) = shown else {
        return;
    };
    let line: Vec<String> = shown
        .view
        .members
        .keys()
        .map(|u| {
            let b = badges.get(u.as_str()).copied().unwrap_or_default();
            let muted = shown.own.get(u).is_some_and(|o| o.muted(now_ms()));
            let mut text = format!("{}={}", names.short(u.as_str()), b.badge);
            if b.totals.mentions > 0 {
                text.push_str(&format!(" (@{})", b.totals.mentions));
            }
            if muted {
                text.push_str(" (muted here)");
            }
            text
        })
        .collect();
    println!("    app badges (readfold badges): {}", line.join(" "));
}
