//! `readfold run`: the processor until SIGTERM or SIGINT, with its metrics
//! endpoint.

use std::time::Duration;

use readfold_kafka::admin::ensure_topics;
use readfold_processor::Processor;
use tokio::sync::watch;

use crate::config::{Config, ConfigError};
use crate::error::{Error, Result};

/// Serves Prometheus metrics on `metrics.listen` (nothing when empty).
pub fn serve_metrics(config: &Config) -> Result<()> {
    let listen = &config.metrics.listen;
    if listen.is_empty() {
        return Ok(());
    }
    let addr: std::net::SocketAddr = listen
        .parse()
        .map_err(|e| ConfigError::Invalid(format!("metrics.listen {listen:?}: {e}")))?;
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .with_http_listener(addr)
        .install()
        .map_err(|source| Error::Metrics {
            addr: addr.to_string(),
            source,
        })?;
    tracing::info!(%addr, "serving Prometheus metrics on /metrics");
    Ok(())
}

pub async fn run(config: Config) -> Result<()> {
    serve_metrics(&config)?;
    let layout = ensure_topics(&config.kafka, &config.topics).await?;
    tracing::info!(partitions = layout.partitions, "topic layout checked");
    let (stop, stopped) = watch::channel(false);
    let timeout = Duration::from_millis(config.shutdown.timeout_ms);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!(
            ?timeout,
            "signal received: finishing the current flush (a second signal exits at once)"
        );
        let _ = stop.send(true);
        // The bound on a graceful stop, and the second signal.
        tokio::select! {
            _ = wait_for_signal() => tracing::warn!("second signal: exiting now"),
            _ = tokio::time::sleep(timeout) => tracing::error!("graceful shutdown took longer than shutdown.timeout_ms: exiting"),
        }
        std::process::exit(130);
    });
    Processor::new(config.processor_settings(), layout)
        .await?
        .run(stopped)
        .await?;
    Ok(())
}

/// Completes on the first SIGTERM or SIGINT.
pub async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
    else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
