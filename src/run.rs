//! `readfold run`: the processor until SIGTERM or SIGINT, with its ops
//! endpoints (metrics, health, readiness).

use std::time::Duration;

use readfold_processor::Processor;
use tokio::sync::watch;

use crate::config::Config;
use crate::error::Result;
use crate::ops::{ProcessorReadiness, StoreProbes};

/// How long a stopping process waits for its last spans to be sent.
pub const TRACE_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

pub async fn run(config: Config) -> Result<()> {
    let ops = crate::ops::start(&config).await?;
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
    let processor = Processor::start(config.processor_settings()).await?;
    let (redis, cql) = processor.stores();
    ops.set_readiness(ProcessorReadiness {
        health: processor.health(),
        stores: StoreProbes { redis, cql },
    });
    let tracer = processor.tracer();
    let ran = processor.run(stopped).await;
    tracer.flush(TRACE_FLUSH_TIMEOUT).await;
    ran?;
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
