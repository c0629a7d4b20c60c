//! The ops listener on `metrics.listen`, next to each command's own port:
//! - `/metrics`: Prometheus text format;
//! - `/healthz`: the process is alive (liveness);
//! - `/readyz`: the command is ready for work (readiness): 200 or 503 with
//!   a JSON body naming each check and why it failed.
//!
//! Readiness is what the command plugs in once it has connected (until
//! then `/readyz` answers 503 "starting"): for `readfold run`, every
//! assigned partition restored, flushes committing, and the stores
//! answering a ping; for `serve` and `gateway`, the stores answering.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use readfold_processor::health::{Health, FAILED_FLUSHES_NOT_READY};
use readfold_store::cql::CqlStore;
use readfold_store::redis::RedisStore;
use readfold_store::CursorStore;
use serde::Serialize;

use crate::config::{Config, ConfigError};
use crate::error::{Error, Result};

/// How long one store may take to answer a readiness ping.
const PING_TIMEOUT: Duration = Duration::from_secs(1);

/// Histogram buckets (seconds) of every latency readfold records: flushes,
/// sink writes, snapshots, restores, API requests. Buckets rather than
/// summaries, so that Prometheus can add them up across instances.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// One readiness check's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

pub type Checks = Pin<Box<dyn Future<Output = Vec<Check>> + Send>>;

/// What a command reports to `/readyz`.
pub trait Readiness: Send + Sync + 'static {
    fn check(&self) -> Checks;
}

/// The ops listener's handle: plug in the readiness once connected.
#[derive(Clone, Default)]
pub struct Ops {
    readiness: Arc<OnceLock<Arc<dyn Readiness>>>,
}

impl Ops {
    /// Makes `/readyz` answer from `readiness` (the first call wins).
    pub fn set_readiness(&self, readiness: impl Readiness) {
        let _ = self.readiness.set(Arc::new(readiness));
    }
}

#[derive(Clone)]
struct OpsState {
    metrics: PrometheusHandle,
    ops: Ops,
}

/// Installs the Prometheus recorder and serves the ops endpoints on
/// `metrics.listen` (nothing when empty: metrics are then not recorded).
pub async fn start(config: &Config) -> Result<Ops> {
    let ops = Ops::default();
    let listen = &config.metrics.listen;
    if listen.is_empty() {
        return Ok(ops);
    }
    let addr: SocketAddr = listen
        .parse()
        .map_err(|e| ConfigError::Invalid(format!("metrics.listen {listen:?}: {e}")))?;
    let metrics = PrometheusBuilder::new()
        .set_buckets(LATENCY_BUCKETS)
        .expect("the buckets are not empty")
        .install_recorder()
        .map_err(|source| Error::Metrics {
            addr: addr.to_string(),
            source,
        })?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Listen {
            setting: "metrics.listen",
            addr: listen.clone(),
            source,
        })?;
    // Histograms are summarized in buckets that upkeep rotates.
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    let router = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(OpsState {
            metrics,
            ops: ops.clone(),
        });
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "the ops listener stopped");
        }
    });
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    Ok(ops)
}

async fn metrics_text(State(state): State<OpsState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

async fn healthz() -> Response {
    Json(serde_json::json!({ "status": "alive" })).into_response()
}

async fn readyz(State(state): State<OpsState>) -> Response {
    let checks = match state.ops.readiness.get() {
        Some(readiness) => readiness.check().await,
        None => vec![Check {
            name: "startup",
            ok: false,
            detail: "connecting to Kafka and the stores".into(),
        }],
    };
    let ready = checks.iter().all(|c| c.ok);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(serde_json::json!({ "ready": ready, "checks": checks })),
    )
        .into_response()
}

/// Pings the enabled stores.
#[derive(Clone, Default)]
pub struct StoreProbes {
    pub redis: Option<Arc<RedisStore>>,
    pub cql: Option<Arc<CqlStore>>,
}

impl StoreProbes {
    pub async fn check(&self) -> Vec<Check> {
        let (redis, cql) = tokio::join!(ping(self.redis.as_deref()), ping(self.cql.as_deref()));
        redis.into_iter().chain(cql).collect()
    }
}

async fn ping<S: CursorStore + Sync>(store: Option<&S>) -> Option<Check> {
    let store = store?;
    let started = Instant::now();
    let outcome = tokio::time::timeout(PING_TIMEOUT, store.ping()).await;
    let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
    let (ok, detail) = match outcome {
        Ok(Ok(())) => (true, format!("answered in {elapsed_ms:.1} ms")),
        Ok(Err(e)) => (false, e.to_string()),
        Err(_) => (false, format!("no answer within {} ms", PING_TIMEOUT.as_millis())),
    };
    Some(Check {
        name: S::NAME,
        ok,
        detail,
    })
}

impl Readiness for StoreProbes {
    fn check(&self) -> Checks {
        let probes = self.clone();
        Box::pin(async move { probes.check().await })
    }
}

/// `readfold run`'s readiness: the processor's own state, then the stores.
pub struct ProcessorReadiness {
    pub health: Arc<Health>,
    pub stores: StoreProbes,
}

impl Readiness for ProcessorReadiness {
    fn check(&self) -> Checks {
        let reading = self.health.read();
        let stores = self.stores.clone();
        Box::pin(async move {
            let detail = if !reading.running {
                "not consuming (starting or stopping)".to_owned()
            } else if !reading.joined {
                "joining the consumer group".to_owned()
            } else if reading.restoring > 0 {
                format!("restoring {} partition(s) from the changelog", reading.restoring)
            } else if reading.failed_flushes >= FAILED_FLUSHES_NOT_READY {
                format!("the last {} flushes failed", reading.failed_flushes)
            } else {
                format!("{} partition(s) restored and owned", reading.owned)
            };
            let mut checks = vec![Check {
                name: "processor",
                ok: reading.is_ready(),
                detail,
            }];
            checks.extend(stores.check().await);
            checks
        })
    }
}
