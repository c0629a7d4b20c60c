//! `readfold-bench gateway --connections N`: the push gateway with N
//! WebSocket clients held open, on fresh topics, with `readfold run` and
//! `readfold gateway` as child processes of their own (so that the
//! gateway's memory is its own and each process has its own file limit).
//! Measures the gateway's memory per connection, and, at a fixed rate of
//! read receipts sent on the clients' own connections, the time from a
//! receipt's send to the other members' receipt of the cursor it moves
//! (through the gateway, Kafka, the processor, the changelog and the
//! gateway again), and the frames delivered per second.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::SplitSink;
use futures_util::{SinkExt, StreamExt};
use readfold::config::Config;
use readfold_kafka::admin::ensure_topics;
use readfold_kafka::now_ms;
use readfold_kafka::producer::InputProducer;
use readfold_store::redis::RedisStore;
use readfold_wire::codec::{ConversationEventRecord, EventRecord};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::child::{config_vars, free_addr, rss_of, spawn, ChildGuard};
use crate::error::{Error, Result};
use crate::fresh::{delete_bench_keys, delete_bench_topics, on_fresh_topics};
use crate::stats::percentile;

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// WebSocket clients held open, each subscribed to its conversation.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub connections: usize,
    /// Read receipts per second during the load.
    #[arg(long, default_value_t = 200)]
    pub rate: u64,
    /// Seconds of receipts.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Members per conversation (5000: one 5,000-member group, to see what
    /// each client receives).
    #[arg(long, default_value_t = 10)]
    pub group: usize,
}

/// What a gateway run measured.
#[derive(Clone, Debug)]
pub struct GatewayFigures {
    pub connections: usize,
    pub group: usize,
    pub rss_before: u64,
    pub rss_after: u64,
    pub rate: u64,
    pub seconds: u64,
    pub receipts: u64,
    /// Messages the broker took during the load.
    pub messages: u64,
    pub load_secs: f64,
    pub latencies_ms: Vec<f64>,
    pub frames: u64,
}

type Sink = SplitSink<WebSocketStream<MaybeTlsStream<TcpStream>>, Message>;

/// (conversation, seq) -> when the receipt was sent, and by which user.
type Sent = HashMap<(usize, u64), (Instant, String)>;

async fn open(addr: &str, user: &str) -> Result<WebSocketStream<MaybeTlsStream<TcpStream>>> {
    let mut request = format!("ws://{addr}/ws?user={user}")
        .into_client_request()
        .map_err(Error::websocket(user))?;
    request.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static(readfold_gateway::PROTOCOL),
    );
    let (stream, _) = tokio_tungstenite::connect_async(request)
        .await
        .map_err(Error::websocket(user))?;
    Ok(stream)
}

/// Starts `readfold run` and `readfold gateway` (listening on `addr`) on
/// `config`'s topics, with CQL, metrics and access control off.
pub fn spawn_pipeline(config: &Config, addr: &str) -> Result<(ChildGuard, ChildGuard)> {
    let vars = pipeline_vars(config, addr);
    Ok((spawn("run", &vars)?, spawn("gateway", &vars)?))
}

/// `readfold badges` beside the pipeline.
pub fn spawn_badge_stage(config: &Config) -> Result<ChildGuard> {
    spawn("badges", &pipeline_vars(config, ""))
}

/// One more `readfold gateway` of the pipeline, listening on `addr`.
pub fn spawn_gateway(config: &Config, addr: &str) -> Result<ChildGuard> {
    spawn("gateway", &pipeline_vars(config, addr))
}

fn pipeline_vars(config: &Config, addr: &str) -> Vec<(String, String)> {
    let mut vars = config_vars(config);
    vars.extend(
        [
            ("READFOLD__CQL__ENABLED", "false".to_owned()),
            ("READFOLD__METRICS__LISTEN", String::new()),
            ("READFOLD__AUTH__MODE", "none".into()),
            ("READFOLD__GATEWAY__LISTEN", addr.to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v)),
    );
    vars
}

