//! `readfold badges`: the badge stage until SIGTERM or SIGINT, with its ops
//! endpoints.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use readfold_badge::{BadgeSettings, BadgeStage};
use readfold_kafka::admin::ensure_topics;
use readfold_store::redis::RedisStore;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::ops::StoreProbes;

/// The stage's settings from `config`, writing to `redis` if given; on the
/// current runtime.
pub(crate) fn settings(config: &Config, redis: Option<RedisStore>) -> BadgeSettings {
    BadgeSettings {
        kafka: config.kafka.clone(),
        topics: config.topics.clone(),
        badge: config.badge.clone(),
        input: config.input.clone(),
        redis,
        runtime: tokio::runtime::Handle::current(),
    }
}

pub async fn badges(config: Config) -> Result<()> {
    let ops = crate::ops::start(&config).await?;
    // The first stage's topics: the input and where mark-all-read writes.
    ensure_topics(&config.kafka, &config.topics).await?;
    let redis = if config.redis.enabled {
        Some(RedisStore::connect(&config.redis).await?)
    } else {
        None
    };
    ops.set_readiness(StoreProbes {
        redis: redis.clone().map(Arc::new),
        cql: None,
    });
    let settings = settings(&config, redis);
    let stop = Arc::new(AtomicBool::new(false));
    let signalled = stop.clone();
    tokio::spawn(async move {
        crate::run::wait_for_signal().await;
        tracing::info!("signal received: finishing the current flush");
        signalled.store(true, Ordering::Release);
    });
    tokio::task::spawn_blocking(move || BadgeStage::new(settings)?.run(stop))
        .await?
        .map_err(Error::Badge)
}
