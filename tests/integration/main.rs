//! Integration tests against a real Kafka broker (127.0.0.1:9092, or
//! READFOLD_TEST_KAFKA) and Redis (127.0.0.1:6379, or READFOLD_TEST_REDIS).
//! `scripts/dev test` starts both.

mod harness;

mod cli;
mod dead_letters;
mod pipeline;
mod redis_outage;
mod redis_sink;
mod restart;
mod scale;
