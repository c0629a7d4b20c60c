//! `readfold-bench hot-group --seconds S`: the seed's hardest case, live.
//! One big group with every member online on protocol v2, read receipts
//! offered open-loop at each rate in turn (each with a message, the receipt
//! 20 ms after it, as a client that reads what it is shown), beside
//! connections in small chats at a background rate. `readfold run` and
//! `readfold gateway` are child processes of their own; the clients and the
//! load run in this one.
//!
//! It measures receipt-to-ack, receipt-to-visible (the first `read_counts`
//! frame at an observing member whose count of the message reaches the read
//! model's count right after the receipt), receipt-to-push in the small
//! chats (the other members' `cursor` frame), the frames and bytes each
//! client receives per second, each process's CPU, and the gateway's memory
//! per connection. With `--members 0` it only holds the small chats'
//! connections: the many-connections row. `--gateways N` spreads the
//! connections over N gateway processes and `--held N` adds idle ones held
//! by child processes (`held`), for more connections than one process may
//! open. `--badge-observers N` runs the badge stage (`readfold badges`)
//! beside and measures the app badge as clients see it: message-to-badge
//! at N group members who never read (each message raises their badge),
//! and message-to-badge and receipt-to-badge at N users who muted the group
//! and read a 1:1 chat of their own.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use readfold::config::Config;
use readfold_kafka::admin::{create_topic, ensure_topics};
use readfold_kafka::now_ms;
use readfold_kafka::producer::InputProducer;
use readfold_store::redis::RedisStore;
use readfold_wire::codec::{ConversationEventRecord, EventRecord, ReadAction, ReadReportRecord};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;

use crate::child::{cpu_secs_of, free_addr, rss_of, spawn_own_piped, ChildGuard};
use crate::error::{Error, Result};
use crate::fresh::{delete_bench_keys, delete_bench_topics, on_fresh_topics};
use crate::held::{idle_chat, idle_user};
use crate::server_cpu::{ServerClocks, ServerCpu};
use crate::stats::percentile;

/// The hot group's conversation id.
const HOT: &str = "hot";
/// How long after its message a member's receipt is sent.
const READ_AFTER: Duration = Duration::from_millis(20);

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Seconds of load per rate.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub seconds: u64,
    /// Members of the hot group, every one online on a connection of its own.
    #[arg(long, default_value_t = 3000)]
    pub members: usize,
    /// Receipts per second offered to the hot group, each with a message;
    /// one step per rate, in order.
    #[arg(long, value_delimiter = ',', default_value = "300,1000")]
    pub rates: Vec<u64>,
    /// Connections in small chats next to the hot group.
    #[arg(long, default_value_t = 10_000)]
    pub background: usize,
    /// Members of each small chat.
    #[arg(long, default_value_t = 5)]
    pub background_size: usize,
    /// Receipts per second in the small chats, each with a message.
    #[arg(long, default_value_t = 100)]
    pub background_rate: u64,
    /// Hot-group members whose clients check every `read_counts` frame
    /// against the receipts sent.
    #[arg(long, default_value_t = 20)]
    pub observers: usize,
    /// Gateway processes the connections are spread over, round-robin.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub gateways: u64,
    /// Idle connections in more small chats (of --background-size), held
    /// by child processes of this bench, so that the node's connections can
    /// pass one process's open-file limit.
    #[arg(long, default_value_t = 0)]
    pub held: usize,
    /// Idle connections per holding process, at most.
    #[arg(long, default_value_t = 15_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub held_per_process: u64,
    /// Users whose app badge is checked, with `readfold badges` run beside
    /// (0: no badge stage): as many group members who never read, past
    /// --members, and as many who muted the group and read a 1:1 chat of
    /// their own once a second.
    #[arg(long, default_value_t = 0)]
    pub badge_observers: usize,
}

/// One step's figures.
#[derive(Clone, Debug, Default)]
pub struct HotGroupStep {
    pub offered: u64,
    pub seconds: f64,
    pub messages: u64,
    pub receipts: u64,
    pub background_receipts: u64,
    pub ack_ms: Vec<f64>,
    pub visible_ms: Vec<f64>,
    /// Receipts an observer never saw counted before they left the window.
    pub unseen: u64,
    pub push_ms: Vec<f64>,
    /// Per hot client: frames and bytes over the step.
    pub hot_frames: Vec<u64>,
    pub hot_bytes: Vec<u64>,
    pub background_frames: Vec<u64>,
    pub background_bytes: Vec<u64>,
    pub errors: BTreeMap<String, u64>,
    pub cores_gateway: f64,
    pub cores_processor: f64,
    pub cores_bench: f64,
    pub servers: ServerCpu,
    pub badges: BadgeSamples,
}

/// The app badge as the badge observers saw it over a step.
#[derive(Clone, Debug, Default)]
pub struct BadgeSamples {
    /// Group message to the first badge frame counting it, at members who
    /// never read.
    pub group_message_ms: Vec<f64>,
    /// A 1:1 message to the first badge frame counting it, and the
    /// receipt of it to the first badge frame clearing it, at the users who
    /// muted the group.
    pub own_message_ms: Vec<f64>,
    pub receipt_ms: Vec<f64>,
    /// Waits for a badge frame that gave up after [`BADGE_WAIT`].
    pub missed: u64,
    pub cores: f64,
}

