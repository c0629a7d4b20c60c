//! `readfold gateway`: the push gateway over the configured Kafka, Redis
//! and CQL.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use readfold_gateway::{follow, Gateway};
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
    let gateway = Arc::new(Gateway::new(
        config.gateway.clone(),
        api,
        producer,
        config.input.max_seq,
    ));
    follow::start(
        &config.kafka,
        &config.topics,
        config.input.max_id_bytes,
        config.input.format,
        gateway.hub.clone(),
        std::time::Duration::from_millis(config.gateway.batch_interval_ms.max(1)),
        gateway.stop.clone(),
    )?;
    Ok((gateway, probes))
}

/// Serves until SIGTERM or SIGINT.
pub async fn gateway(config: Config) -> Result<()> {
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
    result.map_err(|e| Error::Run(format!("gateway.listen {:?}: {e}", config.gateway.listen)))
}

/// Serves in the background on `listen` (port 0: any free port), for the
/// demo and the benches. Returns the bound address.
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
    let addr = rx
        .await
        .map_err(|_| Error::Run("the gateway could not bind its address".into()))?;
    Ok((gateway, addr))
}