/// `group` members per conversation (the last one may have fewer).
pub async fn gateway(config: &Config, args: &Args) -> Result<GatewayFigures> {
    let (connections, rate, seconds) = (args.connections, args.rate, args.seconds);
    let group = args.group.max(1);
    let config = on_fresh_topics(config, "gateway");
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    let addr = free_addr()?.to_string();
    let (_processor, gateway) = spawn_pipeline(&config, &addr)?;

    // Members: `group` per conversation, joined through the pipeline.
    // With a group larger than the clients, the first `connections`
    // members are online and the others are members all the same.
    let conversations = connections.div_ceil(group);
    let members = conversations * group;
    let producer = Arc::new(InputProducer::new(
        &config.kafka,
        &config.topics,
        layout.partitions,
    )?);
    let mut events = Vec::new();
    for i in 0..members {
        events.push(ConversationEventRecord {
            conversation_id: format!("c{}", i / group),
            seq: 0,
            at: now_ms(),
            event: EventRecord::MemberJoined {
                user_id: format!("u{i}"),
            },
        });
    }
    for c in 0..conversations {
        events.push(ConversationEventRecord {
            conversation_id: format!("c{c}"),
            seq: 1,
            at: now_ms(),
            event: EventRecord::MessageSent {
                starter_id: None,
                thread: 0,
                thread_seq: 0,
                mention_all: false,
                mentions: Default::default(),
                sender_id: format!("u{}", c * group),
            },
        });
    }
    producer.send_many(&[], &events).await?;
    let redis = RedisStore::connect(&config.redis).await?;
    let last = format!("c{}", conversations - 1);
    let started = Instant::now();
    while redis
        .conversation(&last)
        .await?
        .is_none_or(|v| v.members.len() < group)
    {
        if started.elapsed() > Duration::from_secs(120) {
            return Err(Error::timeout("the members did not reach Redis", 120));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    while tokio::net::TcpStream::connect(&addr).await.is_err() {
        if started.elapsed() > Duration::from_secs(120) {
            return Err(Error::timeout("the gateway did not listen", 120));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before = rss_of(gateway.pid());

    // Connect and subscribe every client; each reader task measures.
    let sent: Arc<Mutex<Sent>> = Arc::default();
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    let frames = Arc::new(AtomicU64::new(0));
    let measuring = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut sinks: Vec<Arc<tokio::sync::Mutex<Sink>>> = Vec::with_capacity(connections);
    let mut subscribed = tokio::task::JoinSet::new();
    for i in 0..connections {
        let user = format!("u{i}");
        let stream = open(&addr, &user).await?;
        let (mut sink, mut source) = stream.split();
        let conversation = i / group;
        sink.send(Message::Text(
            json!({ "type": "subscribe", "conversation": format!("c{conversation}") })
                .to_string()
                .into(),
        ))
        .await
        .map_err(Error::websocket(&user))?;
        sinks.push(Arc::new(tokio::sync::Mutex::new(sink)));
        let (sent, latencies, frames, measuring) =
            (sent.clone(), latencies.clone(), frames.clone(), measuring.clone());
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            while let Some(Ok(Message::Text(text))) = source.next().await {
                let Ok(frame) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                if frame["type"] == "snapshot" {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                if !measuring.load(Ordering::Relaxed) {
                    continue;
                }
                frames.fetch_add(1, Ordering::Relaxed);
                // A small group's `cursor` frame, or each member in a big
                // group's `cursors` batch.
                let advances = match frame["type"].as_str() {
                    Some("cursor") => vec![&frame],
                    Some("cursors") => frame["members"]
                        .as_array()
                        .map_or(Vec::new(), |m| m.iter().collect()),
                    _ => Vec::new(),
                };
                for advance in advances {
                    let Some(seq) = advance["cursor"].as_u64() else {
                        continue;
                    };
                    if let Some((at, sender)) = sent.lock().expect("bench lock").get(&(conversation, seq)) {
                        if advance["user"].as_str() == Some(sender.as_str()) {
                            latencies
                                .lock()
                                .expect("bench lock")
                                .push(at.elapsed().as_secs_f64() * 1000.0);
                        }
                    }
                }
            }
        });
        subscribed.spawn(async move { tokio::time::timeout(Duration::from_secs(60), ready_rx).await });
    }
    while let Some(done) = subscribed.join_next().await {
        if !matches!(done, Ok(Ok(Ok(())))) {
            return Err(Error::NoSnapshot { secs: 60 });
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after = rss_of(gateway.pid());

    // Receipts at a fixed rate, each from a member on its own connection.
    measuring.store(true, Ordering::Relaxed);
    let mut next_seq = vec![1u64; conversations];
    let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
    let load_started = Instant::now();
    let mut due = load_started;
    let mut receipts = 0u64;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let produced = Arc::new(AtomicU64::new(0));
    while load_started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep_until(due.into()).await;
        due += interval;
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let client = (rng % connections as u64) as usize;
        let conversation = client / group;
        next_seq[conversation] += 1;
        let seq = next_seq[conversation];
        sent.lock()
            .expect("bench lock")
            .insert((conversation, seq), (Instant::now(), format!("u{client}")));
        let message = json!({ "type": "read", "conversation": format!("c{conversation}"), "seq": seq });
        // A message for the conversation too, so that the seq stays sane;
        // sent open-loop: the next receipt never waits for its delivery.
        let event = ConversationEventRecord {
            conversation_id: format!("c{conversation}"),
            seq: seq as i64,
            at: now_ms(),
            event: EventRecord::MessageSent {
                starter_id: None,
                thread: 0,
                thread_seq: 0,
                mention_all: false,
                mentions: Default::default(),
                sender_id: format!("u{}", conversation * group + (client + 1) % group),
            },
        };
        let (producer, produced) = (producer.clone(), produced.clone());
        tokio::spawn(async move {
            if producer.event(&event).await.is_ok() {
                produced.fetch_add(1, Ordering::Relaxed);
            }
        });
        let sink = sinks[client].clone();
        tokio::spawn(async move {
            let _ = sink
                .lock()
                .await
                .send(Message::Text(message.to_string().into()))
                .await;
        });
        receipts += 1;
    }
    let load_secs = load_started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(3)).await;
    measuring.store(false, Ordering::Relaxed);
    let mut latencies = latencies.lock().expect("bench lock").clone();
    latencies.sort_by(f64::total_cmp);
    drop(sinks);
    drop(gateway);
    delete_bench_topics(&config.kafka, config.topics.names()).await?;
    delete_bench_keys(&config.redis).await;
    Ok(GatewayFigures {
        connections,
        group,
        rss_before,
        rss_after,
        rate,
        seconds,
        receipts,
        messages: produced.load(Ordering::Relaxed),
        load_secs,
        latencies_ms: latencies,
        frames: frames.load(Ordering::Relaxed),
    })
}

pub fn print_gateway(f: &GatewayFigures) {
    let per = f.rss_after.saturating_sub(f.rss_before) as f64 / f.connections.max(1) as f64;
    println!(
        "gateway: {} WebSocket connections held ({} members per conversation, each client subscribed to its own); gateway RSS {:.0} MB -> {:.0} MB = {:.1} KB per connection",
        f.connections,
        f.group,
        f.rss_before as f64 / 1e6,
        f.rss_after as f64 / 1e6,
        per / 1024.0
    );
    let l = &f.latencies_ms;
    println!(
        "  offered {}/s for {} s: achieved {:.0} receipts/s and {:.0} messages/s on the clients' own connections; receipt-to-push latency (send -> other members' cursor or cursors frame) p50 {:.0} ms, p99 {:.0} ms, p99.9 {:.0} ms, max {:.0} ms over {} frames; {:.0} frames/s delivered, {:.1} per client per second",
        f.rate,
        f.seconds,
        f.receipts as f64 / f.load_secs.max(1e-9),
        f.messages as f64 / f.load_secs.max(1e-9),
        percentile(l, 0.50),
        percentile(l, 0.99),
        percentile(l, 0.999),
        l.last().copied().unwrap_or(0.0),
        l.len(),
        f.frames as f64 / f.seconds.max(1) as f64,
        f.frames as f64 / f.seconds.max(1) as f64 / f.connections.max(1) as f64
    );
    // Each receipt and each message moves one member's cursor, which every
    // other member of the conversation is to be told of.
    let online_others = f.group.min(f.connections).saturating_sub(1);
    let offered = 2.0 * f.rate as f64 * online_others as f64;
    println!(
        "  cursor advances to tell: {:.0}/s (2 per receipt x {} other members online); frames delivered are {:.1}% of that: the rest were coalesced into newer values, or batched (a group of gateway.batch_from_members or more gets one `cursors` frame per gateway.batch_interval_ms)",
        offered,
        online_others,
        100.0 * f.frames as f64 / f.seconds.max(1) as f64 / offered.max(1.0)
    );
}
