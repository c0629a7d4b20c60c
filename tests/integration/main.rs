//! Integration tests against a real Kafka broker (127.0.0.1:9092, or
//! READFOLD_TEST_KAFKA). `scripts/dev test` starts one.

mod harness;

mod dead_letters;
mod pipeline;
mod restart;
mod scale;
