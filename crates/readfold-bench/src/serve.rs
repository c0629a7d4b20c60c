//! `readfold-bench serve --seconds N`: the query API's throughput and
//! latency on this machine, `readfold serve` as a child process against the
//! configured Redis (seeded directly through the store's write half, under a
//! key prefix of its own), with the client load generated in this process.

use std::time::{Duration, Instant};

use readfold::config::Config;
use readfold_core::flush::{ConversationBatch, MemberWrite, PrivateWrite, UserBatch};
use readfold_core::Seq;
use readfold_kafka::now_ms;
use readfold_serve::client::HttpClient;
use readfold_store::redis::RedisStore;
use readfold_store::CursorStore;
use serde_json::{json, Value};

use crate::child::{free_addr, readfold_exe, ChildGuard};
use crate::error::{Error, Result};
use crate::fresh::delete_bench_keys;
use crate::stats::percentile;

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Seconds per scenario, at the maximum and again paced at half of it.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub seconds: u64,
    /// Keep-alive connections the client sends on.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
}

/// One scenario's figures.
#[derive(Clone, Debug)]
pub struct ServeRow {
    pub name: &'static str,
    /// Requests per second with every connection sending back to back.
    pub max_qps: f64,
    /// Latency percentiles at that maximum (closed loop: a request is sent
    /// when the previous answer arrived).
    pub max_p50_ms: f64,
    pub max_p99_ms: f64,
    /// The paced rate (half the maximum) the latencies were measured at.
    pub paced_qps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
}

/// A request a scenario sends again and again.
#[derive(Clone)]
struct Request {
    method: &'static str,
    path: String,
    body: Option<Value>,
}

/// Member `i` at `cursor`; three in four also have a few messages past it
/// delivered (within the groups' 1,000), as members mostly do.
fn member(i: u64, cursor: u64) -> MemberWrite {
    MemberWrite {
        user_id: format!("m{i}").parse().expect("id"),
        cursor: Seq(cursor),
        delivered: Seq(if i % 4 == 3 {
            cursor
        } else {
            (cursor + 1 + i % 5).min(1000)
        }),
        join_seq: Seq(1),
        left: false,
        epoch: 1,
    }
}

/// Writes the scenarios' data: a 500-member and a 5,000-member group with
/// cursors spread over their last 1,000 messages, and 100 small
/// conversations of one user, some with private cursors and marks.
async fn seed(redis: &RedisStore, run: &str) -> Result<()> {
    let group = |id: &str, size: u64| ConversationBatch {
        conversation_id: id.parse().expect("id"),
        latest_seq: Seq(1000),
        members: (0..size).map(|i| member(i, (i * 7919) % 1000 + 1)).collect(),
    };
    redis.write(&[group(&format!("{run}-g500"), 500)]).await?;
    redis.write(&[group(&format!("{run}-g5000"), 5000)]).await?;
    let mut small = Vec::new();
    let mut private = Vec::new();
    for c in 0..100u64 {
        let id = format!("{run}-c{c}");
        let mut members: Vec<MemberWrite> = (1..(c % 8 + 2)).map(|i| member(i, 30 + i)).collect();
        members.push(MemberWrite {
            user_id: "reader".parse().expect("id"),
            ..member(0, 20 + c % 20)
        });
        small.push(ConversationBatch {
            conversation_id: id.parse().expect("id"),
            latest_seq: Seq(50),
            members,
        });
        if c % 5 == 0 {
            private.push(PrivateWrite {
                conversation_id: id.parse().expect("id"),
                private_cursor: Seq(45),
                mark: (c % 10 == 0).then_some(readfold_core::fold::UnreadMark {
                    at: 1,
                    seq: Some(Seq(45)),
                }),
                read_up_to: Seq(45),
                mentions: Vec::new(),
                mute: None,
            });
        }
    }
    redis.write(&small).await?;
    redis
        .write_private(&[UserBatch {
            user_id: "reader".parse().expect("id"),
            conversations: private,
        }])
        .await?;
    Ok(())
}