#[derive(Clone, Debug, Default)]
pub struct HotGroupFigures {
    pub members: usize,
    pub gateways: usize,
    pub held: usize,
    pub background: usize,
    pub background_size: usize,
    pub background_rate: u64,
    pub rss_before: u64,
    pub rss_after: u64,
    pub connect_secs: f64,
    pub badge_observers: usize,
    pub steps: Vec<HotGroupStep>,
}

/// A receipt sent, as the observers check it.
#[derive(Clone, Copy, Debug)]
struct Receipt {
    /// When it was due to be sent, in microseconds since the bench started.
    due_us: u64,
    seq: u64,
    /// The read model's count of `seq` right after it.
    expect: u32,
    hot: bool,
}

/// What every client task shares.
struct Shared {
    started: Instant,
    measuring: AtomicBool,
    frames: Vec<AtomicU64>,
    bytes: Vec<AtomicU64>,
    receipts: Mutex<Vec<Receipt>>,
    acks: Mutex<Vec<(bool, f64)>>,
    visible: Mutex<Vec<f64>>,
    unseen: AtomicU64,
    /// (small chat, reader, seq) -> when the receipt was due, in µs.
    pushes: Mutex<HashMap<(u32, u32, u64), u64>>,
    push_ms: Mutex<Vec<f64>>,
    errors: Mutex<BTreeMap<String, u64>>,
    /// When each group message was due, in µs, by seq - 1.
    hot_due: Mutex<Vec<u64>>,
    group_badge_ms: Mutex<Vec<f64>>,
    /// Each badge observer's `messages`, as its badge frames arrive.
    badge_frames: Vec<mpsc::UnboundedSender<u64>>,
}

impl Shared {
    fn now_us(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    fn ms_since(&self, due_us: u64) -> f64 {
        self.now_us().saturating_sub(due_us) as f64 / 1000.0
    }
}

/// Who a client is.
#[derive(Clone, Copy)]
enum Role {
    Hot {
        observer: bool,
    },
    Small {
        chat: u32,
    },
    /// A group member who never reads: its badge counts every message.
    Unread,
    /// A user who muted the group, reading a 1:1 chat of its own.
    BadgeObserver {
        slot: usize,
    },
}

/// The read model of the hot group as the bench drives it: each member's
/// cursor, each message's sender, and the newest messages' read counts.
struct HotModel {
    cursors: Vec<u64>,
    senders: VecDeque<usize>,
    counts: VecDeque<u32>,
    /// The seq of `counts[0]`.
    first: u64,
}

const MODEL_WINDOW: usize = 4096;

impl HotModel {
    fn new(members: usize) -> Self {
        HotModel {
            cursors: vec![0; members],
            senders: VecDeque::new(),
            counts: VecDeque::new(),
            first: 1,
        }
    }

    /// Member `m` has read through `seq`: one more reader of each seq it
    /// passes that it did not send.
    fn read(&mut self, m: usize, seq: u64) {
        let from = (self.cursors[m] + 1).max(self.first);
        for s in from..=seq.min(self.first + self.counts.len() as u64 - 1) {
            let i = (s - self.first) as usize;
            if self.senders[i] != m {
                self.counts[i] += 1;
            }
        }
        self.cursors[m] = self.cursors[m].max(seq);
    }

    /// Member `m` sent `seq`; its cursor follows.
    fn sent(&mut self, m: usize, seq: u64) {
        self.senders.push_back(m);
        self.counts.push_back(0);
        if self.counts.len() > MODEL_WINDOW {
            self.senders.pop_front();
            self.counts.pop_front();
            self.first += 1;
        }
        self.read(m, seq);
    }

    fn count(&self, seq: u64) -> u32 {
        seq.checked_sub(self.first)
            .and_then(|i| self.counts.get(i as usize))
            .copied()
            .unwrap_or(0)
    }
}

type Stream = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// Opens a v2 connection from a loopback address of its own (one source
/// address has about 28,000 ports for one destination).
async fn open(addr: SocketAddr, user: &str, index: usize) -> Result<Stream> {
    let mut request = format!("ws://{addr}/ws?user={user}")
        .into_client_request()
        .map_err(Error::websocket(user))?;
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static(readfold_gateway::PROTOCOL_V2),
    );
    let socket = tokio::net::TcpSocket::new_v4().map_err(Error::io("socket"))?;
    let source = Ipv4Addr::new(127, 0, 0, 2 + (index / 20_000) as u8);
    socket
        .bind(SocketAddr::from((source, 0)))
        .map_err(Error::io(format!("bind {source}")))?;
    let tcp = socket
        .connect(addr)
        .await
        .map_err(Error::io(format!("connect {user}")))?;
    // Small buffers: tens of thousands of clients in one process.
    let config = WebSocketConfig::default()
        .read_buffer_size(4096)
        .write_buffer_size(0);
    let (stream, _) = tokio_tungstenite::client_async_with_config(request, tcp, Some(config))
        .await
        .map_err(Error::websocket(user))?;
    Ok(stream)
}

/// [`open`], then subscribes `user` to `conversation`.
pub(crate) async fn open_subscribed(
    addr: SocketAddr,
    user: &str,
    index: usize,
    conversation: &str,
) -> Result<(SplitSink<Stream, Message>, SplitStream<Stream>)> {
    let (mut sink, source) = open(addr, user, index).await?.split();
    let subscribe = serde_json::json!({ "type": "subscribe", "conversation": conversation });
    sink.send(Message::Text(subscribe.to_string().into()))
        .await
        .map_err(Error::websocket(user))?;
    Ok((sink, source))
}

