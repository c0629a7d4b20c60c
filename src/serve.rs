//! `readfold serve`: the query API over the configured Redis and CQL.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use readfold_serve::cache::ViewCache;
use readfold_serve::{ApiLimits, Authenticator, ReadSource};
use readfold_store::connect_with_retry;
use readfold_store::cql::CqlStore;
use readfold_store::redis::RedisStore;

use crate::config::{Config, ConfigError};
use crate::error::{Error, Result};
use crate::ops::StoreProbes;

/// Connects the enabled stores (waiting for unreachable ones) and builds
/// the API's state, with probes of the same stores for readiness.
pub async fn state(config: &Config) -> Result<(readfold_serve::AppState, StoreProbes)> {
    let auth = Authenticator::from_config(&config.auth)?;
    if auth.is_on() {
        tracing::info!(algorithm = %config.auth.algorithm, "access control is on: JWT bearer tokens");
    } else {
        tracing::warn!(
            "access control is off (auth.mode = \"none\"): every caller sees every conversation and private \
             cursor; run behind a backend that checks users, or set auth.mode = \"jwt\""
        );
    }
    if !config.redis.enabled && !config.cql.enabled {
        return Err(
            ConfigError::Invalid("`readfold serve` needs redis.enabled or cql.enabled".into()).into(),
        );
    }
    let redis = if config.redis.enabled {
        Some(connect_with_retry("redis", || RedisStore::connect(&config.redis)).await?)
    } else {
        None
    };
    let cql = if config.cql.enabled {
        Some(connect_with_retry("cql", || CqlStore::connect(&config.cql)).await?)
    } else {
        None
    };
    let probes = StoreProbes {
        redis: redis.clone().map(Arc::new),
        cql: cql.clone().map(Arc::new),
    };
    let state = readfold_serve::state(
        ReadSource::new(redis, cql),
        auth,
        ApiLimits {
            max_items: config.serve.max_items,
            default_page: config.serve.default_page,
            max_page: config.serve.max_page,
            max_id_bytes: config.input.max_id_bytes,
        },
        ViewCache::new(
            Duration::from_millis(config.serve.cache_ms),
            config.serve.cache_entries,
        ),
    );
    Ok((state, probes))
}

/// Serves until SIGTERM or SIGINT.
pub async fn serve(config: Config) -> Result<()> {
    let ops = crate::ops::start(&config).await?;
    let (state, probes) = state(&config).await?;
    ops.set_readiness(probes);
    readfold_serve::serve(&config.serve.listen, state, |_| {}, crate::run::wait_for_signal())
        .await
        .map_err(|source| Error::Listen {
            setting: "serve.listen",
            addr: config.serve.listen.clone(),
            source,
        })
}

/// Serves in the background on `listen` (port 0: any free port); for the
/// demo. Returns the bound address.
pub async fn spawn(config: &Config, listen: &str) -> Result<SocketAddr> {
    let (state, _) = state(config).await?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let listen = listen.to_owned();
    tokio::spawn(async move {
        let bound = |addr| {
            let _ = tx.send(addr);
        };
        if let Err(e) = readfold_serve::serve(&listen, state, bound, std::future::pending()).await {
            tracing::error!(error = %e, "the query API stopped");
        }
    });
    rx.await.map_err(|_| Error::NotBound { server: "query API" })
}
