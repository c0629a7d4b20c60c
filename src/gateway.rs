//! `readfold gateway`: the push gateway over the configured Kafka, Redis
//! and CQL.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use readfold_gateway::{follow, Badges, Gateway};
use readfold_kafka::admin::ensure_topics;
use readfold_kafka::producer::InputProducer;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::ops::StoreProbes;

/// Connects everything and starts the changelog followers.
pub async fn build(config: &Config) -> Result<(Arc<Gateway>, StoreProbes)> {
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    let (api, probes) = crate::serve::state(config).await?;
    let producer = InputProducer::new(&config.kafka, &config.topics, layout.partitions)?;
    let resource = readfold_trace::Resource {
        service: "readfold-gateway".into(),
        instance: config.kafka.instance_id(),
    };
    let tracer = readfold_trace::Tracer::start(&config.tracing, resource).map_err(Error::Tracing)?;
    let gateway = Arc::new(Gateway::new(
        config.gateway.clone(),
        api,
        producer,
        config.input.max_seq,
        Badges::new(&config.badge.user_badges, &config.badge.user_actions),
        tracer,
    ));
    follow::start(&config.kafka, &config.topics, config.input.format, &gateway)?;
    follow::start_badges(
        &config.kafka,
        gateway.badges.clone(),
        gateway.hub.clone(),
        gateway.stop.clone(),
    )?;
    Ok((gateway, probes))
}

/// Serves until SIGTERM or SIGINT.
pub async fn gateway(config: Config) -> Result<()> {
    // A connection is a file: take all the hard limit allows.
    let files = raise_fd_limit(u64::MAX, false);
    tracing::debug!(files, "open-file limit");
    let ops = crate::ops::start(&config).await?;
    let (gateway, probes) = build(&config).await?;
    ops.set_readiness(probes);
    if config.gateway.demo {
        tracing::info!(url = %format!("http://{}/demo/", config.gateway.listen), "demo page on");
    }
    let result = readfold_gateway::serve(
        gateway.clone(),
        &config.gateway.listen,
        |_| {},
        crate::run::wait_for_signal(),
    )
    .await;
    gateway.stop.store(true, Ordering::Relaxed);
    gateway.tracer.flush(crate::run::TRACE_FLUSH_TIMEOUT).await;
    result.map_err(|source| Error::Listen {
        setting: "gateway.listen",
        addr: config.gateway.listen.clone(),
        source,
    })
}

/// Serves in the background on `listen` (port 0: any free port), for the
/// demo. Returns the bound address.
pub async fn spawn(config: &Config, listen: &str) -> Result<(Arc<Gateway>, SocketAddr)> {
    let (gateway, _) = build(config).await?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let (g, listen) = (gateway.clone(), listen.to_owned());
    tokio::spawn(async move {
        let bound = |addr| {
            let _ = tx.send(addr);
        };
        if let Err(e) = readfold_gateway::serve(g, &listen, bound, std::future::pending()).await {
            tracing::error!(error = %e, "the gateway stopped");
        }
    });
    let addr = rx.await.map_err(|_| Error::NotBound { server: "gateway" })?;
    Ok((gateway, addr))
}

/// Raises this process's open-file limit towards `want` (children inherit
/// it): past the hard limit only when `beyond_hard` and allowed (root).
/// Returns the soft limit in force.
pub fn raise_fd_limit(want: u64, beyond_hard: bool) -> u64 {
    // SAFETY: getrlimit and setrlimit only read and write the struct given.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return 0;
        }
        if limit.rlim_cur >= want {
            return limit.rlim_cur;
        }
        if beyond_hard && want > limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: want,
                rlim_max: want,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return want;
            }
        }
        let soft = libc::rlimit {
            rlim_cur: want.min(limit.rlim_max),
            rlim_max: limit.rlim_max,
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &soft) == 0 {
            soft.rlim_cur
        } else {
            limit.rlim_cur
        }
    }
}