/// Clients' first snapshots, awaited while more clients connect: at most
/// 256 at a time, each for up to 120 s.
#[derive(Default)]
pub(crate) struct SnapshotWaits(tokio::task::JoinSet<bool>);

impl SnapshotWaits {
    const AT_ONCE: usize = 256;
    const SECS: u64 = 120;

    /// Waits for `ready` beside the others, and first for one of those
    /// when as many as allowed are waiting.
    pub(crate) async fn add(&mut self, ready: tokio::sync::oneshot::Receiver<()>) -> Result<()> {
        self.0.spawn(async move {
            matches!(
                tokio::time::timeout(Duration::from_secs(Self::SECS), ready).await,
                Ok(Ok(()))
            )
        });
        if self.0.len() >= Self::AT_ONCE && !matches!(self.0.join_next().await, Some(Ok(true))) {
            return Err(Error::NoSnapshot { secs: Self::SECS });
        }
        Ok(())
    }

    /// Waits for every snapshot still awaited.
    pub(crate) async fn all(mut self) -> Result<()> {
        while let Some(done) = self.0.join_next().await {
            if !matches!(done, Ok(true)) {
                return Err(Error::NoSnapshot { secs: Self::SECS });
            }
        }
        Ok(())
    }
}

/// Reads one client's frames until its connection ends; sends `ready` at
/// its snapshot.
async fn read_frames(
    mut source: futures_util::stream::SplitStream<Stream>,
    index: usize,
    role: Role,
    shared: Arc<Shared>,
    ready: tokio::sync::oneshot::Sender<()>,
) {
    let mut ready = Some(ready);
    // An unread member's group messages counted by a badge frame so far.
    let mut counted = 0u64;
    // An observer's receipts: the first not yet seen, and which after it were.
    let (mut lo, mut seen) = (0usize, VecDeque::<bool>::new());
    while let Some(Ok(message)) = source.next().await {
        let Message::Text(text) = message else { continue };
        let text = text.as_str();
        // Pushed frames: not the answers to the client's own messages.
        let answer = text.starts_with(r#"{"type":"ack""#) || text.starts_with(r#"{"type":"error""#);
        if shared.measuring.load(Ordering::Relaxed) && !answer {
            shared.frames[index].fetch_add(1, Ordering::Relaxed);
            shared.bytes[index].fetch_add(text.len() as u64, Ordering::Relaxed);
        }
        if text.starts_with(r#"{"type":"ack""#) {
            let Ok(frame) = serde_json::from_str::<Value>(text) else {
                continue;
            };
            let Some(id) = frame["id"].as_str().and_then(|i| i.parse::<usize>().ok()) else {
                continue;
            };
            let receipt = shared.receipts.lock().expect("bench lock").get(id).copied();
            if let Some(r) = receipt {
                let ms = shared.ms_since(r.due_us);
                shared.acks.lock().expect("bench lock").push((r.hot, ms));
            }
        } else if text.starts_with(r#"{"type":"error""#) {
            let frame: Value = serde_json::from_str(text).unwrap_or_default();
            let code = frame["code"].as_str().unwrap_or("?").to_owned();
            *shared.errors.lock().expect("bench lock").entry(code).or_default() += 1;
        } else if text.starts_with(r#"{"type":"snapshot""#) {
            if let Some(tx) = ready.take() {
                let _ = tx.send(());
            }
        } else if text.starts_with(r#"{"type":"read_counts""#) {
            if !matches!(role, Role::Hot { observer: true }) {
                continue;
            }
            let Ok(frame) = serde_json::from_str::<Value>(text) else {
                continue;
            };
            let first = frame["first_seq"].as_u64().unwrap_or(0);
            let counts: Vec<Option<u64>> = frame["counts"]
                .as_array()
                .map(|a| a.iter().map(Value::as_u64).collect())
                .unwrap_or_default();
            let receipts = shared.receipts.lock().expect("bench lock");
            seen.resize(receipts.len().saturating_sub(lo), false);
            for (i, r) in receipts.iter().enumerate().skip(lo) {
                let done = &mut seen[i - lo];
                if *done || !r.hot {
                    *done = true;
                    continue;
                }
                if r.seq < first {
                    *done = true;
                    shared.unseen.fetch_add(1, Ordering::Relaxed);
                } else if let Some(Some(count)) = counts.get((r.seq - first) as usize) {
                    if *count >= u64::from(r.expect) {
                        *done = true;
                        let ms = shared.ms_since(r.due_us);
                        shared.visible.lock().expect("bench lock").push(ms);
                    }
                }
            }
            drop(receipts);
            while seen.front() == Some(&true) {
                seen.pop_front();
                lo += 1;
            }
        } else if text.starts_with(r#"{"type":"badge""#) {
            let Some(messages) = serde_json::from_str::<Value>(text)
                .ok()
                .and_then(|f| f["messages"].as_u64())
            else {
                continue;
            };
            match role {
                Role::Unread if messages > counted => {
                    let due = shared.hot_due.lock().expect("bench lock");
                    let upto = messages.min(due.len() as u64);
                    let ms: Vec<f64> = (counted..upto)
                        .map(|i| shared.ms_since(due[i as usize]))
                        .collect();
                    drop(due);
                    counted = counted.max(upto);
                    shared.group_badge_ms.lock().expect("bench lock").extend(ms);
                }
                Role::BadgeObserver { slot } => {
                    let _ = shared.badge_frames[slot].send(messages);
                }
                _ => {}
            }
        } else if text.starts_with(r#"{"type":"cursor""#) {
            let Role::Small { chat } = role else { continue };
            let Ok(frame) = serde_json::from_str::<Value>(text) else {
                continue;
            };
            let reader = frame["user"]
                .as_str()
                .and_then(|u| u.strip_prefix('s'))
                .and_then(|u| u.parse::<u32>().ok());
            let (Some(reader), Some(seq)) = (reader, frame["cursor"].as_u64()) else {
                continue;
            };
            let due = shared
                .pushes
                .lock()
                .expect("bench lock")
                .get(&(chat, reader, seq))
                .copied();
            if let Some(due) = due {
                let ms = shared.ms_since(due);
                shared.push_ms.lock().expect("bench lock").push(ms);
            }
        }
    }
}

/// Writes what the load sends on one client's connection.
async fn write_frames(
    mut sink: futures_util::stream::SplitSink<Stream, Message>,
    mut outgoing: mpsc::UnboundedReceiver<String>,
) {
    while let Some(text) = outgoing.recv().await {
        if sink.send(Message::Text(text.into())).await.is_err() {
            return;
        }
    }
}

/// The small chats' members: user `s{i}` is in chat `i / size`.
fn small_user(i: usize) -> String {
    format!("s{i}")
}

fn hot_user(i: usize) -> String {
    format!("h{i:05}")
}

/// The badge observers: user `b{i}` muted the group and reads its 1:1 chat
/// with `bp{i}`, who writes to it.
fn badge_user(i: usize) -> String {
    format!("b{i}")
}

fn badge_chat(i: usize) -> String {
    format!("bchat-{i}")
}

/// How long a badge observer waits for a badge frame before it counts the
/// wait as missed.
const BADGE_WAIT: Duration = Duration::from_secs(5);

/// One badge observer's cycle: a message in its chat, the badge frame that
/// counts it, the receipt, and the frame that clears it. Returns the two
/// latencies, `None` for one not seen within `wait`.
async fn badge_cycle(
    i: usize,
    seq: u64,
    producer: &InputProducer,
    writer: &mpsc::UnboundedSender<String>,
    frames: &mut mpsc::UnboundedReceiver<u64>,
    wait: Duration,
) -> Result<(Option<f64>, Option<f64>)> {
    let event = ConversationEventRecord {
        conversation_id: badge_chat(i),
        seq: seq as i64,
        at: now_ms(),
        event: EventRecord::MessageSent {
            starter_id: None,
            thread: 0,
            thread_seq: 0,
            mention_all: false,
            mentions: Default::default(),
            sender_id: format!("bp{i}"),
        },
    };
    let counted = badge_until(frames, |m| m >= 1, wait);
    let (sent, counted) = tokio::join!(producer.event(&event), counted);
    sent?;
    let Some(counted) = counted else {
        return Ok((None, None));
    };
    let read = serde_json::json!({ "type": "read", "conversation": badge_chat(i), "seq": seq });
    let cleared = badge_until(frames, |m| m == 0, wait);
    let _ = writer.send(read.to_string());
    Ok((Some(counted), cleared.await))
}

/// Milliseconds from now until a badge frame whose `messages` is `want`ed,
/// or `None` when none comes within `wait`.
async fn badge_until(
    frames: &mut mpsc::UnboundedReceiver<u64>,
    want: fn(u64) -> bool,
    wait: Duration,
) -> Option<f64> {
    let started = Instant::now();
    loop {
        match tokio::time::timeout_at((started + wait).into(), frames.recv()).await {
            Ok(Some(m)) if want(m) => return Some(started.elapsed().as_secs_f64() * 1000.0),
            Ok(Some(_)) => continue,
            _ => return None,
        }
    }
}

pub async fn hot_group(config: &Config, args: &Args) -> Result<HotGroupFigures> {
    let members = args.members;
    let background = args.background;
    let size = args.background_size.max(2);
    let chats = background.div_ceil(size);
    let observers = args.badge_observers;
    let small_end = members + chats * size;
    // The badge observers: unread members, then users who muted the group.
    let connections = small_end + 2 * observers;
    // Root may raise the hard limit too; the children inherit it.
    let limit = readfold::gateway::raise_fd_limit(2 * connections as u64 + 10_000, true);
    if limit < connections as u64 + 1_000 {
        return Err(Error::FileLimit { connections, limit });
    }
    let mut config = on_fresh_topics(config, "hot");
    config.cql.enabled = false;
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    if observers > 0 {
        for (topic, compacted) in [
            (&config.badge.user_badges, true),
            (&config.badge.user_actions, false),
        ] {
            create_topic(&config.kafka, topic, layout.partitions, 1, compacted).await?;
        }
    }
    let addr = free_addr()?;
    let (processor, gateway) = crate::gateway::spawn_pipeline(&config, &addr.to_string())?;
    let badge_stage = if observers > 0 {
        Some(crate::gateway::spawn_badge_stage(&config)?)
    } else {
        None
    };
    let mut addrs = vec![addr];
    let mut gateways = vec![gateway];
    for _ in 1..args.gateways {
        let more = free_addr()?;
        gateways.push(crate::gateway::spawn_gateway(&config, &more.to_string())?);
        addrs.push(more);
    }
    let held = args.held;

    // Everyone joins through the pipeline.
    let producer = Arc::new(InputProducer::new(
        &config.kafka,
        &config.topics,
        layout.partitions,
    )?);
    let joins: Vec<ConversationEventRecord> = (0..members + observers)
        .map(|i| (HOT.to_owned(), hot_user(i)))
        .chain((0..observers).flat_map(|i| {
            [
                (HOT.to_owned(), badge_user(i)),
                (badge_chat(i), badge_user(i)),
                (badge_chat(i), format!("bp{i}")),
            ]
        }))
        .chain((0..chats * size).map(|i| (format!("small-{}", i / size), small_user(i))))
        .chain((0..held).map(|i| (idle_chat(i, size), idle_user(i))))
        .map(|(conversation_id, user_id)| ConversationEventRecord {
            conversation_id,
            seq: 0,
            at: now_ms(),
            event: EventRecord::MemberJoined { user_id },
        })
        .collect();
    for chunk in joins.chunks(10_000) {
        producer.send_many(&[], chunk).await?;
    }
    let redis = RedisStore::connect(&config.redis).await?;
    let started = Instant::now();
    let last_idle = held.saturating_sub(1);
    let expect = [
        (HOT.to_owned(), members + 2 * observers),
        (format!("small-{}", chats.max(1) - 1), size),
        (
            idle_chat(last_idle, size),
            if held == 0 { 0 } else { last_idle % size + 1 },
        ),
    ];
    for (conversation, want) in expect.iter().filter(|(_, want)| *want > 0) {
        if chats == 0 && conversation.starts_with("small") {
            continue;
        }
        while redis
            .conversation(conversation)
            .await?
            .is_none_or(|v| v.members.len() < *want)
        {
            if started.elapsed() > Duration::from_secs(180) {
                return Err(Error::timeout(
                    format!("the members of {conversation} did not reach Redis"),
                    180,
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    for &addr in &addrs {
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            if started.elapsed() > Duration::from_secs(180) {
                return Err(Error::timeout("the gateway did not listen", 180));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // The badge observers of the second kind mute the group: their badge
    // counts their own chat only.
    let mutes: Vec<ReadReportRecord> = (0..observers)
        .map(|i| ReadReportRecord {
            thread: 0,
            conversation_id: HOT.to_owned(),
            user_id: badge_user(i),
            seq: 0,
            device_id: None,
            reported_at: now_ms(),
            private: false,
            action: ReadAction::Mute,
            muted_until: None,
        })
        .collect();
    producer.send_many(&mutes, &[]).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let gateways_rss = || gateways.iter().map(|g| rss_of(g.pid())).sum::<u64>();
    let rss_before = gateways_rss();
    let connecting = Instant::now();
    let holders = hold_idle(&addrs, held, args.held_per_process as usize, size, connections).await?;

    // Connect and subscribe everyone, a few hundred at a time.
    let (badge_frames, mut badge_rxs): (Vec<_>, Vec<_>) =
        (0..observers).map(|_| mpsc::unbounded_channel::<u64>()).unzip();
    let shared = Arc::new(Shared {
        hot_due: Mutex::default(),
        group_badge_ms: Mutex::default(),
        badge_frames,
        started: Instant::now(),
        measuring: AtomicBool::new(false),
        frames: (0..connections).map(|_| AtomicU64::new(0)).collect(),
        bytes: (0..connections).map(|_| AtomicU64::new(0)).collect(),
        receipts: Mutex::default(),
        acks: Mutex::default(),
        visible: Mutex::default(),
        unseen: AtomicU64::new(0),
        pushes: Mutex::default(),
        push_ms: Mutex::default(),
        errors: Mutex::default(),
    });
    let mut writers = Vec::with_capacity(connections);
    let mut snapshots = SnapshotWaits::default();
    for index in 0..connections {
        let (user, conversation, role) = if index < members {
            let observer = index < args.observers;
            (hot_user(index), HOT.to_owned(), Role::Hot { observer })
        } else if index >= small_end + observers {
            let slot = index - small_end - observers;
            (badge_user(slot), badge_chat(slot), Role::BadgeObserver { slot })
        } else if index >= small_end {
            (
                hot_user(members + index - small_end),
                HOT.to_owned(),
                Role::Unread,
            )
        } else {
            let i = index - members;
            let chat = (i / size) as u32;
            (small_user(i), format!("small-{chat}"), Role::Small { chat })
        };
        let (sink, source) = open_subscribed(addrs[index % addrs.len()], &user, index, &conversation).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_frames(sink, rx));
        writers.push(tx);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(read_frames(source, index, role, shared.clone(), ready_tx));
        snapshots.add(ready_rx).await?;
    }
    snapshots.all().await?;
    let connect_secs = connecting.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after = gateways_rss();
    // One cycle per badge observer: the badge stage is live before the load.
    let mut badge_seqs = vec![0u64; observers];
    for (i, frames) in badge_rxs.iter_mut().enumerate() {
        badge_seqs[i] += 1;
        let writer = &writers[small_end + observers + i];
        let wait = Duration::from_secs(120);
        if let (_, None) = badge_cycle(i, badge_seqs[i], &producer, writer, frames, wait).await? {
            return Err(Error::timeout("a badge observer's badge did not clear", 120));
        }
    }

    let clocks = ServerClocks::new(&config).await;
    let mut steps = Vec::new();
    let badge_cpu = || {
        badge_stage
            .as_ref()
            .map_or(0.0, |b| cpu_secs_of(&b.pid().to_string()))
    };
    let mut hot_seq = 0u64;
    let mut small_seqs = vec![0u64; chats];
    let model = Arc::new(Mutex::new(HotModel::new(members)));
    let rates: Vec<u64> = if members == 0 { vec![0] } else { args.rates.clone() };
    for rate in rates {
        for counter in shared.frames.iter().chain(&shared.bytes) {
            counter.store(0, Ordering::Relaxed);
        }
        shared.acks.lock().expect("bench lock").clear();
        shared.visible.lock().expect("bench lock").clear();
        shared.push_ms.lock().expect("bench lock").clear();
        shared.errors.lock().expect("bench lock").clear();
        shared.unseen.store(0, Ordering::Relaxed);
        let cpu = |pid: u32| cpu_secs_of(&pid.to_string());
        let gateways_cpu = || gateways.iter().map(|g| cpu(g.pid())).sum::<f64>();
        shared.group_badge_ms.lock().expect("bench lock").clear();
        let (g0, p0, b0, s0, c0) = (
            gateways_cpu(),
            cpu(processor.pid()),
            cpu_secs_of("self"),
            clocks.read().await,
            badge_cpu(),
        );
        shared.measuring.store(true, Ordering::Relaxed);
        let step_started = Instant::now();
        let seconds = Duration::from_secs(args.seconds);

        // Each badge observer's cycles, one a second, spread over the second.
        let observing: Vec<_> = badge_rxs
            .drain(..)
            .enumerate()
            .map(|(i, mut frames)| {
                let (producer, writer) = (producer.clone(), writers[small_end + observers + i].clone());
                let mut seq = badge_seqs[i];
                let start = step_started + Duration::from_secs(1).mul_f64(i as f64 / observers as f64);
                tokio::spawn(async move {
                    let mut samples = (Vec::new(), Vec::new(), 0u64);
                    let mut due = start;
                    // Cycles start within the step only, however long one waits.
                    while due < step_started + seconds && Instant::now() < step_started + seconds {
                        tokio::time::sleep_until(due.into()).await;
                        seq += 1;
                        let (counted, cleared) =
                            badge_cycle(i, seq, &producer, &writer, &mut frames, BADGE_WAIT).await?;
                        match counted {
                            Some(ms) => samples.0.push(ms),
                            None => samples.2 += 1,
                        }
                        match cleared {
                            Some(ms) => samples.1.push(ms),
                            None if counted.is_some() => samples.2 += 1,
                            None => {}
                        }
                        due += Duration::from_secs(1);
                    }
                    Ok::<_, Error>((frames, seq, samples))
                })
            })
            .collect();

        // The receipts go out 20 ms after their messages, from a task that
        // only waits for their time.
        let (receipt_tx, mut receipt_rx) = mpsc::unbounded_channel::<(Instant, usize, u64, bool)>();
        let receipts_task = {
            let (shared, writers, model) = (shared.clone(), writers.clone(), model.clone());
            tokio::spawn(async move {
                let mut sent = 0u64;
                while let Some((due, client, seq, hot)) = receipt_rx.recv().await {
                    tokio::time::sleep_until(due.into()).await;
                    let expect = if hot {
                        let mut model = model.lock().expect("bench lock");
                        model.read(client, seq);
                        model.count(seq)
                    } else {
                        0
                    };
                    let due_us = due.saturating_duration_since(shared.started).as_micros() as u64;
                    let id = {
                        let mut receipts = shared.receipts.lock().expect("bench lock");
                        receipts.push(Receipt {
                            due_us,
                            seq,
                            expect,
                            hot,
                        });
                        receipts.len() - 1
                    };
                    let conversation = if hot {
                        HOT.to_owned()
                    } else {
                        format!("small-{}", (client - members) / size)
                    };
                    let read = serde_json::json!({
                        "type": "read", "conversation": conversation, "seq": seq, "id": id.to_string()
                    });
                    if !hot {
                        let chat = ((client - members) / size) as u32;
                        let reader = (client - members) as u32;
                        shared
                            .pushes
                            .lock()
                            .expect("bench lock")
                            .insert((chat, reader, seq), due_us);
                    }
                    let _ = writers[client].send(read.to_string());
                    sent += 1;
                }
                sent
            })
        };

        // Messages at their times, open-loop: a send never waits for the
        // one before it to be delivered.
        let produced = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let total_rate = rate + if chats > 0 { args.background_rate } else { 0 };
        let (mut messages, mut background_receipts) = (0u64, 0u64);
        let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ rate;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        if total_rate > 0 {
            let interval = Duration::from_secs_f64(1.0 / total_rate as f64);
            let mut due = Instant::now();
            while step_started.elapsed() < seconds {
                tokio::time::sleep_until(due.into()).await;
                let hot = next() % total_rate < rate;
                let (conversation, sender, reader, seq) = if hot {
                    hot_seq += 1;
                    shared
                        .hot_due
                        .lock()
                        .expect("bench lock")
                        .push(due.saturating_duration_since(shared.started).as_micros() as u64);
                    let sender = (next() % members as u64) as usize;
                    let reader = (sender + 1 + (next() % (members as u64 - 1).max(1)) as usize) % members;
                    model.lock().expect("bench lock").sent(sender, hot_seq);
                    (HOT.to_owned(), hot_user(sender), reader, hot_seq)
                } else {
                    let chat = (next() % chats as u64) as usize;
                    small_seqs[chat] += 1;
                    let sender = (next() % size as u64) as usize;
                    let reader = (sender + 1 + (next() % (size as u64 - 1)) as usize) % size;
                    background_receipts += 1;
                    (
                        format!("small-{chat}"),
                        small_user(chat * size + sender),
                        members + chat * size + reader,
                        small_seqs[chat],
                    )
                };
                let event = ConversationEventRecord {
                    conversation_id: conversation,
                    seq: seq as i64,
                    at: now_ms(),
                    event: EventRecord::MessageSent {
                        starter_id: None,
                        thread: 0,
                        thread_seq: 0,
                        mention_all: false,
                        mentions: Default::default(),
                        sender_id: sender,
                    },
                };
                let (producer, produced, failed) = (producer.clone(), produced.clone(), failed.clone());
                tokio::spawn(async move {
                    match producer.event(&event).await {
                        Ok(()) => produced.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                });
                let _ = receipt_tx.send((due + READ_AFTER, reader, seq, hot));
                messages += 1;
                due += interval;
            }
        } else {
            tokio::time::sleep(seconds).await;
        }
        drop(receipt_tx);
        let receipts = receipts_task.await.map_err(Error::task("receipts"))?;
        // Rates and cores are over the load; the observers' last cycles
        // may end after it.
        let elapsed = step_started.elapsed().as_secs_f64();
        // Frames and cores are counted over the load; the last receipts
        // still show after it.
        shared.measuring.store(false, Ordering::Relaxed);
        let s1 = clocks.read().await;
        let (g1, p1, b1, c1) = (
            gateways_cpu(),
            cpu(processor.pid()),
            cpu_secs_of("self"),
            badge_cpu(),
        );
        let mut badges = BadgeSamples::default();
        for (i, task) in observing.into_iter().enumerate() {
            let (frames, seq, (own, receipt, missed)) =
                task.await.map_err(Error::task("badge observer"))??;
            badge_rxs.push(frames);
            badge_seqs[i] = seq;
            badges.own_message_ms.extend(own);
            badges.receipt_ms.extend(receipt);
            badges.missed += missed;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let window = elapsed;
        let sorted = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v
        };
        let acks = shared.acks.lock().expect("bench lock").clone();
        let per_client = |range: std::ops::Range<usize>, counters: &[AtomicU64]| {
            counters[range]
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect::<Vec<u64>>()
        };
        if failed.load(Ordering::Relaxed) > 0 {
            tracing::warn!(
                failed = failed.load(Ordering::Relaxed),
                "some messages were not produced"
            );
        }
        steps.push(HotGroupStep {
            offered: rate,
            seconds: elapsed,
            messages: produced.load(Ordering::Relaxed).min(messages),
            receipts: receipts - background_receipts.min(receipts),
            background_receipts,
            ack_ms: sorted(acks.iter().filter(|a| a.0).map(|a| a.1).collect()),
            visible_ms: sorted(shared.visible.lock().expect("bench lock").clone()),
            unseen: shared.unseen.load(Ordering::Relaxed),
            push_ms: sorted(shared.push_ms.lock().expect("bench lock").clone()),
            hot_frames: per_client(0..members, &shared.frames),
            hot_bytes: per_client(0..members, &shared.bytes),
            background_frames: per_client(members..small_end, &shared.frames),
            background_bytes: per_client(members..small_end, &shared.bytes),
            errors: shared.errors.lock().expect("bench lock").clone(),
            cores_gateway: (g1 - g0) / window,
            cores_processor: (p1 - p0) / window,
            cores_bench: (b1 - b0) / window,
            servers: s1.since(s0).per_second(window),
            badges: BadgeSamples {
                group_message_ms: sorted(shared.group_badge_ms.lock().expect("bench lock").clone()),
                own_message_ms: sorted(badges.own_message_ms),
                receipt_ms: sorted(badges.receipt_ms),
                cores: (c1 - c0) / window,
                ..badges
            },
        });
    }
    drop(writers);
    drop(holders);
    drop(gateways);
    drop(processor);
    drop(badge_stage);
    let mut topics: Vec<&String> = config.topics.names().into_iter().collect();
    if observers > 0 {
        topics.extend([&config.badge.user_badges, &config.badge.user_actions]);
    }
    delete_bench_topics(&config.kafka, topics).await?;
    delete_bench_keys(&config.redis).await;
    Ok(HotGroupFigures {
        members,
        gateways: addrs.len(),
        held,
        background: chats * size,
        background_size: size,
        background_rate: args.background_rate,
        rss_before,
        rss_after,
        connect_secs,
        badge_observers: observers,
        steps,
    })
}

/// Starts the processes that hold `held` idle connections, up to
/// `per_process` each, spread over `addrs` as this process spreads its own;
/// returns once every one has its snapshot. `base` is the index of the
/// first, past this process's connections (it picks their source address).
async fn hold_idle(
    addrs: &[SocketAddr],
    held: usize,
    per_process: usize,
    size: usize,
    base: usize,
) -> Result<Vec<ChildGuard>> {
    let list = addrs
        .iter()
        .map(SocketAddr::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut holders = Vec::new();
    for first in (0..held).step_by(per_process.max(1)) {
        let count = per_process.min(held - first);
        let args = [
            format!("--addrs={list}"),
            format!("--first={first}"),
            format!("--count={count}"),
            format!("--size={size}"),
            format!("--index-base={}", base + first),
        ];
        holders.push(spawn_own_piped("hold-connections", &args, &[])?);
    }
    for holder in &mut holders {
        let stdout = holder.0.stdout.take().expect("piped");
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line).map(|_| line)
        });
        let line = tokio::time::timeout(Duration::from_secs(600), line)
            .await
            .map_err(|_| Error::timeout("a holding process did not hold its connections", 600))?
            .map_err(Error::task("holder"))?
            .map_err(Error::io("holder's output"))?;
        if !line.starts_with("held ") {
            return Err(Error::timeout(
                "a holding process exited before it held its connections",
                600,
            ));
        }
    }
    Ok(holders)
}

/// Mean and maximum of per-client counts, per second over `secs`.
fn mean_max(values: &[u64], secs: f64) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let sum: u64 = values.iter().sum();
    let max = values.iter().copied().max().unwrap_or(0);
    (sum as f64 / values.len() as f64 / secs, max as f64 / secs)
}

fn cores(c: Option<f64>) -> String {
    c.map_or("-".into(), |c| format!("{c:.2}"))
}

pub fn print_hot_group(f: &HotGroupFigures) {
    let connections = f.members + f.background + f.held;
    let per = f.rss_after.saturating_sub(f.rss_before) as f64 / connections.max(1) as f64;
    let group = if f.members > 0 {
        format!("{} members online in one group (readfold.v2.json) + ", f.members)
    } else {
        String::new()
    };
    let held = if f.held > 0 {
        format!(" + {} idle connections held by other processes", f.held)
    } else {
        String::new()
    };
    println!(
        "hot group: {group}{} connections in chats of {} ({} receipts/s there, each with a message){held}; {connections} in all on {} gateway process(es); connected in {:.1} s; gateway RSS {:.0} MB -> {:.0} MB = {:.1} KB per connection",
        f.background,
        f.background_size,
        f.background_rate,
        f.gateways,
        f.connect_secs,
        f.rss_before as f64 / 1e6,
        f.rss_after as f64 / 1e6,
        per / 1024.0
    );
    for s in &f.steps {
        let p = |v: &[f64], q| percentile(v, q);
        if f.members > 0 {
            println!(
                "  offered {}/s: achieved {:.0} messages/s and {:.0} receipts/s in the group over {:.1} s",
                s.offered,
                s.messages.saturating_sub(s.background_receipts) as f64 / s.seconds,
                s.receipts as f64 / s.seconds,
                s.seconds
            );
            println!(
                "    receipt-to-ack p50 {:.0} ms, p99 {:.0} ms ({} acks); receipt-to-visible (an observer's \"N read\" counts it) p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} samples, {} never seen in the window)",
                p(&s.ack_ms, 0.5),
                p(&s.ack_ms, 0.99),
                s.ack_ms.len(),
                p(&s.visible_ms, 0.5),
                p(&s.visible_ms, 0.99),
                s.visible_ms.last().copied().unwrap_or(0.0),
                s.visible_ms.len(),
                s.unseen
            );
            let (frames, frames_max) = mean_max(&s.hot_frames, s.seconds);
            let (bytes, bytes_max) = mean_max(&s.hot_bytes, s.seconds);
            println!(
                "    per group member, pushed (acks of its own receipts aside): {frames:.1} frames/s (max {frames_max:.1}), {:.1} KB/s (max {:.1})",
                bytes / 1024.0,
                bytes_max / 1024.0
            );
        } else {
            println!(
                "  {:.1} s with {} receipts/s in the small chats",
                s.seconds, f.background_rate
            );
        }
        if f.background > 0 {
            let (frames, frames_max) = mean_max(&s.background_frames, s.seconds);
            let (bytes, _) = mean_max(&s.background_bytes, s.seconds);
            println!(
                "    small chats: receipt-to-push p50 {:.0} ms, p99 {:.0} ms ({} pushes); per connection {frames:.2} pushed frames/s (max {frames_max:.1}), {:.2} KB/s",
                p(&s.push_ms, 0.5),
                p(&s.push_ms, 0.99),
                s.push_ms.len(),
                bytes / 1024.0
            );
        }
        if f.badge_observers > 0 {
            let b = &s.badges;
            println!(
                "    app badge (readfold badges beside, {:.2} cores): group message-to-badge at {} members who never read p50 {:.0} ms, p99 {:.0} ms ({} samples); at {} users who muted the group, own 1:1 message-to-badge p50 {:.0} ms, p99 {:.0} ms, receipt-to-badge p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} receipts, {} waits over {} s)",
                b.cores,
                f.badge_observers,
                p(&b.group_message_ms, 0.5),
                p(&b.group_message_ms, 0.99),
                b.group_message_ms.len(),
                f.badge_observers,
                p(&b.own_message_ms, 0.5),
                p(&b.own_message_ms, 0.99),
                p(&b.receipt_ms, 0.5),
                p(&b.receipt_ms, 0.99),
                b.receipt_ms.last().copied().unwrap_or(0.0),
                b.receipt_ms.len(),
                b.missed,
                BADGE_WAIT.as_secs()
            );
        }
        println!(
            "    cores: gateway {:.2}, processor {:.2}, bench (clients and load) {:.2}, broker {}, Redis {}{}",
            s.cores_gateway,
            s.cores_processor,
            s.cores_bench,
            cores(s.servers.broker),
            cores(s.servers.redis),
            if s.errors.is_empty() {
                String::new()
            } else {
                format!("; errors received: {:?}", s.errors)
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_counts_readers_but_not_senders() {
        let mut m = HotModel::new(3);
        m.sent(0, 1);
        m.sent(1, 2);
        // Member 1's message 2 moved its cursor past 1: one reader of 1.
        assert_eq!((m.count(1), m.count(2)), (1, 0));
        m.read(2, 2);
        assert_eq!((m.count(1), m.count(2)), (2, 1));
        m.read(2, 1);
        assert_eq!(m.count(2), 1, "a stale read changes nothing");
        m.read(0, 2);
        assert_eq!((m.count(1), m.count(2)), (2, 2));
    }
}
