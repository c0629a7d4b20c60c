//! Integration tests against a real Kafka broker (127.0.0.1:9092, or
//! READFOLD_TEST_KAFKA), Redis (127.0.0.1:6379, or READFOLD_TEST_REDIS) and a
//! CQL server (127.0.0.1:9042, or READFOLD_TEST_CQL). `scripts/dev test`
//! starts all three; the CQL server is Apache Cassandra 5 (ScyllaDB, the
//! production target, speaks the same protocol but cannot be installed here).

mod kit;

mod badges;
mod batch_producer;
mod checkpoint;
mod cli;
mod cql_sink;
mod dashboard;
mod dead_letters;
mod faults;
mod gateway;
mod gateway_badges;
mod gateway_threads;
mod health;
mod loadgen;
mod pipeline;
mod private_receipts;
mod redis_outage;
mod redis_sink;
mod registry;
mod replay;
mod restart;
mod scale;
mod secure;
mod serve;
mod threads;
mod three_stores;
mod tracing;
mod transactions;
