//! `readfold-bench hold-connections` (hidden): the hot-group bench's child
//! that holds idle connections in small chats, so that the connections of
//! one node's gateways can pass one process's open-file limit.

use std::io::Write;
use std::net::SocketAddr;

use futures_util::StreamExt;
use tokio_tungstenite::tungstenite::Message;

use crate::error::{Error, Result};
use crate::hot_group::{open_subscribed, SnapshotWaits};

#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Gateway addresses; idle member i connects to the (i mod n)th.
    #[arg(long, value_delimiter = ',', required = true)]
    pub addrs: Vec<SocketAddr>,
    /// The first idle member this process holds.
    #[arg(long)]
    pub first: usize,
    /// How many idle members it holds.
    #[arg(long)]
    pub count: usize,
    /// Members of each idle chat.
    #[arg(long)]
    pub size: usize,
    /// The bench-wide index of this process's first connection, which
    /// picks its loopback source address.
    #[arg(long)]
    pub index_base: usize,
}

/// Idle member `i`'s user id.
pub fn idle_user(i: usize) -> String {
    format!("i{i}")
}

/// The chat of idle member `i`.
pub fn idle_chat(i: usize, size: usize) -> String {
    format!("idle-{}", i / size.max(1))
}

/// Connects and subscribes every idle member, prints `held N` once each has
/// its snapshot, then holds them (draining what is pushed) until killed.
pub async fn hold(args: Args) -> Result<()> {
    let limit = readfold::gateway::raise_fd_limit(args.count as u64 + 1_000, true);
    if limit < args.count as u64 + 100 {
        return Err(Error::FileLimit {
            connections: args.count,
            limit,
        });
    }
    let mut snapshots = SnapshotWaits::default();
    for k in 0..args.count {
        let i = args.first + k;
        let addr = args.addrs[i % args.addrs.len()];
        let (sink, mut source) =
            open_subscribed(addr, &idle_user(i), args.index_base + k, &idle_chat(i, args.size)).await?;
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            // The write half stays open as long as the connection.
            let _sink = sink;
            let mut ready = Some(ready_tx);
            while let Some(Ok(message)) = source.next().await {
                if let Message::Text(text) = message {
                    if text.as_str().starts_with(r#"{"type":"snapshot""#) {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                }
            }
        });
        snapshots.add(ready_rx).await?;
    }
    snapshots.all().await?;
    let mut out = std::io::stdout();
    let _ = writeln!(out, "held {}", args.count);
    let _ = out.flush();
    std::future::pending::<()>().await;
    Ok(())
}