fn scenarios(run: &str) -> [(&'static str, Request); 4] {
    let messages: Vec<Value> = (951..=1000)
        .map(|s| json!({ "seq": s, "sender": "m0" }))
        .collect();
    let conversations: Vec<String> = (0..100).map(|c| format!("{run}-c{c}")).collect();
    [
        (
            "baseline: GET /healthz (nothing to compute)",
            Request {
                method: "GET",
                path: "/healthz".into(),
                body: None,
            },
        ),
        (
            "read counts of 50 messages, 500-member group",
            Request {
                method: "POST",
                path: format!("/v1/conversations/{run}-g500/read-counts"),
                body: Some(json!({ "messages": messages })),
            },
        ),
        (
            "who-read, 5,000-member group (page of 100)",
            Request {
                method: "GET",
                path: format!("/v1/conversations/{run}-g5000/messages/500/readers?sender=m0"),
                body: None,
            },
        ),
        (
            "unread across 100 conversations",
            Request {
                method: "POST",
                path: "/v1/users/reader/unread".into(),
                body: Some(json!({ "conversations": conversations })),
            },
        ),
    ]
}

/// Sends `request` on `connections` connections until `duration` passes;
/// with `interval`, each connection sends one request per interval (paced,
/// latency measured from when the request was due, so a slow answer is not
/// hidden), otherwise back to back. Returns (requests, latencies in ms).
/// [`drive`] on one thread: a client that leaves the other core to the
/// server.
async fn drive_apart(
    addr: &str,
    request: &Request,
    connections: usize,
    duration: Duration,
    interval: Option<Duration>,
) -> Result<(u64, Vec<f64>)> {
    let (addr, request) = (addr.to_owned(), request.clone());
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)?
            .block_on(drive(&addr, &request, connections, duration, interval))
    })
    .await
    .map_err(Error::task("query API client"))?
}

async fn drive(
    addr: &str,
    request: &Request,
    connections: usize,
    duration: Duration,
    interval: Option<Duration>,
) -> Result<(u64, Vec<f64>)> {
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..connections {
        let (addr, request) = (addr.to_owned(), request.clone());
        tasks.spawn(async move {
            let mut client = HttpClient::new(addr);
            let body = request.body.as_ref().map(|b| b.to_string().into_bytes());
            // Connected and warm before the clock starts.
            client
                .request(request.method, &request.path, body.clone())
                .await?;
            let started = Instant::now();
            // Spread the connections' first requests over one interval.
            let mut due = started + interval.map_or(Duration::ZERO, |iv| iv * i as u32 / connections as u32);
            let mut latencies = Vec::new();
            while started.elapsed() < duration {
                if interval.is_some() {
                    tokio::time::sleep_until(due.into()).await;
                } else {
                    due = Instant::now();
                }
                let response = client
                    .request(request.method, &request.path, body.clone())
                    .await?;
                if response.status != 200 {
                    return Err(std::io::Error::other(format!(
                        "{} {} answered {}: {}",
                        request.method,
                        request.path,
                        response.status,
                        String::from_utf8_lossy(&response.body)
                    )));
                }
                latencies.push(due.elapsed().as_secs_f64() * 1000.0);
                if let Some(iv) = interval {
                    due += iv;
                }
            }
            Ok(latencies)
        });
    }
    let mut all = Vec::new();
    while let Some(done) = tasks.join_next().await {
        all.extend(
            done.map_err(Error::task("query API client"))?
                .map_err(Error::io("query API bench"))?,
        );
    }
    Ok((all.len() as u64, all))
}

