//! Why a replay stopped.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Kafka(#[from] readfold_kafka::Error),
    #[error("kafka: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    #[error("cannot write the output: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot write CSV: {0}")]
    Csv(#[from] csv::Error),
    #[error("cannot write Parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Consumer(String),
    #[error("partition {topic}/{partition} gave no record for {secs} s before its end offset {end}")]
    Stalled {
        topic: String,
        partition: i32,
        end: i64,
        secs: u64,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
