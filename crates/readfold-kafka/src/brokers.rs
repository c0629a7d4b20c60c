//! Waiting for a client's first broker connection.
//!
//! A transactional producer looks for its transaction coordinator as soon
//! as `init_transactions` starts. Right after the client was created no
//! broker connection is up yet, so librdkafka gives up on that first look
//! and tries again only on a 500 ms timer, which every start would wait
//! out. Asking for the brokers first, with a metadata request that names no
//! topic, brings a connection up in one round trip, and the coordinator is
//! then found at once.

use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::types::RDKafkaErrorCode;

/// Blocks until the client has a broker connection up (the answer to a
/// metadata request), or `timeout` passes. The request asks for the topics
/// the client already knows, which for a client just created is none: the
/// brokers only.
pub fn wait_for_broker<C: ClientContext>(client: &Client<C>, timeout: Duration) -> KafkaResult<()> {
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let mut metadata: *const rdsys::rd_kafka_metadata = std::ptr::null();
    // SAFETY: a valid client; `all_topics = 0` with no topic handle asks
    // for the topics the client knows; librdkafka sets `metadata` only on
    // success, and it is freed right below.
    let err = unsafe {
        rdsys::rd_kafka_metadata(
            client.native_ptr(),
            0,
            std::ptr::null_mut(),
            &mut metadata,
            timeout_ms,
        )
    };
    if !metadata.is_null() {
        // SAFETY: returned by rd_kafka_metadata above, freed once.
        unsafe { rdsys::rd_kafka_metadata_destroy(metadata) };
    }
    if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
        Ok(())
    } else {
        Err(KafkaError::MetadataFetch(RDKafkaErrorCode::from(err)))
    }
}
