//! Where a replay stops.
//!
//! By time: `--until T` keeps the records whose Kafka record timestamp is
//! before T (exclusive). The record timestamp is the producer's CreateTime,
//! or the broker's LogAppendTime on topics configured for it; it is the one
//! time every record has, whatever its schema, and the one Kafka indexes.
//! Event times (`reported_at`, `MessageSent.at`) are what the latency table
//! measures, not what picks the range.
//!
//! By offsets: `--until-offset topic:partition=offset` stops that partition
//! before `offset` (exclusive). Partitions not named are read to the end
//! they had when the replay started.

use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

/// Parses an RFC 3339 time (`2026-11-30T18:00:00Z`, fractions allowed) or
/// milliseconds since the Unix epoch, into epoch milliseconds.
pub fn parse_time(raw: &str) -> Result<i64, String> {
    let raw = raw.trim();
    if let Ok(ms) = raw.parse::<i64>() {
        return Ok(ms);
    }
    let at: SystemTime = humantime::parse_rfc3339(raw).map_err(|e| {
        format!(
            "{raw:?} is not a time: give RFC 3339 in UTC (2026-11-30T18:00:00Z) or epoch milliseconds ({e})"
        )
    })?;
    let ms = at
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{raw:?} is before 1970"))?
        .as_millis();
    i64::try_from(ms).map_err(|_| format!("{raw:?} is too far in the future"))
}

/// One partition's end: replay stops before `offset`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetBound {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

impl FromStr for OffsetBound {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        let usage =
            || format!("{raw:?} is not topic:partition=offset (for example chat.read-reports:0=1200)");
        let (place, offset) = raw.rsplit_once('=').ok_or_else(usage)?;
        let (topic, partition) = place.rsplit_once(':').ok_or_else(usage)?;
        if topic.is_empty() {
            return Err(usage());
        }
        let partition: i32 = partition.parse().map_err(|_| usage())?;
        let offset: i64 = offset.parse().map_err(|_| usage())?;
        if partition < 0 || offset < 0 {
            return Err(format!("{raw:?}: partition and offset must not be negative"));
        }
        Ok(OffsetBound {
            topic: topic.to_owned(),
            partition,
            offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_or_epoch_milliseconds() {
        assert_eq!(parse_time("2026-11-30T18:00:00Z"), Ok(1_796_061_600_000));
        assert_eq!(parse_time("2026-11-30T18:00:00.250Z"), Ok(1_796_061_600_250));
        assert_eq!(parse_time("1796061600000"), Ok(1_796_061_600_000));
        let err = parse_time("Friday 18:00").unwrap_err();
        assert!(err.contains("RFC 3339"), "{err}");
    }

    #[test]
    fn offset_bounds_name_topic_partition_and_offset() {
        let b: OffsetBound = "chat.read-reports:3=1200".parse().unwrap();
        assert_eq!(
            b,
            OffsetBound {
                topic: "chat.read-reports".into(),
                partition: 3,
                offset: 1200
            }
        );
        // Topic names may contain ':' only before the last one.
        let b: OffsetBound = "ns:topic:0=5".parse().unwrap();
        assert_eq!((b.topic.as_str(), b.partition, b.offset), ("ns:topic", 0, 5));
        for bad in [
            "chat.read-reports=5",
            "chat.read-reports:x=5",
            ":0=5",
            "t:0=-1",
            "t:0",
        ] {
            assert!(bad.parse::<OffsetBound>().is_err(), "{bad}");
        }
    }
}