pub async fn serve(config: &Config, args: &Args) -> Result<Vec<ServeRow>> {
    let (seconds, connections) = (args.seconds, args.connections.max(1));
    let run = format!("bench-serve-{}", now_ms());
    let mut config = config.clone();
    config.redis.key_prefix = run.clone();
    config.cql.enabled = false;
    config.auth.mode = readfold_serve::AuthMode::None;
    let redis = RedisStore::connect_writer(&config.redis).await?;
    seed(&redis, &run).await?;
    let (_serve, addr) = serve_apart(&config).await?;
    let duration = Duration::from_secs(seconds.max(1));
    let mut rows = Vec::new();
    for (name, request) in scenarios(&run) {
        // Warm up, then the maximum with back-to-back requests.
        drive_apart(&addr, &request, connections, Duration::from_millis(500), None).await?;
        let (count, mut closed) = drive_apart(&addr, &request, connections, duration, None).await?;
        closed.sort_by(f64::total_cmp);
        let max_qps = count as f64 / duration.as_secs_f64();
        // Latency at half that rate, paced.
        let paced_qps = max_qps / 2.0;
        let interval = Duration::from_secs_f64(connections as f64 / paced_qps.max(1.0));
        let (count, mut latencies) =
            drive_apart(&addr, &request, connections, duration, Some(interval)).await?;
        latencies.sort_by(f64::total_cmp);
        rows.push(ServeRow {
            name,
            max_qps,
            max_p50_ms: percentile(&closed, 0.50),
            max_p99_ms: percentile(&closed, 0.99),
            paced_qps: count as f64 / duration.as_secs_f64(),
            p50_ms: percentile(&latencies, 0.50),
            p99_ms: percentile(&latencies, 0.99),
            p999_ms: percentile(&latencies, 0.999),
        });
    }
    delete_bench_keys(&config.redis).await;
    Ok(rows)
}

/// Runs `readfold serve` as a child process, as it runs in production, on
/// this run's key prefix; returns it (killed when dropped) and its address.
async fn serve_apart(config: &Config) -> Result<(ChildGuard, String)> {
    let addr = free_addr()?.to_string();
    let child = std::process::Command::new(readfold_exe()?)
        .arg("serve")
        .env("READFOLD__REDIS__URL", &config.redis.url)
        .env("READFOLD__REDIS__KEY_PREFIX", &config.redis.key_prefix)
        .env("READFOLD__CQL__ENABLED", "false")
        .env("READFOLD__AUTH__MODE", "none")
        .env("READFOLD__METRICS__LISTEN", "")
        .env("READFOLD__SERVE__LISTEN", &addr)
        .env("READFOLD__SERVE__CACHE_MS", config.serve.cache_ms.to_string())
        .env("READFOLD_LOG", "error")
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|source| Error::Spawn {
            command: "readfold serve".into(),
            source,
        })?;
    let guard = ChildGuard(child);
    let started = Instant::now();
    while HttpClient::new(addr.clone()).get("/healthz").await.is_err() {
        if started.elapsed() > Duration::from_secs(30) {
            return Err(Error::timeout("readfold serve did not answer /healthz", 30));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((guard, addr))
}

pub fn print_serve(rows: &[ServeRow], args: &Args) {
    let connections = args.connections.max(1);
    println!(
        "query API (readfold serve as a process of its own, Redis on the configured host, {connections} keep-alive connections from a one-thread client):"
    );
    println!(
        "  {:<46} {:>9} {:>8} {:>8} | {:>9} {:>8} {:>8} {:>9}",
        "scenario", "max q/s", "p50 ms", "p99 ms", "paced q/s", "p50 ms", "p99 ms", "p99.9 ms"
    );
    for r in rows {
        println!(
            "  {:<46} {:>9.0} {:>8.2} {:>8.2} | {:>9.0} {:>8.2} {:>8.2} {:>9.2}",
            r.name, r.max_qps, r.max_p50_ms, r.max_p99_ms, r.paced_qps, r.p50_ms, r.p99_ms, r.p999_ms
        );
    }
    println!(
        "  (left: back to back, latency per answer; right: paced at half the maximum, latency from when each request \
         was due, so that a stall also counts for the requests it delays)"
    );
}
